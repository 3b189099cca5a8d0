// MultiHeadAttention: gradient checks across the option grid (scaling modes, explicit scale,
// causal, key mask, cross-attention, d_k != d_model / heads, QK-norm, learnable scale), the
// statistics at initialisation that the √d_k study rests on, and bad configuration.
#include <doctest/doctest.h>

#include <cmath>
#include <limits>
#include <tuple>
#include <vector>

#include <xtensor/xarray.hpp>

#include "attnlab/nn/gradcheck_module.hpp"
#include "attnlab/nn/multi_head_attention.hpp"
#include "attnlab/ops/softmax.hpp"
#include "helpers.hpp"

using namespace attnlab;

namespace {

constexpr double kGradTol = 1e-6;

AttentionConfig small_config() {
  AttentionConfig c;
  c.d_model = 6;
  c.heads = 2;
  c.d_k = 4;  // != d_model / heads
  c.d_v = 5;
  return c;
}

// Every gradient matches central differences and is non-trivial. k_norm.beta is the exception
// that proves the rule: adding one vector to every key shifts each score row by a constant, which
// the softmax ignores, so its gradient is exactly 0 (checked absolutely).
void expect_passed(const GradcheckReport& report) {
  INFO(report.table());
  for (const auto& r : report.results) {
    CAPTURE(r.name);
    if (r.name == "k_norm.beta") {
      CHECK(r.analytic_norm < 1e-12);
      CHECK(r.max_abs_error < 1e-8);
      continue;
    }
    CHECK(r.rel_error <= kGradTol);
    CHECK(r.analytic_norm > 1e-6);
  }
}

std::vector<std::string> names_of(Module<double>& m) {
  std::vector<std::string> out;
  for (const auto& p : m.parameters()) out.push_back(p.name);
  return out;
}

// Self-attention gradcheck of x and every parameter, with an optional key mask.
GradcheckReport check_self(MultiHeadAttention<double>& m, const Tensor3<double>& x,
                           const KeyMask* mask = nullptr) {
  return check_module_gradients(
      m, x, [&](const Tensor3<double>& in) { return m.forward(in, mask); },
      [&](const Tensor3<double>& dy) { return m.backward(dy); });
}

}  // namespace

// Whether an options type carries per-head scales.
template <class O>
concept HasHeadScale = requires(O o) {
  o.head_scale;
};

TEST_CASE("MHA gradcheck: scaling modes and an explicit scale, d_k != d_model / heads") {
  Rng rng(31);
  const auto x = randn<double, 3>({2, 4, 6}, rng);
  AttentionConfig c = small_config();
  SUBCASE("none") {
    c.sdpa.scaling = Scaling::none;
  }
  SUBCASE("sqrt_dk") {
    c.sdpa.scaling = Scaling::sqrt_dk;
  }
  SUBCASE("dk") {
    c.sdpa.scaling = Scaling::dk;
  }
  SUBCASE("explicit 0.37") {
    c.sdpa.scale = 0.37;
  }
  MultiHeadAttention<double> m(c, rng);
  const auto report = check_module_gradients(m, x);
  CHECK(report.results.size() == 5);  // x, w_q, w_k, w_v, w_o
  expect_passed(report);
}

TEST_CASE("MHA gradcheck: causal, key padding mask, and both") {
  Rng rng(32);
  const auto x = randn<double, 3>({2, 5, 6}, rng);
  // Batch 0 hides keys 1 and 3; batch 1 hides key 0, so its causal query 0 sees nothing.
  const KeyMask mask = {{true, false, true, false, true}, {false, true, true, true, true}};
  AttentionConfig c = small_config();
  SUBCASE("causal") {
    c.sdpa.causal = true;
    MultiHeadAttention<double> m(c, rng);
    expect_passed(check_self(m, x));
  }
  SUBCASE("mask") {
    MultiHeadAttention<double> m(c, rng);
    expect_passed(check_self(m, x, &mask));
    // Hidden keys get zero weight.
    const auto& p = m.attention_weights();
    for (std::size_t h = 0; h < 2; ++h) {
      for (std::size_t i = 0; i < 5; ++i) CHECK(p(0, h, i, 1) == 0.0);
    }
  }
  SUBCASE("causal and mask") {
    c.sdpa.causal = true;
    MultiHeadAttention<double> m(c, rng);
    expect_passed(check_self(m, x, &mask));
    const auto& p = m.attention_weights();
    for (std::size_t j = 0; j < 5; ++j) CHECK(p(1, 0, 0, j) == 0.0);  // empty row: zeros
  }
}

TEST_CASE("MHA gradcheck: cross-attention, queries and context of different lengths and widths") {
  Rng rng(33);
  AttentionConfig c = small_config();
  c.d_context = 7;
  MultiHeadAttention<double> m(c, rng);
  const auto x = randn<double, 3>({2, 3, 6}, rng);
  const auto context = randn<double, 3>({2, 5, 7}, rng);
  const KeyMask mask = {{true, true, false, true, true}, {true, true, true, true, false}};
  // Through the queries (context fixed), then through the context (queries fixed).
  expect_passed(check_module_gradients(
      m, x, [&](const Tensor3<double>& in) { return m.forward_cross(in, context, &mask); },
      [&](const Tensor3<double>& dy) { return m.backward_cross(dy).dx; }));
  expect_passed(check_module_gradients(
      m, context, [&](const Tensor3<double>& in) { return m.forward_cross(x, in, &mask); },
      [&](const Tensor3<double>& dy) { return m.backward_cross(dy).dcontext; }));
  const auto y = m.forward_cross(x, context);
  CHECK(y.shape() == std::array<std::size_t, 3>{2, 3, 6});
  CHECK(m.attention_weights().shape() == std::array<std::size_t, 4>{2, 2, 3, 5});
  CHECK_THROWS_AS(m.forward_cross(x, randn<double, 3>({2, 5, 6}, rng)), ShapeError);
  // Self-attention needs d_context == d_model.
  CHECK_THROWS_WITH_AS(m.forward(x),
                       "MultiHeadAttention: self-attention expected d_context = d_model (6), got 7",
                       std::invalid_argument);
}

TEST_CASE("MHA gradcheck: QK-norm and learnable log-space scale, alone and together") {
  Rng rng(34);
  const auto x = randn<double, 3>({2, 4, 6}, rng);
  const KeyMask mask = {{true, true, true, false}, {true, false, true, true}};
  AttentionConfig c = small_config();
  c.sdpa.causal = true;
  std::vector<std::string> expected{"w_q", "w_k", "w_v", "w_o"};
  SUBCASE("qk_norm") {
    c.qk_norm = true;
    expected.insert(expected.end(), {"q_norm.gamma", "q_norm.beta", "k_norm.gamma", "k_norm.beta"});
  }
  SUBCASE("learnable_scale") {
    c.learnable_scale = true;
    c.sdpa.scaling = Scaling::dk;
    expected.push_back("log_scale");
  }
  SUBCASE("both") {
    c.qk_norm = true;
    c.learnable_scale = true;
    expected.insert(expected.end(),
                    {"q_norm.gamma", "q_norm.beta", "k_norm.gamma", "k_norm.beta", "log_scale"});
  }
  MultiHeadAttention<double> m(c, rng);
  CHECK(names_of(m) == expected);
  if (c.learnable_scale) {
    // Initialised from the mode: log of 1/√D or 1/D.
    const double s = scaling_factor(c.sdpa.scaling, 4);
    CHECK(m.log_scale.value(0) == doctest::Approx(std::log(s)));
    CHECK(m.head_scales()[1] == doctest::Approx(s));
  }
  // Move the norm and scale parameters off their initial values, per head.
  for (auto& p : m.parameters()) {
    if (p.name == "w_q" || p.name == "w_k" || p.name == "w_v" || p.name == "w_o") continue;
    for (auto& v : p.param->value) v += 0.2 * rng.normal();
  }
  expect_passed(check_self(m, x, &mask));
}

TEST_CASE("MHA: d_model 64, one head, d_k 256 works (float), attention rows sum to 1") {
  Rng rng(35);
  AttentionConfig c;
  c.d_model = 64;
  c.heads = 1;
  c.d_k = 256;
  MultiHeadAttention<float> m(c, rng);
  CHECK(m.w_q.value.shape()[1] == 256);
  CHECK(m.w_v.value.shape()[1] == 64);  // d_v derived: d_model / heads
  const auto x = randn<float, 3>({2, 9, 64}, rng);
  const auto y = m.forward(x);
  CHECK(y.shape() == std::array<std::size_t, 3>{2, 9, 64});
  CHECK(m.queries().shape() == std::array<std::size_t, 4>{2, 1, 9, 256});
  const auto& p = m.attention_weights();
  for (std::size_t b = 0; b < 2; ++b) {
    for (std::size_t i = 0; i < 9; ++i) {
      float sum = 0;
      for (std::size_t j = 0; j < 9; ++j) sum += p(b, 0, i, j);
      CHECK(sum == doctest::Approx(1.0f).epsilon(1e-5));
    }
  }
  const auto dx = m.backward(randn<float, 3>({2, 9, 64}, rng));
  CHECK(test::all_finite(dx));
  // The same case at gradcheck size: heads 1, d_k 4 × d_model.
  AttentionConfig small;
  small.d_model = 4;
  small.heads = 1;
  small.d_k = 16;
  MultiHeadAttention<double> md(small, rng);
  expect_passed(check_module_gradients(md, randn<double, 3>({2, 3, 4}, rng)));
}

TEST_CASE("MHA init: q.k has variance ~ d_k for unit-RMS inputs (the premise of the study)") {
  // x rows have RMS exactly 1; W_q, W_k ~ N(0, 1/d_model), so E[(q·k)²] = ‖W_q W_kᵀ‖²_F ≈ d_k
  // for every d_k, also d_k > d_model.
  for (std::size_t d_k : {16u, 64u, 256u}) {
    CAPTURE(d_k);
    Rng rng(36);
    AttentionConfig c;
    c.d_model = 64;
    c.heads = 1;
    c.d_k = d_k;
    MultiHeadAttention<double> m(c, rng);
    auto x = randn<double, 3>({8, 32, 64}, rng);
    for (std::size_t r = 0; r < 8 * 32; ++r) {
      double* row = x.data() + r * 64;
      double ms = 0;
      for (std::size_t i = 0; i < 64; ++i) ms += row[i] * row[i] / 64;
      for (std::size_t i = 0; i < 64; ++i) row[i] /= std::sqrt(ms);
    }
    m.forward(x);
    const auto& q = m.queries();
    const auto& k = m.keys();
    double sum = 0, sum_sq = 0;
    std::size_t n = 0;
    for (std::size_t b = 0; b < 8; ++b) {
      for (std::size_t i = 0; i < 32; ++i) {
        for (std::size_t j = 0; j < 32; ++j) {
          double dot = 0;
          for (std::size_t d = 0; d < d_k; ++d) dot += q(b, 0, i, d) * k(b, 0, j, d);
          sum += dot;
          sum_sq += dot * dot;
          ++n;
        }
      }
    }
    const double mean = sum / double(n), var = sum_sq / double(n) - mean * mean;
    CHECK(std::abs(mean) < 0.2 * std::sqrt(double(d_k)));
    CHECK(var / double(d_k) > 0.8);
    CHECK(var / double(d_k) < 1.25);
  }
}

TEST_CASE("MHA init does not depend on the scaling mode, causal, QK-norm or learnable scale") {
  AttentionConfig a = small_config();
  AttentionConfig b = small_config();
  b.sdpa.scaling = Scaling::none;
  b.sdpa.causal = true;
  b.qk_norm = true;
  b.learnable_scale = true;
  Rng ra(37), rb(37);
  MultiHeadAttention<double> ma(a, ra), mb(b, rb);
  CHECK(ma.w_q.value == mb.w_q.value);
  CHECK(ma.w_k.value == mb.w_k.value);
  CHECK(ma.w_v.value == mb.w_v.value);
  CHECK(ma.w_o.value == mb.w_o.value);
  CHECK(ra.next_u64() == rb.next_u64());  // the same number of draws
}

TEST_CASE("MHA contract: backward twice doubles grads, backward before forward throws") {
  Rng rng(38);
  AttentionConfig c = small_config();
  c.learnable_scale = true;
  c.qk_norm = true;
  MultiHeadAttention<double> m(c, rng);
  const auto dy = randn<double, 3>({2, 4, 6}, rng);
  CHECK_THROWS_WITH_AS(m.backward(dy), "MultiHeadAttention::backward: called before forward",
                       std::logic_error);
  CHECK_THROWS_AS(m.backward_cross(dy), std::logic_error);
  m.forward(randn<double, 3>({2, 4, 6}, rng));
  CHECK_THROWS_AS(m.backward_cross(dy), std::logic_error);  // last forward was self-attention
  m.backward(dy);
  std::vector<xt::xarray<double>> once;
  for (auto& p : m.parameters()) once.push_back(p.param->grad);
  m.backward(dy);
  std::size_t i = 0;
  for (auto& p : m.parameters()) {
    CAPTURE(p.name);
    CHECK(test::rel_error(p.param->grad, xt::xarray<double>(2.0 * once[i++])) < 1e-14);
  }
}

// max |a - b| over two arrays of one shape (0 for equal arrays).
template <class A, class B>
double max_abs_diff(const A& a, const B& b) {
  REQUIRE(a.size() == b.size());
  double m = 0;
  for (std::size_t i = 0; i < a.size(); ++i) m = std::max(m, std::abs(a.data()[i] - b.data()[i]));
  return m;
}

// The parameter grads of `m`, copied.
std::vector<xt::xarray<double>> grads_of(MultiHeadAttention<double>& m) {
  std::vector<xt::xarray<double>> out;
  for (auto& p : m.parameters()) out.push_back(p.param->grad);
  return out;
}

TEST_CASE("MHA context: two forwards in flight, each backward equals its own forward's") {
  for (const SdpaPath path : {SdpaPath::reference, SdpaPath::fused}) {
    CAPTURE(to_string(path));
    Rng rng(39);
    AttentionConfig c = small_config();
    c.learnable_scale = true;
    c.qk_norm = true;
    c.sdpa.causal = true;
    c.sdpa.path = path;
    MultiHeadAttention<double> m(c, rng);
    DeviceOps<double>& ops = m.ops();
    const auto xa = randn<double, 3>({2, 4, 6}, rng), xb = randn<double, 3>({2, 5, 6}, rng);
    const auto ra = randn<double, 3>({2, 4, 6}, rng), rb = randn<double, 3>({2, 5, 6}, rng);
    // One at a time, through the module's own state.
    const auto one_at_a_time = [&](const Tensor3<double>& x, const Tensor3<double>& r) {
      m.zero_grad();
      const Tensor3<double> y = m.forward(x);
      const Tensor3<double> dx = m.backward(r);
      return std::tuple(y, dx, grads_of(m));
    };
    const auto [ya, dxa, ga] = one_at_a_time(xa, ra);
    const auto [yb, dxb, gb] = one_at_a_time(xb, rb);
    // Both forwards first, then the backwards in reverse order.
    typename MultiHeadAttention<double>::Context ctx_a, ctx_b;
    const auto ya2 =
        to_tensor<double, 3>(m.forward(ctx_a, to_buffer<double>(ops, xa), nullptr, nullptr));
    const auto yb2 =
        to_tensor<double, 3>(m.forward(ctx_b, to_buffer<double>(ops, xb), nullptr, nullptr));
    CHECK(max_abs_diff(ya2, ya) == 0.0);
    CHECK(max_abs_diff(yb2, yb) == 0.0);
    CHECK(m.attention_weights(ctx_a).shape()[2] == 4);
    CHECK(m.attention_weights(ctx_b).shape()[2] == 5);
    m.zero_grad();
    const auto back_b = m.backward(ctx_b, to_buffer<double>(ops, rb));
    CHECK(back_b.dcontext.empty());  // self-attention: dx holds every path
    CHECK(max_abs_diff(to_tensor<double, 3>(back_b.dx), dxb) == 0.0);
    auto g = grads_of(m);
    for (std::size_t i = 0; i < g.size(); ++i) CHECK(max_abs_diff(g[i], gb[i]) == 0.0);
    m.zero_grad();
    const auto back_a = m.backward(ctx_a, to_buffer<double>(ops, ra));
    CHECK(max_abs_diff(to_tensor<double, 3>(back_a.dx), dxa) == 0.0);
    g = grads_of(m);
    for (std::size_t i = 0; i < g.size(); ++i) CHECK(max_abs_diff(g[i], ga[i]) == 0.0);
    typename MultiHeadAttention<double>::Context empty;
    CHECK_THROWS_WITH_AS(m.backward(empty, to_buffer<double>(ops, ra)),
                         "MultiHeadAttention::backward: the context holds no forward",
                         std::logic_error);
    CHECK_THROWS_AS(m.backward(ctx_a, to_buffer<double>(ops, rb)),
                    ShapeError);  // dy of the other one
  }
}

TEST_CASE("MHA cross-attention returns both gradients, and backward after it refuses") {
  Rng rng(40);
  AttentionConfig c = small_config();
  c.d_context = 3;
  MultiHeadAttention<double> m(c, rng);
  DeviceOps<double>& ops = m.ops();
  const auto x = randn<double, 3>({2, 4, 6}, rng), context = randn<double, 3>({2, 7, 3}, rng);
  const auto dy = randn<double, 3>({2, 4, 6}, rng);
  m.forward_cross(x, context);
  const auto plain = m.backward_cross(dy);
  CHECK_THROWS_WITH_AS(
      m.backward(dy), doctest::Contains("the last forward was cross-attention; use backward_cross"),
      std::logic_error);
  typename MultiHeadAttention<double>::Context ctx;
  const Buffer<double> context_buffer = to_buffer<double>(ops, context);
  m.forward(ctx, to_buffer<double>(ops, x), &context_buffer, nullptr);
  CHECK(ctx.cross());
  const auto g = m.backward(ctx, to_buffer<double>(ops, dy));
  REQUIRE(!g.dcontext.empty());
  CHECK(max_abs_diff(to_tensor<double, 3>(g.dx), plain.dx) == 0.0);
  CHECK(max_abs_diff(to_tensor<double, 3>(g.dcontext), plain.dcontext) == 0.0);
  CHECK(max_abs_diff(plain.dcontext, xt::zeros_like(plain.dcontext)) > 0.0);
}

TEST_CASE("MHA bad configuration names the field") {
  Rng rng(39);
  AttentionConfig c;
  c.d_model = 30;
  c.heads = 4;
  CHECK_THROWS_WITH_AS(
      MultiHeadAttention<double>(c, rng),
      "AttentionConfig: d_model expected divisible by heads (4) when d_k is 0 (derived), got 30",
      std::invalid_argument);
  c.d_k = 8;
  c.d_v = 8;
  CHECK_NOTHROW(MultiHeadAttention<double>(c, rng));  // explicit head dims: no divisibility needed
  c.heads = 0;
  CHECK_THROWS_WITH_AS(MultiHeadAttention<double>(c, rng),
                       "AttentionConfig: heads expected > 0, got 0", std::invalid_argument);
  c.heads = 2;
  c.d_model = 0;
  CHECK_THROWS_AS(MultiHeadAttention<double>(c, rng), std::invalid_argument);
  c.d_model = 8;
  c.sdpa.scale = -1.0;
  CHECK_THROWS_WITH_AS(MultiHeadAttention<double>(c, rng),
                       "AttentionConfig: sdpa.scale expected a finite scale > 0, got -1.000000",
                       std::invalid_argument);
  c.sdpa.scale.reset();
  // Per-head scales are the learnable scale's: the layer's options have no head_scale.
  static_assert(!HasHeadScale<decltype(AttentionConfig::sdpa)>);
  static_assert(HasHeadScale<SdpaOptions>);
  MultiHeadAttention<double> m(c, rng);
  const xt::xarray<double> rank4 = xt::zeros<double>({1, 1, 2, 8});
  CHECK_THROWS_AS(m.forward(rank4), ShapeError);
  const KeyMask wrong_mask = xt::ones<bool>({1, 3});
  CHECK_THROWS_AS(m.forward(randn<double, 3>({1, 2, 8}, rng), &wrong_mask), ShapeError);
}

TEST_CASE("MHA attention_scores: the logits of the last forward, softmax gives the weights") {
  Rng rng(40);
  AttentionConfig c = small_config();
  c.sdpa.causal = true;
  c.learnable_scale = true;
  MultiHeadAttention<double> m(c, rng);
  CHECK_THROWS_AS(m.attention_scores(), std::logic_error);
  const KeyMask mask = {{true, true, false, true}, {true, true, true, true}};
  m.forward(randn<double, 3>({2, 4, 6}, rng), &mask);
  m.log_scale.value(1) += 1.0;  // a later change must not alter the last forward's scores
  const auto s = m.attention_scores();
  CHECK(s.shape() == std::array<std::size_t, 4>{2, 2, 4, 4});
  CHECK(s(0, 0, 0, 1) == -std::numeric_limits<double>::infinity());  // causal
  CHECK(s(0, 1, 3, 2) == -std::numeric_limits<double>::infinity());  // masked key
  CHECK(test::rel_error(softmax_forward(s), m.attention_weights()) < 1e-15);
  // S = s_h · q·k with s_h the scale the forward used.
  const auto& q = m.queries();
  const auto& k = m.keys();
  double dot = 0;
  for (std::size_t d = 0; d < 4; ++d) dot += q(1, 1, 3, d) * k(1, 1, 2, d);
  CHECK(s(1, 1, 3, 2) == doctest::Approx(dot / 2.0));  // 1/√4 at init
}

TEST_CASE("MHA float and double agree, and unwritten dx entries would show as NaN") {
  Rng ra(41), rb(41);
  AttentionConfig c = small_config();
  c.qk_norm = true;
  c.sdpa.causal = true;
  MultiHeadAttention<double> md(c, ra);
  MultiHeadAttention<float> mf(c, rb);
  Rng rx(42);
  const auto x = randn<double, 3>({3, 5, 6}, rx);
  const auto dy = randn<double, 3>({3, 5, 6}, rx);
  const Tensor3<float> xf = xt::cast<float>(x), dyf = xt::cast<float>(dy);
  {
    // Fill the heap with NaN in blocks of the sizes the forward and backward allocate, so that
    // recycled memory that is never written shows up as NaN in the results.
    std::vector<Tensor3<float>> poison;
    for (std::size_t w : {4u, 5u, 6u, 8u, 10u, 12u, 15u}) {
      for (int k = 0; k < 3; ++k) {
        poison.emplace_back(Tensor3<float>::shape_type{3, 5, w},
                            std::numeric_limits<float>::quiet_NaN());
      }
    }
  }
  const auto yf = mf.forward(xf);
  const auto dxf = mf.backward(dyf);
  CHECK(test::all_finite(yf));
  CHECK(test::all_finite(dxf));
  CHECK(test::rel_error(yf, md.forward(x)) < 1e-5);
  CHECK(test::rel_error(dxf, md.backward(dy)) < 1e-5);
  CHECK(test::rel_error(mf.w_q.grad, md.w_q.grad) < 1e-5);
}
