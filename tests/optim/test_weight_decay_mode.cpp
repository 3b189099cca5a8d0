// Independent weight decay (WeightDecayMode::independent; Wortsman et al. 2023, §3.2.2): AdamW's
// p <- p · (1 − (lr_t / η) · λ) against a hand computation over a few steps and several lr / base
// pairs; the decay does not depend on the base lr η; decoupled (torch's) is unchanged; the device
// arena updates as the CPU does; the names and bad values.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <memory>
#include <stdexcept>
#include <vector>

#include <xtensor/xarray.hpp>

#include "attnlab/backends/emulated.hpp"
#include "attnlab/nn/transformer.hpp"
#include "attnlab/optim/adamw.hpp"
#include "attnlab/random.hpp"
#include "helpers.hpp"

using namespace attnlab;

namespace {

Parameter<double> param(const xt::xarray<double>& value, const xt::xarray<double>& grad) {
  Parameter<double> p;
  p.value = value;
  p.grad = grad;
  return p;
}

// AdamW by hand, in double, with the independent decay: per step t (1-based) at lr_t,
//   p = p (1 − (lr_t / base) wd);  m = m + (1 − β1)(g − m);  v = β2 v + (1 − β2) g²;
//   p = p − lr_t / (1 − β1^t) · m / (√v / √(1 − β2^t) + eps).
struct HandAdamW {
  double base, beta1 = 0.9, beta2 = 0.95, eps = 1e-8, wd;
  std::vector<double> p, m, v;
  void step(const std::vector<double>& g, double lr, int t) {
    for (std::size_t i = 0; i < p.size(); ++i) {
      p[i] *= 1 - (lr / base) * wd;
      m[i] += (1 - beta1) * (g[i] - m[i]);
      v[i] = beta2 * v[i] + (1 - beta2) * g[i] * g[i];
      const double denom = std::sqrt(v[i]) / std::sqrt(1 - std::pow(beta2, t)) + eps;
      p[i] -= lr / (1 - std::pow(beta1, t)) * m[i] / denom;
    }
  }
};

}  // namespace

TEST_CASE("independent decay: AdamW's update equals the hand computation for several lr / base") {
  struct Case {
    double base;
    std::vector<double> lrs;  // lr_t of steps 1, 2, 3 (a schedule's values)
  };
  const Case cases[] = {{0.1, {0.1, 0.05, 0.025}},
                        {0.02, {0.01, 0.003, 0.02}},
                        {1e-3, {1e-3, 0.0, 5e-4}},
                        {3.0, {0.3, 3.0, 1.5}}};
  const std::vector<std::vector<double>> grads = {
      {0.5, -1.25, 2.0, 1e-3}, {-0.75, 0.5, 0.125, -2.5}, {1.5, 0.0, -0.25, 0.75}};
  for (const Case& c : cases) {
    CAPTURE(c.base);
    const double wd = 0.2;
    Parameter<double> p =
        param(xt::xarray<double>{1.0, -2.0, 0.5, 3.0}, xt::zeros<double>({std::size_t{4}}));
    AdamWOptions o;
    o.lr = c.base;
    o.beta1 = 0.9;
    o.beta2 = 0.95;
    o.eps = 1e-8;
    o.weight_decay = wd;
    o.decay = WeightDecayMode::independent;
    AdamW<double> opt({{"w", &p}}, o);
    HandAdamW hand{c.base, 0.9, 0.95, 1e-8, wd, {1.0, -2.0, 0.5, 3.0}, {0, 0, 0, 0}, {0, 0, 0, 0}};
    for (int t = 1; t <= 3; ++t) {
      CAPTURE(t);
      const auto& g = grads[static_cast<std::size_t>(t - 1)];
      std::copy(g.begin(), g.end(), p.grad.begin());
      opt.set_lr(c.lrs[static_cast<std::size_t>(t - 1)]);
      opt.step();
      hand.step(g, c.lrs[static_cast<std::size_t>(t - 1)], t);
      xt::xarray<double> expected = xt::zeros<double>({std::size_t{4}});
      std::copy(hand.p.begin(), hand.p.end(), expected.begin());
      CHECK(test::rel_error(p.value, expected) < 1e-15);
    }
  }
}

TEST_CASE("independent decay: the decay does not depend on the base lr, decoupled's does") {
  // Zero grads leave m = v = 0, so only the decay moves p. Two optimizers with base lrs 0.1 and
  // 0.001 following the same schedule multipliers s_t (lr_t = s_t · base) decay identically.
  const auto decayed = [](WeightDecayMode mode, double base) {
    Parameter<double> p =
        param(xt::xarray<double>{2.0, -4.0, 0.75}, xt::zeros<double>({std::size_t{3}}));
    AdamWOptions o;
    o.lr = base;
    o.weight_decay = 0.5;
    o.decay = mode;
    AdamW<double> opt({{"w", &p}}, o);
    for (const double s : {1.0, 0.5, 0.25, 0.125}) {
      opt.set_lr(s * base);
      opt.step();
    }
    return xt::xarray<double>(p.value);
  };
  const auto a = decayed(WeightDecayMode::independent, 0.1);
  const auto b = decayed(WeightDecayMode::independent, 0.001);
  CHECK(a == b);  // bit for bit: s_t = lr_t / base is exact for these multipliers
  const double factor = (1 - 0.5) * (1 - 0.25) * (1 - 0.125) * (1 - 0.0625);
  CHECK(a(0) == doctest::Approx(2.0 * factor).epsilon(1e-15));
  CHECK(a(1) == doctest::Approx(-4.0 * factor).epsilon(1e-15));
  // Decoupled scales λ by lr_t itself: the two base lrs decay differently.
  const auto c = decayed(WeightDecayMode::decoupled, 0.1);
  const auto d = decayed(WeightDecayMode::decoupled, 0.001);
  CHECK(c(0) == doctest::Approx(2.0 * (1 - 0.05) * (1 - 0.025) * (1 - 0.0125) * (1 - 0.00625))
                    .epsilon(1e-15));
  CHECK(std::abs(c(0) - d(0)) > 0.1);
}

TEST_CASE("decay_factor: the two modes' multipliers, base_lr 0, and decoupled unchanged") {
  CHECK(decay_factor(WeightDecayMode::decoupled, 0.01, 0.1, 0.5) == 1 - 0.01 * 0.5);
  CHECK(decay_factor(WeightDecayMode::independent, 0.01, 0.1, 0.5) == 1 - (0.01 / 0.1) * 0.5);
  CHECK(decay_factor(WeightDecayMode::independent, 0.1, 0.1, 0.5) == 0.5);  // s_t = 1
  CHECK(decay_factor(WeightDecayMode::independent, 0.0, 0.1, 0.5) == 1);    // lr_t = 0
  CHECK(decay_factor(WeightDecayMode::independent, 0.3, 0.0, 0.5) == 1);    // base 0: s_t = 0
  CHECK(decay_factor(WeightDecayMode::independent, 0.01, 0.1, 0.0) == 1);
  CHECK_THROWS_WITH_AS(decay_factor(WeightDecayMode::decoupled, -1.0, 0.1, 0.5),
                       "decay_factor: lr expected a finite value >= 0, got -1",
                       std::invalid_argument);
  CHECK_THROWS_WITH_AS(
      decay_factor(WeightDecayMode::independent, 0.1, std::numeric_limits<double>::infinity(), 0.5),
      "decay_factor: base_lr expected a finite value >= 0, got inf", std::invalid_argument);
  CHECK_THROWS_AS(decay_factor(WeightDecayMode::independent, 0.1, 0.1, -0.5),
                  std::invalid_argument);

  // The default is decoupled, and naming it changes nothing, bit for bit.
  CHECK(AdamWOptions{}.decay == WeightDecayMode::decoupled);
  Rng rng(3);
  const xt::xarray<double> init = randn<double, 1>({6}, rng);
  const xt::xarray<double> grad = randn<double, 1>({6}, rng);
  Parameter<double> p = param(init, grad), q = param(init, grad);
  AdamWOptions o;
  o.lr = 0.05;
  o.weight_decay = 0.3;
  AdamW<double> plain({{"w", &p}}, o);
  o.decay = WeightDecayMode::decoupled;
  AdamW<double> named({{"w", &q}}, o);
  for (const double lr : {0.05, 0.02, 0.01}) {
    plain.set_lr(lr);
    named.set_lr(lr);
    plain.step();
    named.step();
  }
  CHECK(p.value == q.value);
}

TEST_CASE("independent decay: on the emulated device, one arena, as on the CPU") {
  const auto device = emulated::make_device_ops<double>();  // outlives the models on it
  const auto train = [&](DeviceOps<double>* ops) {
    TransformerConfig c;
    c.vocab_sizes = {5};
    c.out_vocab = 4;
    c.max_len = 4;
    c.block.attention.d_model = 8;
    c.block.attention.heads = 2;
    c.block.d_ff = 12;
    Rng rng(5);
    Transformer<double> model(c, rng);
    if (ops) model.to(*ops);
    const ParameterList<double> params = model.parameters();
    AdamW<double> opt(params, AdamWOptions{0.02, 0.9, 0.95, 1e-8, 0.5, DecayParams::matrices,
                                           WeightDecayMode::independent});
    Rng grads(6);
    for (const double s : {0.5, 1.0, 0.75, 0.1}) {
      for (const auto& p : params) {
        for (auto& g : p.param->grad) g = grads.normal();
        if (ops)
          ops->upload(p.param->device_grad.data(), p.param->grad.data(),
                      p.param->size() * sizeof(double));
      }
      opt.set_lr(0.02 * s);
      opt.step();
    }
    model.copy_to_host();
    std::vector<xt::xarray<double>> values;
    for (const auto& p : params) values.push_back(p.param->value);
    return values;
  };
  const auto cpu = train(nullptr);
  const auto dev = train(device.get());
  REQUIRE(cpu.size() == dev.size());
  for (std::size_t i = 0; i < cpu.size(); ++i) CHECK(test::rel_error(dev[i], cpu[i]) < 1e-14);
}

TEST_CASE("WeightDecayMode: names, and a bad one is refused naming the field") {
  CHECK(parse_weight_decay_mode("decoupled") == WeightDecayMode::decoupled);
  CHECK(parse_weight_decay_mode("independent") == WeightDecayMode::independent);
  CHECK(to_string(WeightDecayMode::decoupled) == "decoupled");
  CHECK(to_string(WeightDecayMode::independent) == "independent");
  CHECK_THROWS_WITH_AS(parse_weight_decay_mode("coupled"),
                       "optimizer: decay expected decoupled|independent, got coupled",
                       std::invalid_argument);
}
