// Rotary positions (attnlab/ops/rope.hpp; MultiHeadAttention with AttentionConfig::rope): the op's
// defining properties, a central-difference gradient check in double, PyTorch goldens
// (tests/golden/make_goldens.py, rope.json: complex multiplication, an independent formulation)
// for the op and for attention layers with RoPE on both attention paths, and the layer's
// gradient check with QK-norm, partial and interleaved pairs and GQA.
#include <doctest/doctest.h>

#include <cmath>
#include <nlohmann/json.hpp>
#include <string>
#include <xtensor/xarray.hpp>
#include <xtensor/xview.hpp>

#include "attnlab/gradcheck.hpp"
#include "attnlab/nn/gradcheck_module.hpp"
#include "attnlab/nn/multi_head_attention.hpp"
#include "attnlab/ops/layernorm.hpp"
#include "attnlab/ops/rope.hpp"
#include "attnlab/random.hpp"
#include "helpers.hpp"

using namespace attnlab;
using attnlab::test::golden_file;
using attnlab::test::golden_tensor;
using attnlab::test::rel_error;

namespace {

constexpr double kGradTol = 1e-6;
constexpr double kGoldenTol = 1e-12;

double row_dot(const Tensor4<double>& a, std::size_t ta, const Tensor4<double>& b, std::size_t tb) {
  double s = 0;
  for (std::size_t d = 0; d < a.shape()[3]; ++d) s += a(0, 0, ta, d) * b(0, 0, tb, d);
  return s;
}

void expect_passed(const GradcheckReport& report) {
  INFO(report.table());
  CHECK(report.max_rel_error() <= kGradTol);
  for (const auto& r : report.results) CHECK(r.analytic_norm > 1e-6);  // k_norm.beta too (RoPE)
}

RopeOptions options_of(const nlohmann::json& cfg) {
  return {.theta = cfg.at("theta"),
          .fraction = cfg.at("fraction"),
          .interleaved = cfg.at("interleaved")};
}

}  // namespace

TEST_CASE(
    "rope: rotations keep norms, q·k depends on the distance only, the rest passes, "
    "backward inverts") {
  Rng rng(5);
  for (const bool interleaved : {false, true}) {
    CAPTURE(interleaved);
    const RopeOptions options{.theta = 100.0, .fraction = 0.5, .interleaved = interleaved};
    const auto x = randn<double, 4>({2, 3, 6, 12}, rng);
    const auto y = rope_forward(x, options, 4);
    // Position 0 is the identity; each rotated pair keeps its length; dims 6 .. 11 pass.
    const auto y0 = rope_forward(x, options, 0);
    for (std::size_t d = 0; d < 12; ++d) CHECK(y0(1, 2, 0, d) == x(1, 2, 0, d));
    for (std::size_t t = 0; t < 6; ++t) {
      for (std::size_t i = 0; i < 3; ++i) {
        const std::size_t a = interleaved ? 2 * i : i, b = interleaved ? 2 * i + 1 : i + 3;
        CHECK(std::hypot(y(1, 0, t, a), y(1, 0, t, b)) ==
              doctest::Approx(std::hypot(x(1, 0, t, a), x(1, 0, t, b))).epsilon(1e-14));
        CHECK(y(1, 0, t, a) != x(1, 0, t, a));
      }
      for (std::size_t d = 6; d < 12; ++d) CHECK(y(1, 0, t, d) == x(1, 0, t, d));
    }
    // q at p and k at p' score alike for every shift of both: a function of p − p' only.
    const auto q = randn<double, 4>({1, 1, 5, 8}, rng), k = randn<double, 4>({1, 1, 5, 8}, rng);
    const RopeOptions full{.theta = 10000.0, .fraction = 1.0, .interleaved = interleaved};
    const auto q0 = rope_forward(q, full, 0), k0 = rope_forward(k, full, 0);
    const auto q9 = rope_forward(q, full, 9), k9 = rope_forward(k, full, 9);
    for (std::size_t i = 0; i < 5; ++i) {
      for (std::size_t j = 0; j < 5; ++j) {
        CHECK(row_dot(q9, i, k9, j) == doctest::Approx(row_dot(q0, i, k0, j)).epsilon(1e-12));
      }
    }
    CHECK(std::abs(row_dot(q0, 0, k0, 3) -
                   row_dot(rope_forward(q, full, 0), 0, rope_forward(k, full, 1), 3)) > 1e-6);
    // The backward is the inverse rotation, so it undoes the forward.
    CHECK(rel_error(rope_backward(y, options, 4), x) < 1e-14);
  }
}

TEST_CASE("rope gradcheck in double: the backward is the forward's transpose") {
  Rng rng(6);
  for (const bool interleaved : {false, true}) {
    CAPTURE(interleaved);
    const RopeOptions options{.theta = 30.0, .fraction = 0.8, .interleaved = interleaved};
    auto x = randn<double, 4>({2, 2, 4, 10}, rng);
    const auto r = randn<double, 4>({2, 2, 4, 10}, rng);
    const auto dx = rope_backward(r, options, 3);
    const auto loss = [&] {
      const auto y = rope_forward(x, options, 3);
      double s = 0;
      for (std::size_t i = 0; i < y.size(); ++i) s += y.data()[i] * r.data()[i];
      return s;
    };
    expect_passed(check_gradients({{"dx", x.data(), dx.data(), {2, 2, 4, 10}}}, loss));
  }
}

TEST_CASE("rope bad options name the field and the value") {
  const auto x = Tensor4<double>(xt::zeros<double>({1, 1, 2, 6}));
  const auto expect = [&](const RopeOptions& o, const std::string& message) {
    CHECK_THROWS_WITH_AS(((void)rope_forward(x, o)), message.c_str(), std::invalid_argument);
  };
  expect({.theta = 0.0}, "rope_forward: rope_theta expected a finite base > 0, got 0.000000");
  expect({.theta = -1.0}, "rope_forward: rope_theta expected a finite base > 0, got -1.000000");
  expect({.theta = std::nan("")}, "rope_forward: rope_theta expected a finite base > 0, got nan");
  expect({.fraction = 0.0},
         "rope_forward: rope_fraction expected a fraction of the head dim in (0, 1], got "
         "0.000000");
  expect({.fraction = 1.5},
         "rope_forward: rope_fraction expected a fraction of the head dim in (0, 1], got "
         "1.500000");
  expect({.fraction = 0.5},
         "rope_forward: rope_fraction expected floor(fraction * d_k) even and >= 2 (d_k = 6), "
         "got 0.500000 (3 dims)");
  // 0.7 · 10 is 6.999… in binary: floor within 1e-9 makes it 7 (odd, refused), not 6.
  CHECK_THROWS_WITH_AS((void)rope_dims("op", {.fraction = 0.7}, 10),
                       doctest::Contains("got 0.700000 (7 dims)"), std::invalid_argument);
  CHECK(rope_dims("op", {.fraction = 0.6}, 10) == 6);
  CHECK(rope_dims("op", {.fraction = 1.0}, 10) == 10);
}

TEST_CASE("golden: rope_forward and rope_backward match PyTorch (complex multiplication)") {
  std::size_t checked = 0;
  for (const auto& c : golden_file("rope.json").at("cases")) {
    const auto& cfg = c.at("config");
    if (!cfg.contains("offset")) continue;  // the attention cases
    const std::string name = c.at("name");
    CAPTURE(name);
    const std::size_t offset = cfg.at("offset");
    const Tensor4<double> x = golden_tensor(c, "x"), r = golden_tensor(c, "r");
    CHECK(rel_error(rope_forward(x, options_of(cfg), offset), golden_tensor(c, "y")) < kGoldenTol);
    CHECK(rel_error(rope_backward(r, options_of(cfg), offset), golden_tensor(c, "dx")) <
          kGoldenTol);
    ++checked;
  }
  CHECK(checked == 5);
}

TEST_CASE(
    "golden: attention with RoPE (after QK-norm, partial, interleaved, GQA) matches "
    "PyTorch on both paths") {
  std::size_t checked = 0;
  for (const auto& c : golden_file("rope.json").at("cases")) {
    const auto& cfg = c.at("config");
    if (cfg.contains("offset")) continue;  // the op cases
    for (const SdpaPath path : {SdpaPath::reference, SdpaPath::fused}) {
      const std::string name = c.at("name");
      CAPTURE(name);
      CAPTURE(to_string(path));
      AttentionConfig config;
      config.d_model = cfg.at("d_model");
      config.heads = cfg.at("heads");
      config.kv_heads = cfg.at("kv_heads");
      config.d_k = config.d_v = cfg.at("d_k");
      config.sdpa.causal = cfg.at("causal");
      config.sdpa.path = path;
      config.qk_norm = cfg.at("qk_norm");
      config.rope = true;
      config.rope_theta = cfg.at("theta");
      config.rope_fraction = cfg.at("fraction");
      config.rope_interleaved = cfg.at("interleaved");
      Rng rng(0);
      MultiHeadAttention<double> m(config, rng);
      auto params = m.parameters();
      for (auto& p : params) p.param->value = golden_tensor(c, p.name);
      const Tensor3<double> x = golden_tensor(c, "x"), r = golden_tensor(c, "r");
      KeyMask mask;
      if (cfg.at("has_mask")) mask = xt::cast<bool>(golden_tensor(c, "mask"));
      m.zero_grad();
      CHECK(rel_error(m.forward(x, cfg.at("has_mask") ? &mask : nullptr), golden_tensor(c, "y")) <
            kGoldenTol);
      CHECK(rel_error(m.attention_weights(), golden_tensor(c, "p")) < kGoldenTol);
      CHECK(rel_error(m.backward(r), golden_tensor(c, "dx")) < kGoldenTol);
      for (const auto& p : params) {
        CAPTURE(p.name);
        const auto expected = golden_tensor(c, "d" + p.name);
        // k_norm.beta too: without RoPE its gradient is exactly zero (one shift of every key
        // moves a row's scores alike), but RoPE turns the shift by each key's position.
        if (p.name == "k_norm.beta") CHECK(xt::amax(xt::abs(expected))() > 1e-3);
        CHECK(rel_error(p.param->grad, expected) < kGoldenTol);
      }
      ++checked;
    }
  }
  CHECK(checked == 6);
}

TEST_CASE("MHA with RoPE: the queries the core sees are the rotated QK-normed projections") {
  Rng rng(7);
  AttentionConfig c;
  c.d_model = 8;
  c.heads = 2;
  c.qk_norm = true;
  c.rope = true;
  c.rope_theta = 10.0;
  MultiHeadAttention<double> m(c, rng);
  const auto x = randn<double, 3>({2, 5, 8}, rng);
  (void)m.forward(x);
  // q = rope(layernorm(split(x W_q))) with the norm's initial γ = 1, β = 0.
  Tensor3<double> proj({2, 5, 8});
  for (std::size_t b = 0; b < 2; ++b) {
    for (std::size_t t = 0; t < 5; ++t) {
      for (std::size_t o = 0; o < 8; ++o) {
        double s = 0;
        for (std::size_t i = 0; i < 8; ++i) s += x(b, t, i) * m.w_q.value(i, o);
        proj(b, t, o) = s;
      }
    }
  }
  const Tensor4<double> heads = split_heads<double>(proj, 2);
  Tensor2<double> rows = xt::reshape_view(heads, {20, 4});
  LayerNormCache<double, 2> cache;
  const Tensor2<double> normed =
      layernorm_forward<double, 2>(cache, rows, Tensor1<double>(xt::ones<double>({4})),
                                   Tensor1<double>(xt::zeros<double>({4})), kLayerNormEps);
  const Tensor4<double> expected =
      rope_forward(Tensor4<double>(xt::reshape_view(normed, {2, 2, 5, 4})), c.rope_options());
  CHECK(rel_error(m.queries(), expected) < 1e-13);
}

TEST_CASE("MHA gradcheck with RoPE: alone, after QK-norm, partial, interleaved, GQA, both paths") {
  Rng rng(8);
  for (const SdpaPath path : {SdpaPath::reference, SdpaPath::fused}) {
    CAPTURE(to_string(path));
    AttentionConfig c;
    c.d_model = 8;
    c.heads = 4;
    c.sdpa.causal = true;
    c.sdpa.path = path;
    c.rope = true;
    c.rope_theta = 20.0;
    SUBCASE("rope") {}
    SUBCASE("rope after QK-norm, learnable scale") {
      c.qk_norm = true;
      c.learnable_scale = true;
    }
    SUBCASE("partial, interleaved, GQA") {
      c.d_k = 6;
      c.rope_fraction = 2.0 / 3.0;
      c.rope_interleaved = true;
      c.kv_heads = 2;
    }
    MultiHeadAttention<double> m(c, rng);
    if (c.qk_norm) {  // away from γ = 1, β = 0
      m.q_norm_gamma.value += 0.3 * randn<double, 1>({m.q_norm_gamma.value.size()}, rng);
      m.k_norm_beta.value += 0.3 * randn<double, 1>({m.k_norm_beta.value.size()}, rng);
    }
    const auto x = randn<double, 3>({2, 5, 8}, rng);
    expect_passed(check_module_gradients(m, x));
  }
}

TEST_CASE("MHA with RoPE refuses cross-attention, naming the option") {
  Rng rng(9);
  AttentionConfig c;
  c.d_model = 4;
  c.heads = 1;
  c.rope = true;
  MultiHeadAttention<double> m(c, rng);
  const auto x = randn<double, 3>({1, 3, 4}, rng);
  CHECK_THROWS_WITH_AS(
      (void)m.forward_cross(x, x),
      "MultiHeadAttention: rope expected self-attention (queries and keys at positions of one "
      "sequence), got cross-attention",
      std::invalid_argument);
  c.rope_fraction = 0.5;  // 2 of 4 dims: allowed
  CHECK_NOTHROW(MultiHeadAttention<double>(c, rng));
  c.rope_fraction = 0.25;  // 1 dim
  CHECK_THROWS_WITH_AS(
      MultiHeadAttention<double>(c, rng),
      "AttentionConfig: rope_fraction expected floor(fraction * d_k) even and >= 2 (d_k = 4), got "
      "0.250000 (1 dims)",
      std::invalid_argument);
}
