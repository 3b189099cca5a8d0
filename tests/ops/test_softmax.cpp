// softmax_forward / softmax_backward: stability, the Jacobian, gradient check, golden values.
#include <doctest/doctest.h>

#include <cmath>
#include <limits>

#include <nlohmann/json.hpp>
#include <xtensor/xbuilder.hpp>
#include <xtensor/xview.hpp>

#include "attnlab/gradcheck.hpp"
#include "attnlab/ops/softmax.hpp"
#include "attnlab/random.hpp"
#include "helpers.hpp"

using namespace attnlab;

TEST_CASE("softmax: rows sum to 1 and are positive") {
  Rng rng(1);
  const auto s = randn<double, 3>({2, 3, 17}, rng, 3.0);
  const auto p = softmax_forward(s);
  for (std::size_t r = 0; r < 6; ++r) {
    double sum = 0;
    for (std::size_t c = 0; c < 17; ++c) {
      const double x = p.data()[r * 17 + c];
      CHECK(x > 0);
      sum += x;
    }
    CHECK(sum == doctest::Approx(1.0).epsilon(1e-14));
  }
}

TEST_CASE("softmax_backward equals the explicit Jacobian applied to dp") {
  Rng rng(2);
  const auto s = randn<double, 2>({5, 9}, rng);
  const auto dp = randn<double, 2>({5, 9}, rng);
  const auto p = softmax_forward(s);
  const auto ds = softmax_backward(dp, p);
  for (std::size_t r = 0; r < 5; ++r) {
    Tensor1<double> prow = xt::view(p, r, xt::all());
    const auto jac = softmax_jacobian(prow);
    // The Jacobian is symmetric, so Jᵀ dp = J dp.
    for (std::size_t i = 0; i < 9; ++i) {
      double expected = 0;
      for (std::size_t j = 0; j < 9; ++j) expected += jac(i, j) * dp(r, j);
      CHECK(ds(r, i) == doctest::Approx(expected).epsilon(1e-13));
    }
  }
}

TEST_CASE("softmax_jacobian is diag(p) - p p^T: symmetric, rows sum to 0") {
  Tensor1<double> p = {0.5, 0.3, 0.2};
  const auto jac = softmax_jacobian(p);
  CHECK(jac(0, 0) == doctest::Approx(0.25));
  CHECK(jac(0, 1) == doctest::Approx(-0.15));
  CHECK(jac(1, 0) == doctest::Approx(-0.15));
  for (std::size_t i = 0; i < 3; ++i) {
    CHECK(jac(i, 0) + jac(i, 1) + jac(i, 2) == doctest::Approx(0.0).epsilon(1e-15));
  }
}

TEST_CASE_TEMPLATE("softmax: logits of +-1e4 give finite, correct results", T, float, double) {
  // Without the max subtraction exp(1e4) overflows to inf and the row becomes NaN.
  Tensor2<T> s = {{T(1e4), T(-1e4), T(0)}, {T(1e4), T(1e4 - 1), T(-1e4)}};
  const auto p = softmax_forward(s);
  CHECK(test::all_finite(p));
  CHECK(p(0, 0) == doctest::Approx(1.0));
  CHECK(p(0, 1) == 0);
  CHECK(p(0, 2) == 0);
  const double e = std::exp(-1.0);
  CHECK(p(1, 0) == doctest::Approx(1 / (1 + e)).epsilon(1e-6));
  CHECK(p(1, 1) == doctest::Approx(e / (1 + e)).epsilon(1e-6));
  Tensor2<T> dp = {{T(1), T(2), T(3)}, {T(-1), T(0.5), T(4)}};
  CHECK(test::all_finite(softmax_backward(dp, p)));
}

TEST_CASE("softmax: -inf entries are excluded, an all -inf row is zero, a NaN propagates") {
  const double inf = std::numeric_limits<double>::infinity();
  Tensor2<double> s = {{0.0, -inf, 0.0}, {-inf, -inf, -inf}, {1.0, std::nan(""), 0.0}};
  const auto p = softmax_forward(s);
  CHECK(p(0, 0) == doctest::Approx(0.5));
  CHECK(p(0, 1) == 0);
  CHECK(p(1, 0) == 0);
  CHECK(p(1, 1) == 0);
  CHECK(p(1, 2) == 0);
  CHECK(std::isnan(p(2, 1)));  // divergence must be visible, not hidden
  Tensor2<double> dp = {{1, 2, 3}, {1, 2, 3}, {0, 0, 0}};
  const auto ds = softmax_backward(dp, p);
  CHECK(ds(1, 0) == 0);
  CHECK(ds(1, 2) == 0);
}

TEST_CASE("softmax gradcheck (double, central differences)") {
  Rng rng(3);
  auto s = randn<double, 2>({4, 6}, rng, 2.0);
  const auto r = randn<double, 2>({4, 6}, rng);
  const auto loss = [&] {
    const auto p = softmax_forward(s);
    double l = 0;
    for (std::size_t i = 0; i < p.size(); ++i) l += p.data()[i] * r.data()[i];
    return l;
  };
  const auto ds = softmax_backward(Tensor2<double>(r), softmax_forward(s));
  const auto report = check_gradients({{"s", s.data(), ds.data(), {4, 6}}}, loss);
  INFO(report.table());
  CHECK(report.max_rel_error() < 1e-8);
}

TEST_CASE("softmax_backward rejects mismatched shapes") {
  Tensor2<double> p = xt::zeros<double>({2, 3});
  Tensor2<double> dp = xt::zeros<double>({3, 2});
  CHECK_THROWS_WITH_AS(softmax_backward(dp, p),
                       doctest::Contains("softmax_backward: dp expected (2, 3), got (3, 2)"),
                       ShapeError);
}
