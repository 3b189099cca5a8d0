// Modules: Linear, Embedding, MultiFieldEmbedding, PositionalEncoding, LayerNorm, RMSNorm, Gelu,
// Relu, FeedForward. Each is checked with the library's module gradient checker, for its
// parameter names, and for the Module contract (add-into grads, backward before forward).
#include <doctest/doctest.h>

#include <cmath>
#include <limits>
#include <memory>

#include <xtensor/xarray.hpp>
#include <xtensor/xbuilder.hpp>
#include <xtensor/xmath.hpp>
#include <xtensor/xview.hpp>

#include "attnlab/nn/activation.hpp"
#include "attnlab/nn/embedding.hpp"
#include "attnlab/nn/feed_forward.hpp"
#include "attnlab/nn/gradcheck_module.hpp"
#include "attnlab/nn/linear.hpp"
#include "attnlab/nn/norm.hpp"
#include "attnlab/nn/positional.hpp"
#include "helpers.hpp"

using namespace attnlab;

namespace {

constexpr double kGradTol = 1e-6;

void expect_passed(const GradcheckReport& report, std::size_t expected_rows) {
  INFO(report.table());
  CHECK(report.results.size() == expected_rows);
  CHECK(report.max_rel_error() <= kGradTol);
  for (const auto& r : report.results) CHECK(r.analytic_norm > 1e-6);
}

std::vector<std::string> names_of(Module<double>& m) {
  std::vector<std::string> out;
  for (const auto& p : m.parameters()) out.push_back(p.name);
  return out;
}

// Gives a module's parameters non-trivial values (norm gains/shifts start at 1/0).
void jitter(Module<double>& m, Rng& rng) {
  for (auto& p : m.parameters()) {
    for (auto& v : p.param->value) v += 0.3 * rng.normal();
  }
}

}  // namespace

TEST_CASE("module gradcheck: Linear with and without bias, fan-in init") {
  Rng rng(21);
  Linear<double> with_bias(5, 4, rng), no_bias(5, 4, rng, false);
  CHECK(names_of(with_bias) == std::vector<std::string>{"w", "b"});
  CHECK(names_of(no_bias) == std::vector<std::string>{"w"});
  jitter(with_bias, rng);
  const auto x = randn<double, 3>({2, 3, 5}, rng);
  expect_passed(check_module_gradients(with_bias, x), 3);
  expect_passed(check_module_gradients(no_bias, x), 2);

  Rng big(22);
  Linear<double> wide(256, 512, big);
  const auto& w = wide.w.value;
  double var = 0;
  for (double v : w) var += v * v / double(w.size());
  CHECK(var == doctest::Approx(1.0 / 256).epsilon(0.02));  // N(0, 1/fan_in)
  CHECK_THROWS_AS(Linear<double>(0, 4, rng), std::invalid_argument);
}

TEST_CASE("module gradcheck: LayerNorm, RMSNorm, Gelu, Relu, FeedForward, PositionalEncoding") {
  Rng rng(23);
  const auto x = randn<double, 3>({2, 3, 6}, rng, 1.5);
  SUBCASE("LayerNorm") {
    LayerNorm<double> m(6);
    jitter(m, rng);
    CHECK(names_of(m) == std::vector<std::string>{"gamma", "beta"});
    expect_passed(check_module_gradients(m, x), 3);
  }
  SUBCASE("LayerNorm without bias: gamma alone, the shift stays 0 through training") {
    LayerNorm<double> m(6, kLayerNormEps, false);
    jitter(m, rng);
    CHECK(names_of(m) == std::vector<std::string>{"gamma"});
    CHECK_FALSE(m.has_bias());
    expect_passed(check_module_gradients(m, x), 2);
    m.zero_grad();
    const auto y = m.forward(x);
    m.backward(xt::eval(xt::ones_like(y)));
    CHECK(xt::all(xt::equal(m.beta.value, 0.0)));
    // Without β, a row of the output has mean 0 when γ is 1 (with β, mean = mean(β)).
    LayerNorm<double> plain(6, kLayerNormEps, false);
    const auto z = plain.forward(x);
    CHECK(std::abs(xt::mean(xt::view(z, 0, 0, xt::all()))()) < 1e-12);
  }
  SUBCASE("FeedForward without biases") {
    FeedForward<double> m(6, 10, rng, MlpActivation::gelu, GeluApproximation::tanh, false);
    jitter(m, rng);
    CHECK(names_of(m) == std::vector<std::string>{"fc1.w", "fc2.w"});
    expect_passed(check_module_gradients(m, x), 3);
  }
  SUBCASE("RMSNorm") {
    RMSNorm<double> m(6);
    jitter(m, rng);
    CHECK(names_of(m) == std::vector<std::string>{"gamma"});
    expect_passed(check_module_gradients(m, x), 2);
  }
  SUBCASE("Gelu exact and Relu") {
    Gelu<double> g(6, GeluApproximation::exact);
    Relu<double> r(6);
    expect_passed(check_module_gradients(g, x), 1);
    expect_passed(check_module_gradients(r, x), 1);
  }
  SUBCASE("FeedForward") {
    FeedForward<double> m(6, 10, rng);
    jitter(m, rng);
    CHECK(names_of(m) == std::vector<std::string>{"fc1.w", "fc1.b", "fc2.w", "fc2.b"});
    CHECK(m.act->type_name() == "Gelu");
    expect_passed(check_module_gradients(m, x), 5);
  }
  SUBCASE("FeedForward with ReLU², and ReluSquared alone") {
    FeedForward<double> m(6, 10, rng, MlpActivation::relu2);
    jitter(m, rng);
    CHECK(m.activation() == MlpActivation::relu2);
    CHECK(m.act->type_name() == "ReluSquared");
    CHECK(names_of(m) == std::vector<std::string>{"fc1.w", "fc1.b", "fc2.w", "fc2.b"});
    expect_passed(check_module_gradients(m, x), 5);
    ReluSquared<double> r(6);
    expect_passed(check_module_gradients(r, x), 1);
    CHECK(parse_mlp_activation("relu2") == MlpActivation::relu2);
    CHECK(to_string(MlpActivation::gelu) == "gelu");
    CHECK_THROWS_WITH_AS(parse_mlp_activation("geglu"),
                         "parse_mlp_activation: mlp expected gelu|relu2|swiglu, got 'geglu'",
                         std::invalid_argument);
  }
  SUBCASE("FeedForward with SwiGLU, with and without biases, and Swiglu alone") {
    for (bool bias : {true, false}) {
      CAPTURE(bias);
      FeedForward<double> m(6, 10, rng, MlpActivation::swiglu, GeluApproximation::tanh, bias);
      jitter(m, rng);
      CHECK(m.activation() == MlpActivation::swiglu);
      CHECK(m.act->type_name() == "Swiglu");
      CHECK(m.fc1.out_features() == 20);  // [gate | up]
      CHECK(m.act->in_features() == 20);
      CHECK(m.act->out_features() == 10);
      CHECK(names_of(m) == (bias ? std::vector<std::string>{"fc1.w", "fc1.b", "fc2.w", "fc2.b"}
                                 : std::vector<std::string>{"fc1.w", "fc2.w"}));
      expect_passed(check_module_gradients(m, x), bias ? 5 : 3);
    }
    Swiglu<double> s(3);
    expect_passed(check_module_gradients(s, x), 1);
    CHECK(parse_mlp_activation("swiglu") == MlpActivation::swiglu);
    CHECK(to_string(MlpActivation::swiglu) == "swiglu");
    // LLaMA's width rule: int(2 · 4C / 3), rounded up to a multiple of 16; 4C for the others.
    CHECK(default_mlp_width(384, MlpActivation::swiglu) == 1024);
    CHECK(default_mlp_width(64, MlpActivation::swiglu) == 176);
    CHECK(default_mlp_width(8, MlpActivation::swiglu) == 32);
    CHECK(default_mlp_width(4096, MlpActivation::swiglu) == 10928);
    CHECK(default_mlp_width(64, MlpActivation::relu2) == 256);
    CHECK(default_mlp_width(64, MlpActivation::gelu) == 256);
  }
  SUBCASE("learned positions") {
    PositionalEncoding<double> m(PositionEncoding::learned, 5, 6, rng);
    CHECK(names_of(m) == std::vector<std::string>{"table"});
    const auto report = check_module_gradients(m, x);
    expect_passed(report, 2);
    // Positions beyond T get no gradient.
    for (std::size_t c = 0; c < 6; ++c) CHECK(m.table.grad(4, c) == 0.0);
  }
}

TEST_CASE("sinusoidal positions: the fixed table of Vaswani et al., no parameters") {
  Rng rng(24);
  PositionalEncoding<double> m(PositionEncoding::sinusoidal, 8, 6, rng);
  CHECK(m.parameters().empty());
  const auto table = sinusoidal_table<double>(8, 6);
  CHECK(table(0, 0) == 0.0);
  CHECK(table(0, 1) == 1.0);
  CHECK(table(3, 2) == doctest::Approx(std::sin(3.0 / std::pow(10000.0, 2.0 / 6))));
  CHECK(table(5, 5) == doctest::Approx(std::cos(5.0 / std::pow(10000.0, 4.0 / 6))));
  const Tensor3<double> x = xt::zeros<double>({2, 4, 6});
  const auto y = m.forward(x);
  for (std::size_t t = 0; t < 4; ++t) {
    for (std::size_t c = 0; c < 6; ++c) CHECK(y(1, t, c) == table(t, c));
  }
  expect_passed(check_module_gradients(m, randn<double, 3>({2, 4, 6}, rng)), 1);
  const Tensor3<double> too_long = xt::zeros<double>({1, 9, 6});
  CHECK_THROWS_AS(m.forward(too_long), std::invalid_argument);
  CHECK(parse_position_encoding("sinusoidal") == PositionEncoding::sinusoidal);
  CHECK(parse_position_encoding("rope") == PositionEncoding::rope);
  CHECK_THROWS_WITH_AS(parse_position_encoding("rotary"),
                       "parse_position_encoding: positions expected learned|sinusoidal|none|rope, "
                       "got 'rotary'",
                       std::invalid_argument);
}

TEST_CASE("MultiFieldEmbedding: fields add, -1 is absent, names and gradients") {
  Rng rng(25);
  MultiFieldEmbedding<double> m({5, 3}, 4, rng);
  CHECK(names_of(m) == std::vector<std::string>{"fields.0.table", "fields.1.table"});
  CHECK(names_of(m.field(1)) == std::vector<std::string>{"table"});
  const std::vector<TokenIds> fields{TokenIds{{1, 4, kNoToken}, {0, 0, 2}},
                                     TokenIds{{kNoToken, 2, 1}, {0, kNoToken, kNoToken}}};
  const auto y = m.forward(fields);
  for (std::size_t c = 0; c < 4; ++c) {
    CHECK(y(0, 0, c) == m.field(0).table.value(1, c));  // field 1 absent
    CHECK(y(0, 1, c) ==
          doctest::Approx(m.field(0).table.value(4, c) + m.field(1).table.value(2, c)));
    CHECK(y(0, 2, c) == m.field(1).table.value(1, c));  // field 0 absent
  }
  // Gradient: numeric check of both tables through L = Σ r ⊙ y.
  const auto r = randn<double, 3>({2, 3, 4}, rng);
  const auto report = check_parameter_gradients(m, [&](bool with_backward) {
    const auto out = m.forward(fields);
    if (with_backward) m.backward(r);
    double l = 0;
    for (std::size_t i = 0; i < out.size(); ++i) l += out.data()[i] * r.data()[i];
    return l;
  });
  expect_passed(report, 2);
  CHECK_THROWS_AS(m.forward({fields[0]}), std::invalid_argument);
  const std::vector<TokenIds> mismatched{fields[0], TokenIds{{0, 1}}};
  CHECK_THROWS_AS(m.forward(mismatched), ShapeError);
  MultiFieldEmbedding<double> fresh({2}, 3, rng);
  CHECK_THROWS_AS(fresh.backward(r), std::logic_error);
}

TEST_CASE("Module contract: backward adds into grads, zero_grad clears, backward twice doubles") {
  Rng rng(26);
  FeedForward<double> m(4, 6, rng);
  const auto x = randn<double, 3>({2, 3, 4}, rng);
  const auto dy = randn<double, 3>({2, 3, 4}, rng);
  m.forward(x);
  const auto dx1 = m.backward(dy);
  std::vector<xt::xarray<double>> once;
  for (auto& p : m.parameters()) once.push_back(p.param->grad);
  const auto dx2 = m.backward(dy);
  CHECK(dx1 == dx2);  // dx is returned fresh, never accumulated
  std::size_t i = 0;
  for (auto& p : m.parameters()) {
    CAPTURE(p.name);
    CHECK(test::rel_error(p.param->grad, xt::xarray<double>(2.0 * once[i++])) < 1e-15);
  }
  m.zero_grad();
  for (auto& p : m.parameters()) CHECK(xt::all(xt::equal(p.param->grad, 0.0)));
  CHECK(m.num_parameters() == 4 * 6 + 6 + 6 * 4 + 4);
}

TEST_CASE("Module contract: backward before forward throws logic_error, wrong shapes ShapeError") {
  Rng rng(27);
  Linear<double> lin(4, 3, rng);
  LayerNorm<double> ln(4);
  RMSNorm<double> rms(4);
  Gelu<double> gelu(4);
  FeedForward<double> ff(4, 5, rng);
  const Tensor3<double> dy3 = xt::zeros<double>({1, 2, 3});
  const Tensor3<double> dy4 = xt::zeros<double>({1, 2, 4});
  CHECK_THROWS_WITH_AS(lin.backward(dy3), "Linear::backward: called before forward",
                       std::logic_error);
  CHECK_THROWS_AS(ln.backward(dy4), std::logic_error);
  CHECK_THROWS_AS(rms.backward(dy4), std::logic_error);
  CHECK_THROWS_AS(gelu.backward(dy4), std::logic_error);
  CHECK_THROWS_AS(ff.backward(dy4), std::logic_error);
  const Tensor3<double> x5 = xt::zeros<double>({1, 2, 5});
  CHECK_THROWS_WITH_AS(lin.forward(x5), "Linear: x expected (*, *, 4), got (1, 2, 5)", ShapeError);
  const xt::xarray<double> rank2 = xt::zeros<double>({2, 4});
  CHECK_THROWS_WITH_AS(lin.forward(rank2), "Linear: x expected (*, *, 4), got (2, 4) (wrong rank)",
                       ShapeError);
  const Tensor3<double> x4 = xt::zeros<double>({1, 2, 4});
  lin.forward(x4);
  CHECK_THROWS_AS(lin.backward(xt::zeros<double>({1, 3, 3})), ShapeError);
}

TEST_CASE("NaN poisoning: every entry of dx and of the parameter grads is written by backward") {
  // The grads start as NaN-free zeros, so an unwritten parameter grad stays 0 and is caught by the
  // gradient checks; for dx, which is freshly allocated, the heap is filled with NaN first so that
  // recycled, unwritten memory would show up as NaN.
  Rng rng(28);
  FeedForward<double> ff(6, 9, rng);
  LayerNorm<double> ln(6);
  const auto x = randn<double, 3>({2, 3, 6}, rng);
  const auto dy = randn<double, 3>({2, 3, 6}, rng);
  for (SequenceModule<double>* m : std::initializer_list<SequenceModule<double>*>{&ff, &ln}) {
    {
      std::vector<std::vector<double>> poison;
      for (std::size_t n : {36u, 54u, 108u, 162u, 500u}) {
        for (int k = 0; k < 4; ++k) {
          poison.emplace_back(n, std::numeric_limits<double>::quiet_NaN());
        }
      }
    }  // freed: the next allocations of these sizes likely reuse NaN-filled memory
    const auto y = m->forward(x);
    const auto dx = m->backward(dy);
    CHECK(test::all_finite(y));
    CHECK(test::all_finite(dx));
  }
  // Parameter grads poisoned with NaN stay NaN (add-into), proving backward adds, not assigns.
  for (auto& p : ln.parameters()) p.param->grad.fill(std::numeric_limits<double>::quiet_NaN());
  ln.backward(dy);
  for (auto& p : ln.parameters()) CHECK(std::isnan(p.param->grad(0)));
}

namespace {

// A user's own layer, y = x ⊙ scale (per channel), with a backward that can be broken on purpose.
class ChannelScale : public HostSequenceModule<double> {
 public:
  ChannelScale(std::size_t dim, bool broken) : dim_(dim), broken_(broken) {
    scale = make_parameter<double>(xt::xarray<double>(xt::linspace<double>(0.5, 1.5, dim)));
  }
  void collect_parameters(const std::string& prefix, ParameterList<double>& out) override {
    out.push_back({prefix + "scale", &scale});
  }
  std::size_t in_features() const override { return dim_; }
  std::size_t out_features() const override { return dim_; }
  std::string_view type_name() const override { return "ChannelScale"; }
  Parameter<double> scale;

 protected:
  Tensor3<double> forward_host(const Tensor3<double>& x) override {
    x_ = x;
    Tensor3<double> y = x;
    for (std::size_t i = 0; i < y.size(); ++i) y.data()[i] *= scale.value(i % dim_);
    return y;
  }
  Tensor3<double> backward_host(const Tensor3<double>& dy) override {
    Tensor3<double> dx = dy;
    for (std::size_t i = 0; i < dx.size(); ++i) {
      dx.data()[i] *= scale.value(i % dim_);
      // The bug: the last channel's parameter gradient is dropped.
      if (!broken_ || i % dim_ != dim_ - 1) scale.grad(i % dim_) += dy.data()[i] * x_.data()[i];
    }
    return dx;
  }

 private:
  std::size_t dim_;
  bool broken_;
  Tensor3<double> x_;
};

}  // namespace

TEST_CASE("module gradient checker: passes a correct user layer, pinpoints a broken one") {
  Rng rng(29);
  const auto x = randn<double, 3>({2, 3, 4}, rng);
  ChannelScale good(4, false), bad(4, true);
  const auto ok = check_module_gradients(good, x);
  expect_passed(ok, 2);
  const auto report = check_module_gradients(bad, x);
  INFO(report.table());
  REQUIRE(report.results.size() == 2);
  CHECK(report.results[0].name == "x");
  CHECK(report.results[0].rel_error <= kGradTol);  // dx is right
  CHECK(report.results[1].name == "scale");
  CHECK(report.results[1].rel_error > 0.1);
  CHECK(report.results[1].worst_index == 3);  // the dropped channel
  CHECK(report.results[1].analytic_at_worst == 0.0);
  CHECK_FALSE(report.passed(kGradTol));
  CHECK(report.table().find("scale") != std::string::npos);
}
