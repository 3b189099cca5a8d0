// The additive attention bias (S = s · Q Kᵀ + bias, bias (1|B, 1|H, Tq, Tk) broadcast) and its
// gradient dBias on all four attention paths (tests/support/attention_paths.hpp): against the dense
// definition (tests/support/dense_attention.hpp) over every broadcast shape, combined with causal,
// a query offset, a key mask, a sliding window, grouped-query attention and ALiBi; double
// central-difference gradient checks of dq, dk, dv and dbias; PyTorch goldens (a float attn_mask
// with the bias's gradient from autograd); -inf entries; bias_requires_grad; the checks.
#include <doctest/doctest.h>

#include <array>
#include <limits>
#include <string>

#include <nlohmann/json.hpp>
#include <xtensor/xbuilder.hpp>

#include "attention_cases.hpp"
#include "attention_checks.hpp"
#include "attention_paths.hpp"
#include "attnlab/gradcheck.hpp"
#include "attnlab/random.hpp"
#include "dense_attention.hpp"
#include "helpers.hpp"

using namespace attnlab;
using test::Path;

namespace {

using Case = test::AttentionCase;

// The four broadcast shapes of a bias for B, H: (1|B, 1|H, Tq, Tk).
std::array<std::array<std::size_t, 4>, 4> bias_shapes(std::size_t B, std::size_t H, std::size_t Tq,
                                                      std::size_t Tk) {
  return {{{1, H, Tq, Tk}, {B, H, Tq, Tk}, {B, 1, Tq, Tk}, {1, 1, Tq, Tk}}};
}

void check_against_dense(Path path, const Case& c) {
  CAPTURE(test::name_of(path));
  CAPTURE(c.causal);
  CAPTURE(c.offset);
  CAPTURE(c.window);
  CAPTURE(c.Hkv);
  Rng rng(131);
  const auto [q, k, v, mask] = test::random_inputs(rng, c.B, c.H, c.Hkv, c.Tq, c.Tk, c.D, c.Dv);
  const SdpaOptions options = test::case_options(c);
  const KeyMask* m = c.mask ? &mask : nullptr;
  for (const auto& shape : bias_shapes(c.B, c.H, c.Tq, c.Tk)) {
    CAPTURE(format_shape_of(shape));
    const Tensor4<double> bias = 2.0 * randn<double, 4>(shape, rng);
    const test::Result r = test::run(path, q, k, v, nullptr, options, m, &bias);
    REQUIRE(test::all_finite(r.out));
    CHECK(test::rel_error(r.out, test::dense_attention(q, k, v, options, m, &bias)) < 1e-13);
  }
}

// dq, dk, dv and dbias of loss = Σ out ⊙ r against central differences, for each bias shape.
void gradcheck_with_bias(Path path, const Case& c, double tolerance) {
  const KeyMask mask = [&] {
    KeyMask m = xt::ones<bool>({c.B, c.Tk});
    m(0, 1) = false;
    return m;
  }();
  for (const auto& shape : bias_shapes(c.B, c.H, c.Tq, c.Tk)) {
    CAPTURE(c.causal);
    CAPTURE(format_shape_of(shape));
    Rng rng(137);
    auto q = randn<double, 4>({c.B, c.H, c.Tq, c.D}, rng);
    auto k = randn<double, 4>({c.B, c.Hkv, c.Tk, c.D}, rng);
    auto v = randn<double, 4>({c.B, c.Hkv, c.Tk, c.Dv}, rng);
    auto bias = randn<double, 4>(shape, rng);
    const auto r = randn<double, 4>({c.B, c.H, c.Tq, c.Dv}, rng);
    SdpaOptions options = test::case_options(c);
    options.head_scale.assign(c.H, 0.6);
    test::check_path_gradients(path, q, k, v, r, options, c.mask ? &mask : nullptr, &bias,
                               tolerance);
  }
}

}  // namespace

TEST_CASE("bias: every path equals the dense definition, over every broadcast shape and variant") {
  for (Path path : test::kPaths) {
    check_against_dense(path, {2, 2, 2, 5, 7, 3, 2, false, 0, 0, false, false});  // bidirectional
    check_against_dense(path, {2, 4, 2, 6, 6, 3, 2, true, 0, 0, true, false});    // GQA, mask
    check_against_dense(path, {1, 2, 2, 3, 8, 3, 3, true, 5, 0, true, true});     // decoding, ALiBi
    check_against_dense(path, {2, 2, 1, 7, 7, 2, 2, true, 0, 3, false, false});   // window, MQA
    // 64-row GPU tiles over two key tiles.
    check_against_dense(path, {1, 2, 2, 70, 90, 4, 3, true, 20, 0, true, false});
  }
}

TEST_CASE("bias: central-difference gradient check of dq, dk, dv and dbias on every path") {
  for (Path path : test::kPaths) {
    gradcheck_with_bias(path, {2, 2, 2, 4, 5, 3, 2, false, 0, 0, true, false}, 1e-7);
    gradcheck_with_bias(path, {2, 4, 2, 4, 6, 3, 2, true, 2, 0, true, true}, 1e-7);    // GQA, ALiBi
    gradcheck_with_bias(path, {1, 2, 1, 5, 5, 2, 2, true, 0, 2, false, false}, 1e-7);  // window
  }
}

TEST_CASE("golden: an additive bias and its gradient match PyTorch on every path") {
  // tests/golden/make_goldens.py bias.json: masked attention with a float bias (1|B, 1|H, Tq, Tk)
  // added to the scaled scores, autograd, float64.
  const auto& file = test::golden_file("bias.json");
  REQUIRE(file.at("cases").size() >= 4);
  for (const auto& c : file.at("cases")) {
    const auto& config = c.at("config");
    SdpaOptions options;
    options.causal = config.at("causal").get<bool>();
    options.query_offset = config.at("offset").get<std::size_t>();
    test::check_golden_case(c, options);
  }
}

TEST_CASE(
    "bias: -inf entries hide keys as the key mask does, and a row they hide wholly gives zeros") {
  const std::size_t B = 2, H = 2, Tq = 4, Tk = 5, D = 3;
  Rng rng(139);
  const auto q = randn<double, 4>({B, H, Tq, D}, rng);
  const auto k = randn<double, 4>({B, H, Tk, D}, rng);
  const auto v = randn<double, 4>({B, H, Tk, D}, rng);
  const auto r = randn<double, 4>({B, H, Tq, D}, rng);
  constexpr double hidden = -std::numeric_limits<double>::infinity();
  KeyMask mask = xt::ones<bool>({B, Tk});
  mask(0, 1) = mask(1, 3) = false;
  Tensor4<double> bias = xt::zeros<double>({B, std::size_t{1}, Tq, Tk});
  for (std::size_t i = 0; i < Tq; ++i) bias(0, 0, i, 1) = bias(1, 0, i, 3) = hidden;
  Tensor4<double> with_empty_row = bias;
  for (std::size_t j = 0; j < Tk; ++j) with_empty_row(1, 0, 2, j) = hidden;  // batch 1, query 2
  for (Path path : test::kPaths) {
    CAPTURE(test::name_of(path));
    const test::Result masked = test::run(path, q, k, v, &r, {}, &mask);
    const test::Result biased = test::run(path, q, k, v, &r, {}, nullptr, &bias);
    CHECK(test::rel_error(biased.out, masked.out) < 1e-14);
    CHECK(test::rel_error(biased.dq, masked.dq) < 1e-14);
    CHECK(test::rel_error(biased.dk, masked.dk) < 1e-14);
    CHECK(test::rel_error(biased.dv, masked.dv) < 1e-14);
    for (std::size_t i = 0; i < Tq; ++i) {
      CHECK(biased.dbias(0, 0, i, 1) == 0.0);  // P = 0 there, hence dS = 0
      CHECK(biased.dbias(1, 0, i, 3) == 0.0);
    }

    const test::Result empty = test::run(path, q, k, v, &r, {}, nullptr, &with_empty_row);
    REQUIRE(test::all_finite(empty.out));
    REQUIRE(test::all_finite(empty.dq));
    REQUIRE(test::all_finite(empty.dbias));
    for (std::size_t h = 0; h < H; ++h) {
      for (std::size_t c = 0; c < D; ++c) {
        CHECK(empty.out(1, h, 2, c) == 0.0);
        CHECK(empty.dq(1, h, 2, c) == 0.0);
      }
    }
    for (std::size_t j = 0; j < Tk; ++j) CHECK(empty.dbias(1, 0, 2, j) == 0.0);
  }
}

TEST_CASE("bias: bias_requires_grad false gives no dbias and the same other gradients") {
  Rng rng(149);
  const auto q = randn<double, 4>({2, 2, 3, 4}, rng);
  const auto r = randn<double, 4>({2, 2, 3, 4}, rng);
  const auto bias = randn<double, 4>({1, 2, 3, 3}, rng);
  SdpaOptions constant;
  constant.bias_requires_grad = false;
  for (Path path : test::kPaths) {
    CAPTURE(test::name_of(path));
    const test::Result learned = test::run(path, q, q, q, &r, {}, nullptr, &bias);
    const test::Result fixed = test::run(path, q, q, q, &r, constant, nullptr, &bias);
    CHECK(learned.dbias.size() == bias.size());
    CHECK(fixed.dbias.size() == 0);
    CHECK(fixed.dq == learned.dq);
    CHECK(fixed.dk == learned.dk);
    CHECK(fixed.dv == learned.dv);
  }
  // Without a bias there is no dbias either.
  SdpaCache<double> cache;
  sdpa_forward(cache, q, q, q);
  CHECK(sdpa_backward(r, cache, q, q, q).dbias.size() == 0);
}

TEST_CASE(
    "bias: the scores carry it, and a bias that does not broadcast is refused with both shapes") {
  Rng rng(151);
  const auto q = randn<double, 4>({2, 2, 3, 4}, rng);
  const auto k = randn<double, 4>({2, 2, 5, 4}, rng);
  const auto bias = randn<double, 4>({2, 1, 3, 5}, rng);
  const Tensor4<double> with = sdpa_scores(q, k, {}, nullptr, &bias);
  const Tensor4<double> without = sdpa_scores(q, k);
  for (std::size_t b = 0; b < 2; ++b) {
    for (std::size_t h = 0; h < 2; ++h) {
      for (std::size_t i = 0; i < 3; ++i) {
        for (std::size_t j = 0; j < 5; ++j) {
          CHECK(with(b, h, i, j) == doctest::Approx(without(b, h, i, j) + bias(b, 0, i, j)));
        }
      }
    }
  }

  SdpaCache<double> cache;
  for (const std::array<std::size_t, 4>& shape :
       {std::array<std::size_t, 4>{3, 2, 3, 5}, {2, 3, 3, 5}, {2, 2, 5, 3}, {1, 2, 3, 4}}) {
    CAPTURE(format_shape_of(shape));
    const Tensor4<double> wrong = xt::zeros<double>(shape);
    CHECK_THROWS_WITH_AS(sdpa_forward(cache, q, k, k, {}, nullptr, &wrong),
                         doctest::Contains("sdpa_forward: bias expected (2, 2, 3, 5)"), ShapeError);
    const std::string got = "got " + format_shape_of(shape);
    CHECK_THROWS_WITH_AS(sdpa_forward(cache, q, k, k, {}, nullptr, &wrong),
                         doctest::Contains(got.c_str()), ShapeError);
  }
  const Tensor4<double> ds = xt::ones<double>({2, 2, 3, 5});
  const Tensor4<double> summed = sum_to_bias_shape(ds, {1, 1, 3, 5});
  CHECK(summed(0, 0, 2, 4) == 4.0);
  CHECK_THROWS_AS(sum_to_bias_shape(ds, {1, 1, 3, 4}), ShapeError);
}
