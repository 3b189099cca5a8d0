// SGD, AdamW, clip_grad_norm and the lr schedules: trajectories against torch.optim goldens
// (tests/golden/make_goldens.py), properties of clipping and schedules, state save/restore, and
// bad input.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <memory>
#include <numbers>

#include <nlohmann/json.hpp>
#include <xtensor/xarray.hpp>

#include "attnlab/optim/adamw.hpp"
#include "attnlab/optim/clip.hpp"
#include "attnlab/optim/schedule.hpp"
#include "attnlab/optim/sgd.hpp"
#include "attnlab/random.hpp"
#include "helpers.hpp"

using namespace attnlab;
using attnlab::test::golden_file;
using attnlab::test::golden_tensor;
using attnlab::test::rel_error;

namespace {

// Slice `step` of a (steps, ...) golden tensor, as a tensor of the parameter's shape.
template <class T>
xt::xarray<T> step_slice(const xt::xarray<double>& stacked, std::size_t step) {
  std::vector<std::size_t> shape(stacked.shape().begin() + 1, stacked.shape().end());
  xt::xarray<T> out(shape);
  const std::size_t n = out.size();
  std::transform(stacked.data() + step * n, stacked.data() + (step + 1) * n, out.begin(),
                 [](double x) { return static_cast<T>(x); });
  return out;
}

template <class T>
Parameter<T> make_param(const xt::xarray<double>& init) {
  Parameter<T> p;
  p.value = xt::cast<T>(init);
  p.grad = xt::zeros<T>(init.shape());
  return p;
}

template <class T>
std::unique_ptr<Optimizer<T>> make_optimizer(const nlohmann::json& config,
                                             const ParameterList<T>& params) {
  if (config.at("optimizer") == "adamw") {
    AdamWOptions o;
    o.lr = config.at("lr");
    o.beta1 = config.at("beta1");
    o.beta2 = config.at("beta2");
    o.eps = config.at("eps");
    o.weight_decay = config.at("weight_decay");
    return std::make_unique<AdamW<T>>(params, o);
  }
  REQUIRE(config.at("dampening").get<double>() == 0.0);
  REQUIRE_FALSE(config.at("nesterov").get<bool>());
  SgdOptions o;
  o.lr = config.at("lr");
  o.momentum = config.at("momentum");
  o.weight_decay = config.at("weight_decay");
  return std::make_unique<SGD<T>>(params, o);
}

// Runs every case of optim.json in precision T; each step's parameters must match PyTorch's.
template <class T>
void check_optim_goldens(double tol) {
  const auto& file = golden_file("optim.json");
  REQUIRE(file.at("cases").size() == 4);
  for (const auto& c : file.at("cases")) {
    const std::string name = c.at("name");
    CAPTURE(name);
    const std::size_t steps = c.at("config").at("steps");
    Parameter<T> p0 = make_param<T>(golden_tensor(c, "p0_init"));
    Parameter<T> p1 = make_param<T>(golden_tensor(c, "p1_init"));
    const ParameterList<T> params{{"p0", &p0}, {"p1", &p1}};
    auto opt = make_optimizer<T>(c.at("config"), params);
    const auto g0 = golden_tensor(c, "p0_grads"), g1 = golden_tensor(c, "p1_grads");
    const auto traj0 = golden_tensor(c, "p0_traj"), traj1 = golden_tensor(c, "p1_traj");
    REQUIRE(g0.shape()[0] == steps);
    for (std::size_t t = 0; t < steps; ++t) {
      CAPTURE(t);
      p0.grad = step_slice<T>(g0, t);
      p1.grad = step_slice<T>(g1, t);
      opt->step();
      CHECK(opt->step_count() == t + 1);
      CHECK(rel_error(p0.value, step_slice<double>(traj0, t)) < tol);
      CHECK(rel_error(p1.value, step_slice<double>(traj1, t)) < tol);
    }
  }
}

template <class T>
std::vector<Parameter<T>> random_params(std::uint64_t seed) {
  Rng rng(seed);
  std::vector<Parameter<T>> ps(3);
  ps[0].value = randn<T, 2>({4, 3}, rng);
  ps[1].value = randn<T, 1>({5}, rng);
  ps[2].value = randn<T, 3>({2, 2, 3}, rng);
  for (auto& p : ps) p.grad = xt::zeros<T>(p.value.shape());
  return ps;
}

template <class T>
ParameterList<T> list_of(std::vector<Parameter<T>>& ps) {
  ParameterList<T> out;
  for (std::size_t i = 0; i < ps.size(); ++i)
    out.push_back({"layer" + std::to_string(i) + ".w", &ps[i]});
  return out;
}

// Fills every grad with a deterministic function of (step, parameter, entry).
template <class T>
void fill_grads(std::vector<Parameter<T>>& ps, std::size_t step) {
  Rng rng(1000 + step);
  for (auto& p : ps) {
    const xt::xarray<T> g = randn<T, 1>({p.grad.size()}, rng);
    std::copy(g.begin(), g.end(), p.grad.begin());
  }
}

bool bit_identical(const std::vector<Parameter<float>>& a, const std::vector<Parameter<float>>& b) {
  for (std::size_t i = 0; i < a.size(); ++i) {
    if (a[i].value.shape() != b[i].value.shape()) return false;
    if (!std::equal(a[i].value.begin(), a[i].value.end(), b[i].value.begin())) return false;
  }
  return true;
}

}  // namespace

TEST_CASE("golden: AdamW and SGD trajectories match torch.optim in float64") {
  check_optim_goldens<double>(1e-13);
}

TEST_CASE("golden: AdamW and SGD trajectories match torch.optim in float32") {
  check_optim_goldens<float>(2e-6);
}

TEST_CASE("optim: AdamW first step moves each entry by lr against the sign of its grad") {
  // With wd = 0 and m = v = 0, step 1 gives mhat = g and vhat = g^2: p -= lr * g / (|g| + eps).
  Parameter<double> p;
  p.value = xt::xarray<double>{1.0, -2.0, 0.5};
  p.grad = xt::xarray<double>{3.0, -0.25, 1e-3};
  AdamWOptions o;
  o.lr = 0.1;
  o.weight_decay = 0;
  AdamW<double> opt({{"w", &p}}, o);
  opt.step();
  const xt::xarray<double> expected{1.0 - 0.1 * 3.0 / (3.0 + 1e-8),
                                    -2.0 + 0.1 * 0.25 / (0.25 + 1e-8),
                                    0.5 - 0.1 * 1e-3 / (1e-3 + 1e-8)};
  CHECK(rel_error(p.value, expected) < 1e-15);
}

TEST_CASE("optim: AdamW weight decay is decoupled: zero grads only shrink the parameters") {
  Parameter<double> p;
  p.value = xt::xarray<double>{2.0, -4.0};
  p.grad = xt::zeros<double>({2});
  AdamWOptions o;
  o.lr = 0.1;
  o.weight_decay = 0.5;
  AdamW<double> opt({{"w", &p}}, o);
  opt.step();
  opt.step();
  // m = v = 0 stays, so only p *= (1 - lr * wd) applies, twice.
  CHECK(p.value(0) == doctest::Approx(2.0 * 0.95 * 0.95).epsilon(1e-15));
  CHECK(p.value(1) == doctest::Approx(-4.0 * 0.95 * 0.95).epsilon(1e-15));
}

TEST_CASE("optim: step reads grads without clearing them, zero_grad clears them, set_lr applies") {
  auto ps = random_params<double>(7);
  SgdOptions o;
  o.lr = 0.5;
  SGD<double> opt(list_of(ps), o);
  fill_grads(ps, 0);
  const xt::xarray<double> g0 = ps[0].grad, v0 = ps[0].value;
  opt.step();
  CHECK(ps[0].grad == g0);
  CHECK(rel_error(ps[0].value, xt::xarray<double>(v0 - 0.5 * g0)) < 1e-15);
  opt.set_lr(0);
  const xt::xarray<double> v1 = ps[0].value;
  opt.step();
  CHECK(ps[0].value == v1);
  CHECK(opt.lr() == 0);
  opt.zero_grad();
  for (const auto& p : ps) {
    CHECK(std::all_of(p.grad.begin(), p.grad.end(), [](double g) { return g == 0; }));
  }
}

TEST_CASE("optim: clip_grad_norm returns the global norm and rescales to max_norm") {
  Parameter<double> a, b;
  a.value = xt::zeros<double>({2});
  a.grad = xt::xarray<double>{3.0, 0.0};
  b.value = xt::zeros<double>({1, 2});
  b.grad = xt::xarray<double>{{0.0, -4.0}};
  const ParameterList<double> params{{"a", &a}, {"b", &b}};
  CHECK(grad_norm(params) == 5.0);
  const double norm = clip_grad_norm(params, 1.0);
  CHECK(norm == 5.0);  // the norm before clipping
  CHECK(grad_norm(params) == doctest::Approx(1.0).epsilon(1e-5));
  CHECK(grad_norm(params) <= 1.0);
  // Direction preserved: every entry scaled by the same factor 1 / (5 + eps).
  const double scale = 1.0 / (5.0 + kClipNormEps);
  CHECK(a.grad(0) == doctest::Approx(3.0 * scale).epsilon(1e-15));
  CHECK(b.grad(0, 1) == doctest::Approx(-4.0 * scale).epsilon(1e-15));
  CHECK(a.grad(1) == 0.0);
  CHECK(b.grad(0, 0) == 0.0);
}

TEST_CASE("optim: clip_grad_norm is a bit-exact no-op at or below max_norm") {
  auto ps = random_params<float>(11);
  fill_grads(ps, 3);
  const auto params = list_of(ps);
  const double norm = grad_norm(params);
  // The reference norm, summed independently in a different order (last parameter first).
  double sum = 0;
  for (auto it = ps.rbegin(); it != ps.rend(); ++it) {
    for (float g : it->grad) sum += static_cast<double>(g) * g;
  }
  CHECK(norm == doctest::Approx(std::sqrt(sum)).epsilon(1e-12));
  std::vector<xt::xarray<float>> before;
  for (const auto& p : ps) before.push_back(p.grad);
  CHECK(clip_grad_norm(params, norm * 2) == norm);
  CHECK(clip_grad_norm(params, norm) == norm);
  for (std::size_t i = 0; i < ps.size(); ++i) CHECK(ps[i].grad == before[i]);
  // Above: clipped to max_norm, and the same twice in a row (deterministic).
  auto copy = ps;
  const double n1 = clip_grad_norm(params, norm / 4);
  const double n2 = clip_grad_norm(list_of(copy), norm / 4);
  CHECK(n1 == n2);
  CHECK(bit_identical(ps, copy));
  for (std::size_t i = 0; i < ps.size(); ++i) CHECK(ps[i].grad == copy[i].grad);
  CHECK(grad_norm(params) == doctest::Approx(norm / 4).epsilon(1e-5));
}

TEST_CASE("optim: clip_grad_norm leaves non-finite grads alone and returns the non-finite norm") {
  Parameter<float> a;
  a.value = xt::zeros<float>({2});
  a.grad = xt::xarray<float>{std::numeric_limits<float>::infinity(), 1.0f};
  const ParameterList<float> params{{"a", &a}};
  CHECK(std::isinf(clip_grad_norm(params, 1.0)));
  CHECK(a.grad(1) == 1.0f);
  a.grad(0) = std::numeric_limits<float>::quiet_NaN();
  CHECK(std::isnan(clip_grad_norm(params, 1.0)));
  CHECK(a.grad(1) == 1.0f);
  CHECK_THROWS_WITH_AS(clip_grad_norm(params, 0.0),
                       "clip_grad_norm: max_norm expected a finite value > 0, got 0",
                       std::invalid_argument);
  CHECK_THROWS_AS(clip_grad_norm(params, std::nan("")), std::invalid_argument);
}

TEST_CASE("optim: lr schedules at warmup start and end, cosine midpoint and floor") {
  const auto constant = LrSchedule::constant(3e-4);
  CHECK(constant.lr_at(0) == 3e-4);
  CHECK(constant.lr_at(123456) == 3e-4);

  const double base = 1e-3, floor = 1e-4;
  const std::size_t warmup = 10, total = 110;
  const auto s = LrSchedule::warmup_cosine(base, floor, warmup, total);
  CHECK(s.lr_at(0) == doctest::Approx(base / 10).epsilon(1e-15));  // warmup start
  CHECK(s.lr_at(4) == doctest::Approx(base / 2).epsilon(1e-15));
  CHECK(s.lr_at(9) == doctest::Approx(base).epsilon(1e-15));                 // warmup end
  CHECK(s.lr_at(10) == doctest::Approx(base).epsilon(1e-15));                // decay start
  CHECK(s.lr_at(60) == doctest::Approx((base + floor) / 2).epsilon(1e-12));  // cosine midpoint
  const double quarter = floor + (base - floor) * 0.5 * (1 + std::cos(std::numbers::pi / 4));
  CHECK(s.lr_at(35) == doctest::Approx(quarter).epsilon(1e-12));
  CHECK(s.lr_at(110) == floor);  // floor
  CHECK(s.lr_at(1000000) == floor);
  for (std::size_t t = 0; t + 1 < warmup; ++t) CHECK(s.lr_at(t) < s.lr_at(t + 1));
  for (std::size_t t = warmup; t < total; ++t) {
    CHECK(s.lr_at(t) >= s.lr_at(t + 1));
    CHECK(s.lr_at(t + 1) >= floor);
  }
  // No warmup, and warmup reaching the end: both well defined.
  const auto no_warmup = LrSchedule::warmup_cosine(base, 0, 0, 4);
  CHECK(no_warmup.lr_at(0) == base);
  CHECK(no_warmup.lr_at(2) == doctest::Approx(base / 2).epsilon(1e-12));
  CHECK(no_warmup.lr_at(4) == 0);
  const auto all_warmup = LrSchedule::warmup_cosine(base, floor, 5, 5);
  CHECK(all_warmup.lr_at(4) == doctest::Approx(base).epsilon(1e-15));
  CHECK(all_warmup.lr_at(5) == floor);
  CHECK(parse_lr_schedule_kind("cosine") == LrScheduleKind::warmup_cosine);
  CHECK(parse_lr_schedule_kind("constant") == LrScheduleKind::constant);
}

TEST_CASE("optim: bad schedules name the field") {
  CHECK_THROWS_WITH_AS(LrSchedule::constant(-1.0),
                       "LrSchedule: base_lr expected a finite value >= 0, got -1",
                       std::invalid_argument);
  CHECK_THROWS_WITH_AS(
      LrSchedule::warmup_cosine(1e-3, 1e-2, 0, 10),
      "LrSchedule: min_lr expected a finite value in [0, base_lr = 0.001], got 0.01",
      std::invalid_argument);
  CHECK_THROWS_WITH_AS(LrSchedule::warmup_cosine(1e-3, 0, 20, 10),
                       "LrSchedule: total_steps expected >= warmup_steps = 20, got 10",
                       std::invalid_argument);
  CHECK_THROWS_WITH_AS(parse_lr_schedule_kind("linear"),
                       "LrSchedule: kind expected 'constant', 'cosine' or 'wsd', got 'linear'",
                       std::invalid_argument);
  LrSchedule s;
  s.base_lr = std::numeric_limits<double>::infinity();
  CHECK_THROWS_AS(s.lr_at(0), std::invalid_argument);
}

TEST_CASE("optim: state is named by parameter and shaped like it") {
  auto ps = random_params<float>(3);
  AdamWOptions ao;
  AdamW<float> adamw(list_of(ps), ao);
  const auto state = adamw.state_tensors();
  REQUIRE(state.size() == 6);
  CHECK(state[0].first == "optim.layer0.w.exp_avg");
  CHECK(state[1].first == "optim.layer0.w.exp_avg_sq");
  CHECK(state[5].first == "optim.layer2.w.exp_avg_sq");
  CHECK(state[4].second.shape() == ps[2].value.shape());
  CHECK(adamw.step_count() == 0);

  SgdOptions so;
  so.momentum = 0.9;
  SGD<float> sgd(list_of(ps), so);
  const auto sgd_state = sgd.state_tensors();
  REQUIRE(sgd_state.size() == 3);
  CHECK(sgd_state[1].first == "optim.layer1.w.momentum_buffer");
  so.momentum = 0;
  CHECK(SGD<float>(list_of(ps), so).state_tensors().empty());
}

TEST_CASE("optim: saved and restored state continues bit-identically") {
  for (const bool use_adamw : {true, false}) {
    CAPTURE(use_adamw);
    auto make = [&](std::vector<Parameter<float>>& ps) -> std::unique_ptr<Optimizer<float>> {
      if (use_adamw) {
        AdamWOptions o;
        o.lr = 1e-2;
        o.weight_decay = 0.1;
        return std::make_unique<AdamW<float>>(list_of(ps), o);
      }
      SgdOptions o;
      o.lr = 1e-2;
      o.momentum = 0.9;
      o.weight_decay = 0.01;
      return std::make_unique<SGD<float>>(list_of(ps), o);
    };
    auto ps = random_params<float>(5);
    auto opt = make(ps);
    for (std::size_t t = 0; t < 3; ++t) {
      fill_grads(ps, t);
      opt->step();
    }
    // "Checkpoint": parameter values, state tensors and the step count.
    auto restored = ps;
    auto fresh = ps;
    const auto state = opt->state_tensors();
    auto opt_restored = make(restored);
    opt_restored->load_state(state, opt->step_count());
    CHECK(opt_restored->step_count() == 3);
    auto opt_fresh = make(fresh);  // same values, no state: must diverge
    for (std::size_t t = 3; t < 6; ++t) {
      fill_grads(ps, t);
      fill_grads(restored, t);
      fill_grads(fresh, t);
      opt->step();
      opt_restored->step();
      opt_fresh->step();
    }
    CHECK(bit_identical(ps, restored));
    CHECK_FALSE(bit_identical(ps, fresh));
    const auto s1 = opt->state_tensors(), s2 = opt_restored->state_tensors();
    REQUIRE(s1.size() == s2.size());
    for (std::size_t i = 0; i < s1.size(); ++i) CHECK(s1[i].second == s2[i].second);
  }
}

TEST_CASE("optim: load_state rejects state for other parameters, naming the tensor") {
  auto ps = random_params<double>(9);
  AdamWOptions o;
  AdamW<double> opt(list_of(ps), o);
  const auto good = opt.state_tensors();
  const xt::xarray<double> m_before = good[0].second;

  auto missing = good;
  missing.pop_back();
  CHECK_THROWS_WITH_AS(opt.load_state(missing, 1),
                       "AdamW.load_state: state tensor 'optim.layer2.w.exp_avg_sq' expected "
                       "present, got missing",
                       std::invalid_argument);
  auto unknown = good;
  unknown[2].first = "optim.other.w.exp_avg";
  CHECK_THROWS_WITH_AS(
      opt.load_state(unknown, 1),
      "AdamW.load_state: state tensor 'optim.other.w.exp_avg' expected the name "
      "of a state tensor of this AdamW (optim.<param>.<slot>), got an unknown name",
      std::invalid_argument);
  auto duplicate = good;
  duplicate.push_back(good[0]);
  CHECK_THROWS_WITH_AS(opt.load_state(duplicate, 1),
                       "AdamW.load_state: state tensor 'optim.layer0.w.exp_avg' expected once, got "
                       "twice",
                       std::invalid_argument);
  auto wrong_shape = good;
  wrong_shape[3].second = xt::zeros<double>({4});
  CHECK_THROWS_WITH_AS(opt.load_state(wrong_shape, 1),
                       "AdamW.load_state: state tensor 'optim.layer1.w.exp_avg_sq' expected (5,), "
                       "got (4,)",
                       ShapeError);
  // An SGD's state does not load into an AdamW.
  SgdOptions so;
  so.momentum = 0.5;
  SGD<double> sgd(list_of(ps), so);
  CHECK_THROWS_AS(opt.load_state(sgd.state_tensors(), 1), std::invalid_argument);
  // Nothing was assigned by the failed loads.
  CHECK(opt.step_count() == 0);
  CHECK(opt.state_tensors()[0].second == m_before);
}

TEST_CASE("optim: mismatched parameter lists throw naming the parameter") {
  auto ps = random_params<double>(2);
  AdamWOptions o;
  CHECK_THROWS_WITH_AS(AdamW<double>(ParameterList<double>{}, o),
                       "AdamW: parameters expected a non-empty list, got an empty list",
                       std::invalid_argument);
  CHECK_THROWS_WITH_AS(AdamW<double>(ParameterList<double>{{"a", &ps[0]}, {"a", &ps[1]}}, o),
                       "AdamW: parameter names expected unique names, got 'a' twice",
                       std::invalid_argument);
  CHECK_THROWS_WITH_AS(AdamW<double>(ParameterList<double>{{"a", &ps[0]}, {"b", &ps[0]}}, o),
                       "AdamW: parameter 'b' expected a distinct Parameter, got one listed under "
                       "another name already",
                       std::invalid_argument);
  CHECK_THROWS_WITH_AS(AdamW<double>(ParameterList<double>{{"a", nullptr}}, o),
                       "AdamW: parameter 'a' expected a Parameter, got a null pointer",
                       std::invalid_argument);
  CHECK_THROWS_AS(AdamW<double>(ParameterList<double>{{"", &ps[0]}}, o), std::invalid_argument);
  ps[1].grad = xt::zeros<double>({4});
  CHECK_THROWS_WITH_AS(AdamW<double>(ParameterList<double>{{"a", &ps[0]}, {"b", &ps[1]}}, o),
                       "AdamW: grad of parameter 'b' expected (5,), got (4,)", ShapeError);
  ps[1].grad = xt::zeros<double>({5});

  // A grad reshaped after construction: step throws before updating anything.
  SgdOptions so;
  SGD<double> sgd(list_of(ps), so);
  fill_grads(ps, 0);
  const xt::xarray<double> before = ps[0].value;
  ps[2].grad = xt::zeros<double>({2, 6});
  CHECK_THROWS_WITH_AS(sgd.step(),
                       "SGD.step: grad of parameter 'layer2.w' expected (2, 2, 3), got (2, 6) "
                       "(wrong rank)",
                       ShapeError);
  CHECK(ps[0].value == before);
  CHECK(sgd.step_count() == 0);
}

TEST_CASE("optim: bad hyperparameters name the field") {
  auto ps = random_params<double>(4);
  const auto params = list_of(ps);
  const double nan = std::numeric_limits<double>::quiet_NaN();
  auto adamw_with = [&](auto edit) {
    AdamWOptions o;
    edit(o);
    return AdamW<double>(params, o);
  };
  CHECK_THROWS_WITH_AS(adamw_with([](AdamWOptions& o) { o.lr = -1e-3; }),
                       "AdamW: lr expected a finite value >= 0, got -0.001", std::invalid_argument);
  CHECK_THROWS_WITH_AS(adamw_with([&](AdamWOptions& o) { o.lr = nan; }),
                       "AdamW: lr expected a finite value >= 0, got nan", std::invalid_argument);
  CHECK_THROWS_WITH_AS(adamw_with([](AdamWOptions& o) { o.beta1 = 1.0; }),
                       "AdamW: beta1 expected a value in [0, 1), got 1", std::invalid_argument);
  CHECK_THROWS_WITH_AS(adamw_with([](AdamWOptions& o) { o.beta2 = -0.1; }),
                       "AdamW: beta2 expected a value in [0, 1), got -0.1", std::invalid_argument);
  CHECK_THROWS_WITH_AS(adamw_with([](AdamWOptions& o) { o.eps = 0; }),
                       "AdamW: eps expected a finite value > 0, got 0", std::invalid_argument);
  CHECK_THROWS_WITH_AS(adamw_with([](AdamWOptions& o) { o.weight_decay = -1; }),
                       "AdamW: weight_decay expected a finite value >= 0, got -1",
                       std::invalid_argument);
  auto sgd_with = [&](auto edit) {
    SgdOptions o;
    edit(o);
    return SGD<double>(params, o);
  };
  CHECK_THROWS_WITH_AS(sgd_with([](SgdOptions& o) { o.momentum = 1.5; }),
                       "SGD: momentum expected a value in [0, 1), got 1.5", std::invalid_argument);
  CHECK_THROWS_WITH_AS(sgd_with([&](SgdOptions& o) { o.weight_decay = nan; }),
                       "SGD: weight_decay expected a finite value >= 0, got nan",
                       std::invalid_argument);
  CHECK_THROWS_WITH_AS(sgd_with([](SgdOptions& o) { o.lr = -1; }),
                       "SGD: lr expected a finite value >= 0, got -1", std::invalid_argument);
  SgdOptions so;
  SGD<double> sgd(params, so);
  CHECK_THROWS_WITH_AS(sgd.set_lr(std::numeric_limits<double>::infinity()),
                       "SGD: lr expected a finite value >= 0, got inf", std::invalid_argument);
  CHECK(sgd.lr() == so.lr);
}
