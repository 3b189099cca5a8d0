// The layer ops (linear, embedding, layernorm, rmsnorm, gelu, relu, cross-entropy): gradient
// checks in double, properties an implementation must have, and bad input.
#include <doctest/doctest.h>

#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include <xtensor/xarray.hpp>
#include <xtensor/xmath.hpp>
#include <xtensor/xstrided_view.hpp>

#include "attnlab/gradcheck.hpp"
#include "attnlab/ops/cross_entropy.hpp"
#include "attnlab/ops/embedding.hpp"
#include "attnlab/ops/gelu.hpp"
#include "attnlab/ops/layernorm.hpp"
#include "attnlab/ops/linear.hpp"
#include "attnlab/ops/relu.hpp"
#include "attnlab/ops/rmsnorm.hpp"
#include "attnlab/ops/softcap.hpp"
#include "attnlab/ops/swiglu.hpp"
#include "attnlab/random.hpp"
#include "attnlab/threads.hpp"
#include "helpers.hpp"

using namespace attnlab;

namespace {

constexpr double kGradTol = 1e-6;  // ‖g − ĝ‖ / max(‖g‖, ‖ĝ‖), central differences in double

template <class A, class B>
double dot(const A& a, const B& b) {
  double s = 0;
  for (std::size_t i = 0; i < a.size(); ++i) s += a.data()[i] * b.data()[i];
  return s;
}

template <class S>
std::vector<std::size_t> dims(const S& s) {
  return std::vector<std::size_t>(s.begin(), s.end());
}

void expect_passed(const GradcheckReport& report) {
  INFO(report.table());
  CHECK(report.max_rel_error() <= kGradTol);
  for (const auto& r : report.results) CHECK(r.analytic_norm > 1e-6);  // never zeros vs zeros
}

}  // namespace

TEST_CASE("linear gradcheck: dx, dW and db, with and without bias, rank 2 and 3") {
  Rng rng(11);
  auto x = randn<double, 3>({2, 3, 5}, rng);
  auto w = randn<double, 2>({5, 4}, rng);
  auto b = randn<double, 1>({4}, rng);
  const auto r = randn<double, 3>({2, 3, 4}, rng);
  for (bool with_bias : {true, false}) {
    CAPTURE(with_bias);
    const auto loss = [&] {
      LinearCache<double, 3> c;
      return dot(linear_forward<double, 3>(c, x, w, with_bias ? &b : nullptr), r);
    };
    LinearCache<double, 3> cache;
    linear_forward<double, 3>(cache, x, w, with_bias ? &b : nullptr);
    const auto g = linear_backward<double, 3>(r, cache, w, with_bias);
    std::vector<GradcheckTensor> tensors{{"dx", x.data(), g.dx.data(), dims(x.shape())},
                                         {"dw", w.data(), g.dw.data(), dims(w.shape())}};
    if (with_bias) tensors.push_back({"db", b.data(), g.db.data(), {4}});
    expect_passed(check_gradients(tensors, loss));
    CHECK(g.db.size() == (with_bias ? 4u : 0u));
  }
  // Rank 2 gives the same numbers as rank 3 with the rows flattened.
  const Tensor2<double> x2 = xt::reshape_view(x, {6, 5});
  LinearCache<double, 2> c2;
  LinearCache<double, 3> c3;
  const auto y2 = linear_forward<double, 2>(c2, x2, w, &b);
  const auto y3 = linear_forward<double, 3>(c3, x, w, &b);
  CHECK(std::equal(y2.begin(), y2.end(), y3.begin()));
}

TEST_CASE("linear bad input: wrong width, wrong bias, backward before forward") {
  Rng rng(1);
  const auto x = randn<double, 3>({2, 3, 5}, rng);
  const auto w = randn<double, 2>({4, 4}, rng);
  LinearCache<double, 3> cache;
  CHECK_THROWS_WITH_AS((linear_forward<double, 3>(cache, x, w)),
                       "linear_forward: x expected (*, *, 4), got (2, 3, 5)", ShapeError);
  const auto w5 = randn<double, 2>({5, 4}, rng);
  const Tensor1<double> b3 = xt::zeros<double>({3});
  CHECK_THROWS_AS((linear_forward<double, 3>(cache, x, w5, &b3)), ShapeError);
  const Tensor3<double> dy = xt::zeros<double>({2, 3, 4});
  CHECK_THROWS_AS((linear_backward<double, 3>(dy, LinearCache<double, 3>{}, w5, true)),
                  std::logic_error);
}

TEST_CASE("embedding gradcheck, absent ids give zero rows, out-of-range ids throw") {
  Rng rng(12);
  auto table = randn<double, 2>({6, 3}, rng);
  TokenIds ids = {{1, 4, kNoToken, 1}, {0, 5, 5, 2}};
  const auto r = randn<double, 3>({2, 4, 3}, rng);
  const auto loss = [&] {
    EmbeddingCache c;
    return dot(embedding_forward<double>(c, ids, table), r);
  };
  EmbeddingCache cache;
  const auto y = embedding_forward<double>(cache, ids, table);
  for (std::size_t j = 0; j < 3; ++j) CHECK(y(0, 2, j) == 0.0);  // kNoToken contributes nothing
  const auto dtable = embedding_backward<double>(r, cache);
  for (std::size_t j = 0; j < 3; ++j) CHECK(dtable(3, j) == 0.0);  // id 3 unused
  expect_passed(check_gradients({{"dtable", table.data(), dtable.data(), {6, 3}}}, loss));

  TokenIds bad = {{1, 6}};
  CHECK_THROWS_WITH_AS(
      (embedding_forward<double>(cache, bad, table)),
      "embedding_forward: ids[0, 1] expected an id in [0, 6) or -1 (no token), got 6",
      std::invalid_argument);
  bad(0, 1) = -2;
  CHECK_THROWS_AS((embedding_forward<double>(cache, bad, table)), std::invalid_argument);
  CHECK_THROWS_AS((embedding_backward<double>(r, EmbeddingCache{})), std::logic_error);
}

TEST_CASE("layernorm and rmsnorm gradcheck over ranks 2, 3 and 4") {
  Rng rng(13);
  SUBCASE("layernorm rank 3") {
    auto x = randn<double, 3>({2, 3, 6}, rng);
    auto gamma = randn<double, 1>({6}, rng);
    auto beta = randn<double, 1>({6}, rng);
    const auto r = randn<double, 3>({2, 3, 6}, rng);
    const auto loss = [&] {
      LayerNormCache<double, 3> c;
      return dot(layernorm_forward<double, 3>(c, x, gamma, beta), r);
    };
    LayerNormCache<double, 3> cache;
    layernorm_forward<double, 3>(cache, x, gamma, beta);
    const auto g = layernorm_backward<double, 3>(r, cache, gamma);
    expect_passed(check_gradients({{"dx", x.data(), g.dx.data(), {2, 3, 6}},
                                   {"dgamma", gamma.data(), g.dgamma.data(), {6}},
                                   {"dbeta", beta.data(), g.dbeta.data(), {6}}},
                                  loss));
  }
  SUBCASE("layernorm rank 4 (QK-norm heads)") {
    auto x = randn<double, 4>({2, 2, 3, 4}, rng);
    auto gamma = randn<double, 1>({4}, rng);
    auto beta = randn<double, 1>({4}, rng);
    const auto r = randn<double, 4>({2, 2, 3, 4}, rng);
    const auto loss = [&] {
      LayerNormCache<double, 4> c;
      return dot(layernorm_forward<double, 4>(c, x, gamma, beta), r);
    };
    LayerNormCache<double, 4> cache;
    layernorm_forward<double, 4>(cache, x, gamma, beta);
    const auto g = layernorm_backward<double, 4>(r, cache, gamma);
    expect_passed(check_gradients({{"dx", x.data(), g.dx.data(), {2, 2, 3, 4}},
                                   {"dgamma", gamma.data(), g.dgamma.data(), {4}},
                                   {"dbeta", beta.data(), g.dbeta.data(), {4}}},
                                  loss));
  }
  SUBCASE("rmsnorm rank 2") {
    auto x = randn<double, 2>({5, 6}, rng);
    auto gamma = randn<double, 1>({6}, rng);
    const auto r = randn<double, 2>({5, 6}, rng);
    const auto loss = [&] {
      RmsNormCache<double, 2> c;
      return dot(rmsnorm_forward<double, 2>(c, x, gamma), r);
    };
    RmsNormCache<double, 2> cache;
    rmsnorm_forward<double, 2>(cache, x, gamma);
    const auto g = rmsnorm_backward<double, 2>(r, cache, gamma);
    expect_passed(check_gradients(
        {{"dx", x.data(), g.dx.data(), {5, 6}}, {"dgamma", gamma.data(), g.dgamma.data(), {6}}},
        loss));
  }
}

// The norms sum each row in SIMD lanes (pairs of batches into two accumulators, one more batch,
// then a scalar tail). These widths take the tail alone, one batch, pairs, and pairs with the batch
// and the tail, at 4, 8 and 16 lanes.
TEST_CASE("layernorm and rmsnorm across the SIMD paths: a plain loop, gradcheck, float") {
  Rng rng(15);
  for (std::size_t C : {3, 4, 7, 12, 15, 27, 33, 51, 67}) {
    CAPTURE(C);
    const std::size_t rows = 3;
    auto x = randn<double, 2>({rows, C}, rng, 2.0);
    x += 0.5;  // a non-zero mean
    auto gamma = randn<double, 1>({C}, rng);
    auto beta = randn<double, 1>({C}, rng);
    const auto r = randn<double, 2>({rows, C}, rng);
    const double eps = 1e-5;

    LayerNormCache<double, 2> lc;
    const auto y = layernorm_forward<double, 2>(lc, x, gamma, beta, eps);
    RmsNormCache<double, 2> rc;
    const auto z = rmsnorm_forward<double, 2>(rc, x, gamma, eps);
    for (std::size_t i = 0; i < rows; ++i) {  // against a plain loop, row by row
      double mean = 0, var = 0, ms = 0;
      for (std::size_t j = 0; j < C; ++j) mean += x(i, j);
      mean /= double(C);
      for (std::size_t j = 0; j < C; ++j) var += (x(i, j) - mean) * (x(i, j) - mean);
      for (std::size_t j = 0; j < C; ++j) ms += x(i, j) * x(i, j);
      const double rs = 1 / std::sqrt(var / double(C) + eps);
      const double rms = 1 / std::sqrt(ms / double(C) + eps);
      for (std::size_t j = 0; j < C; ++j) {
        CHECK(y(i, j) ==
              doctest::Approx(gamma(j) * (x(i, j) - mean) * rs + beta(j)).epsilon(1e-12));
        CHECK(z(i, j) == doctest::Approx(gamma(j) * x(i, j) * rms).epsilon(1e-12));
      }
    }

    const auto lg = layernorm_backward<double, 2>(r, lc, gamma);
    expect_passed(check_gradients({{"dx", x.data(), lg.dx.data(), {rows, C}},
                                   {"dgamma", gamma.data(), lg.dgamma.data(), {C}},
                                   {"dbeta", beta.data(), lg.dbeta.data(), {C}}},
                                  [&] {
                                    LayerNormCache<double, 2> c;
                                    return dot(layernorm_forward<double, 2>(c, x, gamma, beta, eps),
                                               r);
                                  }));
    const auto rg = rmsnorm_backward<double, 2>(r, rc, gamma);
    expect_passed(check_gradients({{"dx", x.data(), rg.dx.data(), {rows, C}},
                                   {"dgamma", gamma.data(), rg.dgamma.data(), {C}}},
                                  [&] {
                                    RmsNormCache<double, 2> c;
                                    return dot(rmsnorm_forward<double, 2>(c, x, gamma, eps), r);
                                  }));

    // float (twice the lanes) against the double op
    const Tensor2<float> xf = xt::cast<float>(x), rf = xt::cast<float>(r);
    const Tensor1<float> gf = xt::cast<float>(gamma), bf = xt::cast<float>(beta);
    LayerNormCache<float, 2> lcf;
    const auto yf = layernorm_forward<float, 2>(lcf, xf, gf, bf, eps);
    const auto lgf = layernorm_backward<float, 2>(rf, lcf, gf);
    CHECK(test::rel_error(yf, y) < 1e-6);
    CHECK(test::rel_error(lgf.dx, lg.dx) < 1e-5);
    CHECK(test::rel_error(lgf.dgamma, lg.dgamma) < 1e-5);
    CHECK(test::rel_error(lgf.dbeta, lg.dbeta) < 1e-6);
    RmsNormCache<float, 2> rcf;
    const auto zf = rmsnorm_forward<float, 2>(rcf, xf, gf, eps);
    const auto rgf = rmsnorm_backward<float, 2>(rf, rcf, gf);
    CHECK(test::rel_error(zf, z) < 1e-6);
    CHECK(test::rel_error(rgf.dx, rg.dx) < 1e-5);
    CHECK(test::rel_error(rgf.dgamma, rg.dgamma) < 1e-5);
  }
}

TEST_CASE("layernorm output rows have mean 0 and variance 1 before the affine, rmsnorm RMS 1") {
  Rng rng(14);
  const Tensor2<double> x = randn<double, 2>({4, 32}, rng, 3.0) + 5.0;
  const Tensor1<double> ones = xt::ones<double>({32}), zeros = xt::zeros<double>({32});
  LayerNormCache<double, 2> lc;
  const auto y = layernorm_forward<double, 2>(lc, x, ones, zeros);
  RmsNormCache<double, 2> rc;
  const auto z = rmsnorm_forward<double, 2>(rc, x, ones);
  for (std::size_t i = 0; i < 4; ++i) {
    double mean = 0, var = 0, ms = 0;
    for (std::size_t j = 0; j < 32; ++j) mean += y(i, j) / 32;
    for (std::size_t j = 0; j < 32; ++j) var += (y(i, j) - mean) * (y(i, j) - mean) / 32;
    for (std::size_t j = 0; j < 32; ++j) ms += z(i, j) * z(i, j) / 32;
    CHECK(std::abs(mean) < 1e-12);
    CHECK(var == doctest::Approx(1.0).epsilon(1e-5));  // eps inside the root
    CHECK(ms == doctest::Approx(1.0).epsilon(1e-5));
  }
  const Tensor1<double> wrong = xt::ones<double>({31});
  CHECK_THROWS_AS((layernorm_forward<double, 2>(lc, x, wrong, wrong)), ShapeError);
  CHECK_THROWS_AS((rmsnorm_forward<double, 2>(rc, x, wrong)), ShapeError);
}

TEST_CASE("gelu (tanh and exact) and relu gradcheck, and the gelu forms differ by < 1e-3") {
  Rng rng(15);
  auto x = randn<double, 3>({2, 3, 7}, rng, 2.0);
  const auto r = randn<double, 3>({2, 3, 7}, rng);
  for (auto a : {GeluApproximation::tanh, GeluApproximation::exact}) {
    const auto loss = [&] {
      GeluCache<double, 3> c;
      return dot(gelu_forward<double, 3>(c, x, a), r);
    };
    GeluCache<double, 3> cache;
    gelu_forward<double, 3>(cache, x, a);
    const auto dx = gelu_backward<double, 3>(r, cache);
    expect_passed(check_gradients({{"dx", x.data(), dx.data(), {2, 3, 7}}}, loss));
  }
  GeluCache<double, 3> ct, ce;
  CHECK(xt::amax(xt::abs(gelu_forward<double, 3>(ct, x, GeluApproximation::tanh) -
                         gelu_forward<double, 3>(ce, x, GeluApproximation::exact)))() < 1e-3);
  const auto loss = [&] {
    ReluCache<double, 3> c;
    return dot(relu_forward<double, 3>(c, x), r);
  };
  ReluCache<double, 3> cache;
  relu_forward<double, 3>(cache, x);
  const auto dx = relu_backward<double, 3>(r, cache);
  expect_passed(check_gradients({{"dx", x.data(), dx.data(), {2, 3, 7}}}, loss));
}

TEST_CASE("relu_squared: max(x, 0)² against the formula, gradcheck, and bad input named") {
  Rng rng(16);
  auto x = randn<double, 3>({2, 3, 7}, rng, 2.0);
  x(0, 0, 0) = 0.0;  // the kink: y = 0, dx = 0
  const auto r = randn<double, 3>({2, 3, 7}, rng);
  ReluCache<double, 3> cache;
  const auto y = relu_squared_forward<double, 3>(cache, x);
  const auto dx = relu_squared_backward<double, 3>(r, cache);
  std::size_t positive = 0;
  for (std::size_t i = 0; i < x.size(); ++i) {
    const double v = x.data()[i];
    CHECK(y.data()[i] == (v > 0 ? v * v : 0.0));
    CHECK(dx.data()[i] == (v > 0 ? 2 * v * r.data()[i] : 0.0));
    positive += v > 0 ? 1 : 0;
  }
  CHECK(positive > 0);
  CHECK(positive < x.size());
  // Central differences away from the kink (a random draw lands on 0 with probability 0).
  x(0, 0, 0) = 0.5;
  const auto loss = [&] {
    ReluCache<double, 3> c;
    return dot(relu_squared_forward<double, 3>(c, x), r);
  };
  relu_squared_forward<double, 3>(cache, x);
  const auto dx2 = relu_squared_backward<double, 3>(r, cache);
  expect_passed(check_gradients({{"dx", x.data(), dx2.data(), {2, 3, 7}}}, loss));
  ReluCache<double, 3> empty;
  CHECK_THROWS_WITH_AS(((void)relu_squared_backward<double, 3>(r, empty)),
                       "relu_squared_backward: the cache is empty: call relu_squared_forward first",
                       std::logic_error);
  Tensor3<double> wrong({2, 3, 6});
  wrong.fill(0.0);
  CHECK_THROWS_AS(((void)relu_squared_backward<double, 3>(wrong, cache)), ShapeError);
}

TEST_CASE("swiglu: silu(a)·b against the formula, gradcheck, the tails, and bad input named") {
  Rng rng(17);
  auto h = randn<double, 3>({2, 3, 8}, rng, 3.0);  // (…, 2F) = [a | b], F = 4
  const auto r = randn<double, 3>({2, 3, 4}, rng);
  SwigluCache<double, 3> cache;
  const auto y = swiglu_forward<double, 3>(cache, h);
  REQUIRE(y.shape()[2] == 4);
  for (std::size_t b = 0; b < 2; ++b)
    for (std::size_t t = 0; t < 3; ++t)
      for (std::size_t c = 0; c < 4; ++c) {
        const double a = h(b, t, c), u = h(b, t, 4 + c);
        CHECK(y(b, t, c) == doctest::Approx(a / (1 + std::exp(-a)) * u).epsilon(1e-14));
      }
  const auto loss = [&] {
    SwigluCache<double, 3> c;
    return dot(swiglu_forward<double, 3>(c, h), r);
  };
  const auto dh = swiglu_backward<double, 3>(r, cache);
  REQUIRE(dh.shape() == h.shape());
  expect_passed(check_gradients({{"dh", h.data(), dh.data(), {2, 3, 8}}}, loss));
  // Far tails: finite, silu(-1000) = 0 with slope 0, silu(1000) = 1000 with slope 1.
  Tensor2<double> tails = {{-1000.0, 1000.0, 2.0, 3.0}};
  SwigluCache<double, 2> tc;
  const auto ty = swiglu_forward<double, 2>(tc, tails);
  CHECK(ty(0, 0) == 0.0);
  CHECK(ty(0, 1) == 3000.0);
  const auto tdh = swiglu_backward<double, 2>(Tensor2<double>{{1.0, 1.0}}, tc);
  CHECK(tdh(0, 0) == 0.0);  // gate slope 0
  CHECK(tdh(0, 1) == 3.0);  // gate slope 1, times b
  CHECK(tdh(0, 2) == 0.0);  // silu(-1000)
  CHECK(tdh(0, 3) == 1000.0);
  SwigluCache<double, 3> empty;
  CHECK_THROWS_WITH_AS(((void)swiglu_backward<double, 3>(r, empty)),
                       "swiglu_backward: the cache is empty: call swiglu_forward first",
                       std::logic_error);
  CHECK_THROWS_AS(((void)swiglu_backward<double, 3>(h, cache)), ShapeError);
  Tensor3<double> odd({2, 3, 7});
  odd.fill(0.0);
  CHECK_THROWS_WITH_AS(((void)swiglu_forward<double, 3>(cache, odd)),
                       doctest::Contains("(the last extent even and nonzero"), ShapeError);
}

TEST_CASE("softcap: c·tanh(x/c) bounded by c, slope 1 at 0, gradcheck, and bad input named") {
  Rng rng(17);
  auto x = randn<double, 3>({2, 3, 7}, rng, 20.0);  // many saturate at c = 5
  x(0, 0, 0) = 0.0;
  x(0, 0, 1) = 1e-4;
  const auto r = randn<double, 3>({2, 3, 7}, rng);
  const double cap = 5.0;
  SoftcapCache<double, 3> cache;
  const auto y = softcap_forward<double, 3>(cache, x, cap);
  const auto dx = softcap_backward<double, 3>(r, cache);
  std::size_t saturated = 0;
  for (std::size_t i = 0; i < x.size(); ++i) {
    const double v = x.data()[i], t = std::tanh(v / cap);
    CHECK(y.data()[i] == doctest::Approx(cap * t).epsilon(1e-15));
    CHECK(std::abs(y.data()[i]) <= cap);
    CHECK(dx.data()[i] == doctest::Approx(r.data()[i] * (1 - t * t)).epsilon(1e-12));
    saturated += std::abs(v) > 3 * cap ? 1 : 0;
  }
  CHECK(saturated > 0);
  CHECK(y(0, 0, 0) == 0.0);
  CHECK(y(0, 0, 1) == doctest::Approx(1e-4).epsilon(1e-9));  // the identity near 0
  CHECK(dx(0, 0, 0) == r(0, 0, 0));                          // slope exactly 1 at 0
  const auto loss = [&] {
    SoftcapCache<double, 3> c;
    return dot(softcap_forward<double, 3>(c, x, cap), r);
  };
  expect_passed(check_gradients({{"dx", x.data(), dx.data(), {2, 3, 7}}}, loss));
  for (const double bad : {0.0, -1.0, std::nan(""), double(INFINITY)}) {
    CAPTURE(bad);
    SoftcapCache<double, 3> c;
    CHECK_THROWS_WITH_AS(((void)softcap_forward<double, 3>(c, x, bad)),
                         doctest::Contains("softcap_forward: cap expected a finite cap > 0"),
                         std::invalid_argument);
  }
  SoftcapCache<double, 3> empty;
  CHECK_THROWS_WITH_AS(((void)softcap_backward<double, 3>(r, empty)),
                       "softcap_backward: the cache is empty: call softcap_forward first",
                       std::logic_error);
  Tensor3<double> wrong({2, 3, 6});
  wrong.fill(0.0);
  CHECK_THROWS_AS(((void)softcap_backward<double, 3>(wrong, cache)), ShapeError);
}

TEST_CASE("gelu in float matches the double formulas: exact (own erf) and tanh, forward and dx") {
  // Reference: the double op. Bound per value: |float − double| <= 1e-6 (1 + |x|). The float erf
  // is within 3.4e-7 of erf, so y = ½ x (1 + erf(x/√2)) is within 1.7e-7 |x| plus rounding, and
  // dx within about 1.7e-7 (1 + |x|) (the simulated worst cases are 7e-7 at x ≈ −5.6 with FMA, 9e-7
  // without). Two rows: every float on a 1/1024 grid of [−12, 12] plus ±0, the erf clamp at
  // x = ±4√2 and beyond (mostly the vector body), and 7 values, fewer than one SIMD batch, so that
  // all of them take the scalar tail.
  std::vector<float> grid;
  for (double v = -12.0; v <= 12.0; v += 1.0 / 1024) grid.push_back(static_cast<float>(v));
  for (float v : {0.0f, -0.0f, 5.656854f, -5.656854f, 40.0f, -40.0f, 1e-30f, -1e-30f}) {
    grid.push_back(v);
  }
  const std::vector<float> tail = {-6.0f, -5.656854f, -2.5f, -0.3f, 0.7f, 3.1f, 9.0f};
  const std::vector<float>* rows[] = {&grid, &tail};
  for (const std::vector<float>* row : rows) {
    const std::size_t n = row->size();
    CAPTURE(n);
    Tensor2<float> xf({1, n}), dyf({1, n});
    Tensor2<double> xd({1, n}), dyd({1, n});
    for (std::size_t i = 0; i < n; ++i) {
      xf(0, i) = (*row)[i];
      xd(0, i) = (*row)[i];
      dyf(0, i) = dyd(0, i) = static_cast<float>(1.0 + 0.25 * std::sin(double(i)));
    }
    for (auto a : {GeluApproximation::exact, GeluApproximation::tanh}) {
      CAPTURE(int(a));
      GeluCache<float, 2> cf;
      GeluCache<double, 2> cd;
      const Tensor2<float> yf = gelu_forward<float, 2>(cf, xf, a);
      const Tensor2<double> yd = gelu_forward<double, 2>(cd, xd, a);
      const Tensor2<float> dxf = gelu_backward<float, 2>(dyf, cf);
      const Tensor2<double> dxd = gelu_backward<double, 2>(dyd, cd);
      double worst_y = 0, worst_dx = 0;
      for (std::size_t i = 0; i < n; ++i) {
        REQUIRE(std::isfinite(yf(0, i)));
        REQUIRE(std::isfinite(dxf(0, i)));
        REQUIRE(std::isfinite(yd(0, i)));
        REQUIRE(std::isfinite(dxd(0, i)));
        const double scale = 1 + std::abs(xd(0, i));
        worst_y = std::max(worst_y, std::abs(yf(0, i) - yd(0, i)) / scale);
        worst_dx = std::max(worst_dx, std::abs(dxf(0, i) - dxd(0, i)) / scale);
      }
      CHECK(worst_y < 1e-6);
      CHECK(worst_dx < 1e-6);
      if (a == GeluApproximation::exact) {
        // The float erf itself, read back from y = x Φ(x): erf(x/√2) = 2y/x − 1, for |x| >= 0.25.
        // Within 6e-7 of erf: its own 3.4e-7 plus at most ~1.8e-7 of rounding in y (a rational
        // off in the 6th digit of one coefficient is 1.4e-6 off).
        double worst_erf = 0;
        for (std::size_t i = 0; i < n; ++i) {
          const double x = xd(0, i);
          if (std::abs(x) < 0.25) continue;
          const double erf_float = 2.0 * double(yf(0, i)) / x - 1.0;
          worst_erf = std::max(worst_erf, std::abs(erf_float - std::erf(x / std::sqrt(2.0))));
        }
        CHECK(worst_erf < 6e-7);
      }
    }
  }
}

TEST_CASE("cross-entropy gradcheck with ignored positions, rank 2 and 3") {
  Rng rng(16);
  auto logits = randn<double, 3>({2, 4, 5}, rng, 2.0);
  const TokenIds targets = {{1, kIgnoreIndex, 4, 0}, {2, 2, kIgnoreIndex, 3}};
  const auto loss = [&] {
    CrossEntropyCache<double, 3> c;
    return cross_entropy_forward<double, 3>(c, logits, targets);
  };
  const auto result = softmax_cross_entropy<double, 3>(logits, targets);
  CHECK(result.labelled == 6);
  CHECK(result.loss == doctest::Approx(loss()).epsilon(1e-15));
  for (std::size_t v = 0; v < 5; ++v) CHECK(result.dlogits(0, 1, v) == 0.0);  // ignored
  expect_passed(
      check_gradients({{"dlogits", logits.data(), result.dlogits.data(), {2, 4, 5}}}, loss));

  auto logits2 = randn<double, 2>({3, 4}, rng);
  const xt::xtensor<int, 1> targets2 = {3, 0, kIgnoreIndex};
  const auto loss2 = [&] {
    CrossEntropyCache<double, 2> c;
    return cross_entropy_forward<double, 2>(c, logits2, targets2);
  };
  const auto r2 = softmax_cross_entropy<double, 2>(logits2, targets2);
  expect_passed(check_gradients({{"dlogits", logits2.data(), r2.dlogits.data(), {3, 4}}}, loss2));
}

TEST_CASE("cross-entropy with z-loss: the definition, gradcheck with ignored positions, bad z") {
  Rng rng(18);
  // Logits shifted by 3 so that log Z is far from 0 and the z-loss term carries weight.
  Tensor3<double> logits = randn<double, 3>({2, 4, 5}, rng, 2.0) + 3.0;
  const TokenIds targets = {{1, kIgnoreIndex, 4, 0}, {2, 2, kIgnoreIndex, kIgnoreIndex}};
  const double z = 0.05;
  const auto loss = [&] {
    CrossEntropyCache<double, 3> c;
    return cross_entropy_forward<double, 3>(c, logits, targets, kIgnoreIndex, z);
  };
  const auto result = softmax_cross_entropy<double, 3>(logits, targets, kIgnoreIndex, z);
  const auto plain = softmax_cross_entropy<double, 3>(logits, targets);
  // The definition, written out: CE as without z-loss, plus z · mean over labelled rows of log Z².
  double sum_log_z2 = 0;
  for (std::size_t b = 0; b < 2; ++b)
    for (std::size_t t = 0; t < 4; ++t) {
      if (targets(b, t) == kIgnoreIndex) continue;
      double sum = 0;
      for (std::size_t v = 0; v < 5; ++v) sum += std::exp(logits(b, t, v));
      sum_log_z2 += std::log(sum) * std::log(sum);
    }
  CHECK(result.labelled == 5);
  CHECK(result.cross_entropy == doctest::Approx(plain.loss).epsilon(1e-15));
  CHECK(result.z_term == doctest::Approx(z * sum_log_z2 / 5).epsilon(1e-13));
  CHECK(result.z_term > 0.1 * result.cross_entropy);  // a term that the gradient check can see
  CHECK(result.loss == doctest::Approx(result.cross_entropy + result.z_term).epsilon(1e-15));
  CHECK(result.loss == doctest::Approx(loss()).epsilon(1e-15));
  for (std::size_t v = 0; v < 5; ++v) {
    CHECK(result.dlogits(0, 1, v) == 0.0);  // ignored positions: no gradient
    CHECK(result.dlogits(1, 3, v) == 0.0);
  }
  CHECK(test::rel_error(result.dlogits, plain.dlogits) > 1e-2);  // the z-loss moves the gradient
  expect_passed(
      check_gradients({{"dlogits", logits.data(), result.dlogits.data(), {2, 4, 5}}}, loss));

  // The backward's dloss scales it; rank 2 too.
  CrossEntropyCache<double, 3> cache;
  cross_entropy_forward<double, 3>(cache, logits, targets, kIgnoreIndex, z);
  CHECK(test::rel_error(cross_entropy_backward<double, 3>(cache, 0.25),
                        Tensor3<double>(0.25 * result.dlogits)) < 1e-15);
  auto logits2 = randn<double, 2>({3, 4}, rng, 3.0);
  const xt::xtensor<int, 1> targets2 = {3, kIgnoreIndex, 1};
  const auto loss2 = [&] {
    CrossEntropyCache<double, 2> c;
    return cross_entropy_forward<double, 2>(c, logits2, targets2, kIgnoreIndex, 1.0);
  };
  const auto r2 = softmax_cross_entropy<double, 2>(logits2, targets2, kIgnoreIndex, 1.0);
  expect_passed(check_gradients({{"dlogits", logits2.data(), r2.dlogits.data(), {3, 4}}}, loss2));

  // No labelled position: 0 and 0, never NaN.
  const TokenIds none = xt::ones<int>({2, 4}) * kIgnoreIndex;
  const auto empty = softmax_cross_entropy<double, 3>(logits, none, kIgnoreIndex, z);
  CHECK(empty.loss == 0.0);
  CHECK(empty.z_term == 0.0);
  CHECK(xt::all(xt::equal(empty.dlogits, 0.0)));

  for (const double bad : {-1e-4, std::nan(""), std::numeric_limits<double>::infinity()}) {
    CAPTURE(bad);
    try {
      softmax_cross_entropy<double, 3>(logits, targets, kIgnoreIndex, bad);
      FAIL("no exception");
    } catch (const std::invalid_argument& e) {
      CHECK(std::string(e.what()).find("cross_entropy_forward: z_loss expected a finite number "
                                       ">= 0, got") != std::string::npos);
    }
  }
}

TEST_CASE("cross-entropy edge cases: no labelled position, huge logits, bad targets") {
  Rng rng(17);
  const auto logits = randn<double, 3>({2, 3, 4}, rng);
  TokenIds none = xt::ones<int>({2, 3}) * kIgnoreIndex;
  const auto empty = softmax_cross_entropy<double, 3>(logits, none);
  CHECK(empty.loss == 0.0);
  CHECK(empty.labelled == 0);
  CHECK(xt::all(xt::equal(empty.dlogits, 0.0)));

  // Logits of ±1e4 in float: still finite, the confident correct row has loss ~0.
  Tensor3<float> big = {{{1e4f, -1e4f, 0.f}, {-1e4f, 1e4f, 0.f}}};
  const TokenIds t = {{0, 0}};
  const auto res = softmax_cross_entropy<float, 3>(big, t);
  CHECK(std::isfinite(res.loss));
  CHECK(res.loss == doctest::Approx(1e4).epsilon(1e-6));  // (0 + 2e4) / 2
  CHECK(test::all_finite(res.dlogits));

  TokenIds bad = {{0, 4, 1}, {1, 1, 1}};
  CHECK_THROWS_AS((softmax_cross_entropy<double, 3>(logits, bad)), std::invalid_argument);
  const TokenIds wrong_shape = xt::zeros<int>({2, 2});
  CHECK_THROWS_AS((softmax_cross_entropy<double, 3>(logits, wrong_shape)), ShapeError);
  CHECK_THROWS_AS((cross_entropy_backward<double, 3>(CrossEntropyCache<double, 3>{})),
                  std::logic_error);
}

TEST_CASE("linear with 2 threads: same numbers as 1 thread, and deterministic") {
  Rng rng(18);
  const auto x = randn<double, 3>({3, 100, 5}, rng);  // 300 rows: split into 2 chunks
  const auto w = randn<double, 2>({5, 7}, rng);
  const auto b = randn<double, 1>({7}, rng);
  const auto dy = randn<double, 3>({3, 100, 7}, rng);
  const auto run = [&] {
    LinearCache<double, 3> cache;
    auto y = linear_forward<double, 3>(cache, x, w, &b);
    return std::pair{y, linear_backward<double, 3>(dy, cache, w, true)};
  };
  const auto [y1, g1] = run();
  set_num_threads(2);
  const auto [y2, g2] = run();
  const auto [y3, g3] = run();
  set_num_threads(1);
  CHECK(test::rel_error(y1, y2) < 1e-15);
  CHECK(test::rel_error(g1.dx, g2.dx) < 1e-15);
  CHECK(test::rel_error(g1.dw, g2.dw) < 1e-14);  // the row sum is split in two partials
  CHECK(test::rel_error(g1.db, g2.db) == 0);
  CHECK(y2 == y3);  // bit-identical for a fixed thread count
  CHECK(g2.dx == g3.dx);
  CHECK(g2.dw == g3.dw);
}
