// Attention-health metrics on hand-built attention matrices, the closed-form Jacobian norm
// against the explicit Jacobian, and the LR-sensitivity definition on hand-computed losses.
#include <doctest/doctest.h>

#include <cmath>
#include <limits>

#include "attnlab/app/metrics.hpp"
#include "attnlab/app/summary.hpp"
#include "attnlab/ops/softmax.hpp"
#include "attnlab/random.hpp"

using namespace attnlab;
using namespace attnlab::app;

TEST_CASE("attention_health on hand-built weights: entropy, saturation, Jacobian, max logit") {
  // (B=1, H=2, Tq=2, Tk=3)
  Tensor4<double> p = Tensor4<double>::from_shape({1, 2, 2, 3});
  const double third = 1.0 / 3.0;
  const double rows[4][3] = {{1, 0, 0}, {0.5, 0.5, 0}, {third, third, third}, {0, 0, 0}};
  for (int r = 0; r < 4; ++r)
    for (int j = 0; j < 3; ++j) p.data()[r * 3 + j] = rows[r][j];
  Tensor4<double> s = Tensor4<double>::from_shape({1, 2, 2, 3});
  s.fill(1.0);
  s(0, 0, 0, 1) = -7.5;
  s(0, 0, 1, 2) = -std::numeric_limits<double>::infinity();  // hidden: ignored
  s(0, 1, 0, 0) = 2.25;
  s(0, 1, 1, 0) = -std::numeric_limits<double>::infinity();

  const auto h = attention_health(p, s);
  REQUIRE(h.size() == 2);
  // Head 0: a one-hot row (H = 0, J = 0) and a two-way split (H = ln 2, ‖J‖ = 1/2).
  CHECK(h[0].entropy == doctest::Approx(std::log(2.0) / 2));
  CHECK(h[0].max_weight == doctest::Approx(0.75));
  CHECK(h[0].saturated_fraction == doctest::Approx(0.5));
  CHECK(h[0].jacobian_norm == doctest::Approx(0.25));
  CHECK(h[0].max_abs_logit == doctest::Approx(7.5));
  // Head 1: a uniform row over 3 keys (‖J‖² = 1/3 − 2/9 + 1/9 = 2/9) and a row that sees no key,
  // which is skipped rather than counted.
  CHECK(h[1].entropy == doctest::Approx(std::log(3.0)));
  CHECK(h[1].max_weight == doctest::Approx(third));
  CHECK(h[1].saturated_fraction == 0.0);
  CHECK(h[1].jacobian_norm == doctest::Approx(std::sqrt(2.0 / 9.0)));
  CHECK(h[1].max_abs_logit == doctest::Approx(2.25));

  // Without scores the max logit is NaN, the rest unchanged.
  const auto h2 = attention_health(p, Tensor4<double>());
  CHECK(std::isnan(h2[0].max_abs_logit));
  CHECK(h2[1].entropy == doctest::Approx(std::log(3.0)));
  // A score tensor of the wrong shape is a ShapeError.
  CHECK_THROWS_AS(attention_health(p, Tensor4<double>::from_shape({1, 2, 3, 3})), ShapeError);
}

TEST_CASE("saturated fraction uses the 0.99 threshold strictly") {
  Tensor4<float> p = Tensor4<float>::from_shape({2, 1, 1, 2});
  p(0, 0, 0, 0) = 0.995f;
  p(0, 0, 0, 1) = 0.005f;
  p(1, 0, 0, 0) = 0.985f;
  p(1, 0, 0, 1) = 0.015f;
  const auto h = attention_health(p, Tensor4<float>());
  CHECK(h[0].saturated_fraction == doctest::Approx(0.5));
}

TEST_CASE("closed-form softmax Jacobian norm equals the Frobenius norm of the explicit Jacobian") {
  Rng rng(3);
  for (std::size_t n : {1u, 2u, 7u, 64u}) {
    const auto logits = randn<double, 1>({n}, rng, 3.0);
    const Tensor1<double> p = softmax_forward(logits);
    const auto j = softmax_jacobian(p);
    double fro = 0;
    for (double x : j) fro += x * x;
    CHECK(softmax_jacobian_norm(p.data(), n) == doctest::Approx(std::sqrt(fro)).epsilon(1e-12));
  }
}

TEST_CASE("correct_key_mass averages the query row's weight on the given key") {
  Tensor4<double> p = Tensor4<double>::from_shape({2, 1, 3, 3});
  p.fill(0.0);
  p(0, 0, 2, 1) = 0.8;
  p(1, 0, 2, 0) = 0.4;
  const auto m = correct_key_mass(p, 2, {1, 0});
  CHECK(m[0] == doctest::Approx(0.6));
  CHECK(correct_key_mass(p, 2, {1, -1})[0] == doctest::Approx(0.8));  // -1 skipped
  CHECK_THROWS_AS(correct_key_mass(p, 3, {1, 0}), std::invalid_argument);
}

TEST_CASE("LR sensitivity follows Wortsman et al.: mean of min(loss, init) minus the best") {
  // losses 1, 2, 5 (clamped to init 4), NaN (diverged: counts as init 4); best = 1.
  // ((1-1) + (2-1) + (4-1) + (4-1)) / 4 = 7/4
  CHECK(lr_sensitivity({1, 2, 5, std::nan("")}, 4) == doctest::Approx(1.75));
  // A mode that fails everywhere reads ~0: the caveat the summary states.
  CHECK(lr_sensitivity({4.1, 4.2, 4.0}, 4) == doctest::Approx(0.0));
  RunRecord r;
  r.init_eval_loss = 4;
  r.final_eval_loss = 3.7;
  CHECK(run_failed(r));
  r.final_eval_loss = 3.5;
  CHECK_FALSE(run_failed(r));
  r.diverged = true;
  CHECK(run_failed(r));
}
