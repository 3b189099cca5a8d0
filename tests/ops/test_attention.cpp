// sdpa_forward / sdpa_backward: gradient checks over the option grid, the seed's numbers, the
// statistics behind the √d_k argument, float vs double, and bad input. Every test that runs the op
// runs on both CPU paths (TEST_CASE_TEMPLATE over ReferencePath and FusedPath,
// tests/support/sdpa_paths.hpp).
#include <doctest/doctest.h>

#include <cmath>
#include <cstdint>
#include <limits>

#include <xtensor/xarray.hpp>
#include <xtensor/xbuilder.hpp>

#include "attnlab/gradcheck.hpp"
#include "attnlab/ops/attention.hpp"
#include "attnlab/random.hpp"
#include "helpers.hpp"
#include "sdpa_paths.hpp"

using namespace attnlab;
using attnlab::test::FusedPath;
using attnlab::test::ReferencePath;
using attnlab::test::weights_of;
using attnlab::test::with_path;

namespace {

// Gradient tolerance. The error measure is the checker's: ‖g − ĝ‖₂ / max(‖g‖₂, ‖ĝ‖₂) per tensor,
// with ĝ from central differences (eps = 1e-6) in double precision.
constexpr double kGradTol = 1e-7;

struct Shape4 {
  std::size_t B, H, Tq, Tk, D, Dv;
};

double weighted_sum(const Tensor4<double>& o, const Tensor4<double>& r) {
  double l = 0;
  for (std::size_t i = 0; i < o.size(); ++i) l += o.data()[i] * r.data()[i];
  return l;
}

// Checks dq, dk, dv of L = Σ r ⊙ sdpa(q, k, v), and the per-head scale gradient, by central
// differences. Returns the report so callers can add assertions.
GradcheckReport gradcheck_sdpa(const Shape4& s, SdpaOptions options, const KeyMask* mask,
                               std::uint64_t seed = 7) {
  Rng rng(seed);
  auto q = randn<double, 4>({s.B, s.H, s.Tq, s.D}, rng);
  auto k = randn<double, 4>({s.B, s.H, s.Tk, s.D}, rng);
  auto v = randn<double, 4>({s.B, s.H, s.Tk, s.Dv}, rng);
  const auto r = randn<double, 4>({s.B, s.H, s.Tq, s.Dv}, rng);
  SdpaCache<double> cache;
  const auto loss = [&] {
    SdpaCache<double> c;
    return weighted_sum(sdpa_forward(c, q, k, v, options, mask), r);
  };
  sdpa_forward(cache, q, k, v, options, mask);
  const auto g = sdpa_backward(r, cache, q, k, v);
  auto report = check_gradients({{"dq", q.data(), g.dq.data(), {s.B, s.H, s.Tq, s.D}},
                                 {"dk", k.data(), g.dk.data(), {s.B, s.H, s.Tk, s.D}},
                                 {"dv", v.data(), g.dv.data(), {s.B, s.H, s.Tk, s.Dv}}},
                                loss);
  // The scale gradient: perturb a per-head scale that starts at the mode's value.
  options.head_scale.assign(s.H, resolve_scale(options, s.D));
  SdpaCache<double> scale_cache;
  sdpa_forward(scale_cache, q, k, v, options, mask);
  const auto gs = sdpa_backward(r, scale_cache, q, k, v);
  const auto scale_report =
      check_gradients({{"dscale", options.head_scale.data(), gs.dscale.data(), {s.H}}}, loss);
  report.results.push_back(scale_report.results.front());
  return report;
}

void expect_gradcheck(const Shape4& s, SdpaOptions options, SdpaPath path,
                      const KeyMask* mask = nullptr) {
  options = with_path(options, path);
  const auto report = gradcheck_sdpa(s, options, mask);
  INFO(report.table());
  CHECK(report.max_rel_error() <= kGradTol);
  // A check that compares zeros with zeros proves nothing: the gradients must be non-trivial.
  for (const auto& r : report.results) CHECK(r.analytic_norm > 1e-3);
}

}  // namespace

TEST_CASE_TEMPLATE("sdpa gradcheck: every scaling mode and an explicit scale", TestType,
                   ReferencePath, FusedPath) {
  const Shape4 s{2, 2, 5, 5, 4, 4};
  SdpaOptions options;
  SUBCASE("none") {
    options.scaling = Scaling::none;
  }
  SUBCASE("sqrt_dk") {
    options.scaling = Scaling::sqrt_dk;
  }
  SUBCASE("dk") {
    options.scaling = Scaling::dk;
  }
  SUBCASE("explicit scale 0.37") {
    options.scale = 0.37;
  }
  expect_gradcheck(s, options, TestType::value);
}

TEST_CASE_TEMPLATE("sdpa gradcheck: causal, Tq == Tk and Tq != Tk", TestType, ReferencePath,
                   FusedPath) {
  SdpaOptions options;
  options.causal = true;
  SUBCASE("Tq == Tk") {
    expect_gradcheck({2, 2, 6, 6, 4, 4}, options, TestType::value);
  }
  SUBCASE("Tq < Tk") {
    expect_gradcheck({1, 2, 3, 5, 4, 3}, options, TestType::value);
  }
  SUBCASE("Tq > Tk") {
    expect_gradcheck({1, 2, 6, 4, 4, 3}, options, TestType::value);
  }
}

TEST_CASE_TEMPLATE("sdpa gradcheck: key mask, including a fully masked row", TestType,
                   ReferencePath, FusedPath) {
  KeyMask mask = {{true, false, true, true, false}, {false, false, false, false, false}};
  SdpaOptions options;
  SUBCASE("mask") {}
  SUBCASE("mask and causal") {
    options.causal = true;
  }
  expect_gradcheck({2, 2, 4, 5, 3, 3}, options, TestType::value, &mask);
}

TEST_CASE_TEMPLATE("sdpa gradcheck: Tq != Tk and Dv != D", TestType, ReferencePath, FusedPath) {
  expect_gradcheck({2, 3, 3, 7, 5, 2}, SdpaOptions{}, TestType::value);
}

TEST_CASE_TEMPLATE("sdpa gradcheck: D = 1 and D = 256", TestType, ReferencePath, FusedPath) {
  SUBCASE("D = 1") {
    expect_gradcheck({2, 2, 4, 4, 1, 2}, SdpaOptions{}, TestType::value);
  }
  SUBCASE("D = 256") {
    expect_gradcheck({1, 1, 3, 4, 256, 2}, SdpaOptions{}, TestType::value);
  }
}

TEST_CASE_TEMPLATE("sdpa: a query row with no visible key gives zeros, never NaN", TestType,
                   ReferencePath, FusedPath) {
  Rng rng(11);
  const auto q = randn<double, 4>({2, 1, 3, 4}, rng);
  const auto k = randn<double, 4>({2, 1, 4, 4}, rng);
  const auto v = randn<double, 4>({2, 1, 4, 2}, rng);
  const auto dout = randn<double, 4>({2, 1, 3, 2}, rng);
  KeyMask mask = {{true, true, false, true}, {false, false, false, false}};
  SdpaCache<double> cache;
  const SdpaOptions options = with_path({}, TestType::value);
  const auto out = sdpa_forward(cache, q, k, v, options, &mask);
  const auto g = sdpa_backward(dout, cache, q, k, v);
  const auto p = weights_of(cache, q, k, options, &mask);
  CHECK(test::all_finite(out));
  CHECK(test::all_finite(g.dq));
  CHECK(test::all_finite(g.dk));
  CHECK(test::all_finite(g.dv));
  for (std::size_t i = 0; i < 3; ++i) {
    for (std::size_t j = 0; j < 4; ++j) CHECK(p(1, 0, i, j) == 0.0);
    for (std::size_t c = 0; c < 2; ++c) CHECK(out(1, 0, i, c) == 0.0);
    for (std::size_t c = 0; c < 4; ++c) CHECK(g.dq(1, 0, i, c) == 0.0);
  }
  for (std::size_t j = 0; j < 4; ++j) {
    for (std::size_t c = 0; c < 4; ++c) CHECK(g.dk(1, 0, j, c) == 0.0);
    CHECK(p(0, 0, 1, 2) == 0.0);  // a hidden key gets no weight
  }
  // The visible batch is a proper distribution.
  for (std::size_t i = 0; i < 3; ++i) {
    CHECK(p(0, 0, i, 0) + p(0, 0, i, 1) + p(0, 0, i, 3) == doctest::Approx(1.0).epsilon(1e-14));
  }
}

TEST_CASE_TEMPLATE("sdpa: a NaN query propagates to its output row, never hidden", TestType,
                   ReferencePath, FusedPath) {
  Rng rng(13);
  auto q = randn<double, 4>({1, 1, 4, 3}, rng);
  const auto k = randn<double, 4>({1, 1, 5, 3}, rng);
  const auto v = randn<double, 4>({1, 1, 5, 2}, rng);
  const double nan = std::numeric_limits<double>::quiet_NaN();
  for (std::size_t d = 0; d < 3; ++d) q(0, 0, 1, d) = nan;  // every score of row 1 is NaN
  q(0, 0, 2, 0) = nan;                                      // and every score of row 2
  SdpaOptions options = with_path({}, TestType::value);
  SUBCASE("no mask") {}
  SUBCASE("causal") {
    options.causal = true;
  }
  SdpaCache<double> cache;
  const auto out = sdpa_forward(cache, q, k, v, options);
  for (std::size_t c = 0; c < 2; ++c) {
    CHECK(std::isnan(out(0, 0, 1, c)));
    CHECK(std::isnan(out(0, 0, 2, c)));
    CHECK(std::isfinite(out(0, 0, 0, c)));
    CHECK(std::isfinite(out(0, 0, 3, c)));
  }
}

TEST_CASE_TEMPLATE("sdpa: causal weights are lower triangular (top-left aligned)", TestType,
                   ReferencePath, FusedPath) {
  Rng rng(12);
  const auto q = randn<double, 4>({1, 1, 3, 2}, rng);
  const auto k = randn<double, 4>({1, 1, 5, 2}, rng);
  const auto v = randn<double, 4>({1, 1, 5, 2}, rng);
  SdpaCache<double> cache;
  SdpaOptions options = with_path({}, TestType::value);
  options.causal = true;
  sdpa_forward(cache, q, k, v, options);
  const auto p = weights_of(cache, q, k, options);
  for (std::size_t i = 0; i < 3; ++i) {
    for (std::size_t j = 0; j < 5; ++j) {
      if (j <= i) {
        CHECK(p(0, 0, i, j) > 0);
      } else {
        CHECK(p(0, 0, i, j) == 0);
      }
    }
  }
  CHECK(p(0, 0, 0, 0) == 1.0);  // query 0 sees key 0 alone
}

TEST_CASE_TEMPLATE("seed numbers: d_k = 64 turns scores 45 and 2 into 5.625 and 0.25", TestType,
                   ReferencePath, FusedPath) {
  CHECK(scaling_factor(Scaling::sqrt_dk, 64) * 45 == 5.625);
  CHECK(scaling_factor(Scaling::sqrt_dk, 64) * 2 == 0.25);
  // Through the op itself: q = e0, k0 = 45 e0, k1 = 2 e0 give raw scores 45 and 2.
  Tensor4<double> q = xt::zeros<double>({1, 1, 1, 64});
  Tensor4<double> k = xt::zeros<double>({1, 1, 2, 64});
  Tensor4<double> v = xt::zeros<double>({1, 1, 2, 1});
  q(0, 0, 0, 0) = 1;
  k(0, 0, 0, 0) = 45;
  k(0, 0, 1, 0) = 2;
  const auto scores = sdpa_scores(q, k);
  CHECK(scores(0, 0, 0, 0) == 5.625);
  CHECK(scores(0, 0, 0, 1) == 0.25);
  SdpaCache<double> cache;
  const SdpaOptions scaled = with_path({}, TestType::value);
  sdpa_forward(cache, q, k, v, scaled);
  const auto p = weights_of(cache, q, k, scaled);
  // The ranking survives and the gap is exp(5.375), not exp(43): the softmax is not saturated.
  CHECK(std::log(p(0, 0, 0, 0) / p(0, 0, 0, 1)) == doctest::Approx(5.375));
  if (!cache.has_weights())
    CHECK(cache.lse(0, 0, 0) == doctest::Approx(5.625 + std::log1p(std::exp(-5.375))));
  SdpaOptions unscaled = scaled;
  unscaled.scaling = Scaling::none;
  sdpa_forward(cache, q, k, v, unscaled);
  CHECK(weights_of(cache, q, k, unscaled)(0, 0, 0, 1) < 1e-18);  // exp(-43): a one-hot row
}

TEST_CASE("seed numbers: d_k = 16, sqrt(16) = 4 and a raw score of 40 becomes 10") {
  CHECK(1.0 / scaling_factor(Scaling::sqrt_dk, 16) == 4.0);
  Tensor4<double> q = xt::zeros<double>({1, 1, 1, 16});
  Tensor4<double> k = xt::zeros<double>({1, 1, 1, 16});
  q(0, 0, 0, 3) = 8;
  k(0, 0, 0, 3) = 5;
  CHECK(sdpa_scores(q, k)(0, 0, 0, 0) == 10.0);
}

TEST_CASE("seed numbers: dk divides by d_k, none leaves the score alone") {
  Tensor4<double> q = xt::zeros<double>({1, 1, 1, 64});
  Tensor4<double> k = xt::zeros<double>({1, 1, 1, 64});
  q(0, 0, 0, 0) = 45;
  k(0, 0, 0, 0) = 1;
  SdpaOptions dk;
  dk.scaling = Scaling::dk;
  CHECK(sdpa_scores(q, k, dk)(0, 0, 0, 0) == doctest::Approx(45.0 / 64));
  SdpaOptions none;
  none.scaling = Scaling::none;
  CHECK(sdpa_scores(q, k, none)(0, 0, 0, 0) == 45.0);
  SdpaOptions explicit_scale;
  explicit_scale.scale = 0.5;
  explicit_scale.scaling = Scaling::dk;  // the explicit value wins
  CHECK(sdpa_scores(q, k, explicit_scale)(0, 0, 0, 0) == 22.5);
}

namespace {
// Sample mean and variance of all scores of unit-variance random q, k at head dim d.
std::pair<double, double> score_moments(std::size_t d, Scaling mode, std::uint64_t seed) {
  Rng rng(seed);
  const auto q = randn<double, 4>({8, 4, 32, d}, rng);
  const auto k = randn<double, 4>({8, 4, 32, d}, rng);
  SdpaOptions options;
  options.scaling = mode;
  const auto s = sdpa_scores(q, k, options);
  double mean = 0, sq = 0;
  for (double x : s) mean += x;
  mean /= static_cast<double>(s.size());
  for (double x : s) sq += (x - mean) * (x - mean);
  return {mean, sq / static_cast<double>(s.size() - 1)};
}

// Mean over rows of the entropy −Σ p log p of the attention weights.
double mean_entropy(std::size_t d, Scaling mode, std::uint64_t seed) {
  Rng rng(seed);
  const auto q = randn<double, 4>({4, 4, 32, d}, rng);
  const auto k = randn<double, 4>({4, 4, 32, d}, rng);
  const auto v = randn<double, 4>({4, 4, 32, 1}, rng);
  SdpaOptions options;
  options.scaling = mode;
  options.path = SdpaPath::reference;  // the statistic reads the weights
  SdpaCache<double> cache;
  sdpa_forward(cache, q, k, v, options);
  double h = 0;
  for (double p : cache.p) h -= p > 0 ? p * std::log(p) : 0.0;
  return h / static_cast<double>(cache.p.size() / 32);
}
}  // namespace

TEST_CASE("statistics: Var(q.k) is about d_k unscaled and about 1 after sqrt_dk scaling") {
  // 32768 scores per d_k. Var(q·k) = d_k for unit-variance components; the sample variance has a
  // relative standard error of about sqrt((2 + 6/d_k) / n_eff) < 3% here (the scores share q and k
  // rows, so n_eff < n). The tolerance of 10% is several standard errors, and still rejects the
  // wrong power of d_k at every d_k tested (4 vs 2 or 16, 64 vs 8, 256 vs 16).
  for (std::size_t d : {4, 64, 256}) {
    CAPTURE(d);
    const auto [mean_raw, var_raw] = score_moments(d, Scaling::none, 100 + d);
    CHECK(var_raw / static_cast<double>(d) == doctest::Approx(1.0).epsilon(0.10));
    CHECK(std::abs(mean_raw) < 0.1 * std::sqrt(static_cast<double>(d)));
    const auto [mean_scaled, var_scaled] = score_moments(d, Scaling::sqrt_dk, 100 + d);
    CHECK(var_scaled == doctest::Approx(1.0).epsilon(0.10));
    const auto [mean_dk, var_dk] = score_moments(d, Scaling::dk, 100 + d);
    CHECK(var_dk * static_cast<double>(d) == doctest::Approx(1.0).epsilon(0.10));
  }
}

TEST_CASE("statistics: entropy at init falls with d_k unscaled and stays flat when scaled") {
  const double h4 = mean_entropy(4, Scaling::none, 5);
  const double h64 = mean_entropy(64, Scaling::none, 5);
  const double h256 = mean_entropy(256, Scaling::none, 5);
  CHECK(h4 > h64);
  CHECK(h64 > h256);
  CHECK(h256 < 0.5 * h4);  // near one-hot rows at d_k = 256
  const double s4 = mean_entropy(4, Scaling::sqrt_dk, 5);
  const double s64 = mean_entropy(64, Scaling::sqrt_dk, 5);
  const double s256 = mean_entropy(256, Scaling::sqrt_dk, 5);
  // Scores ~ N(0, 1) over 32 keys: entropy ≈ ln 32 − 1/2 ≈ 2.97 at every d_k.
  CHECK(s64 == doctest::Approx(s4).epsilon(0.05));
  CHECK(s256 == doctest::Approx(s4).epsilon(0.05));
  CHECK(s4 == doctest::Approx(std::log(32.0) - 0.5).epsilon(0.05));
}

TEST_CASE_TEMPLATE("sdpa: float and double forward passes agree", TestType, ReferencePath,
                   FusedPath) {
  Rng rng(21);
  const auto qd = randn<double, 4>({2, 3, 7, 16}, rng);
  const auto kd = randn<double, 4>({2, 3, 9, 16}, rng);
  const auto vd = randn<double, 4>({2, 3, 9, 8}, rng);
  KeyMask mask = xt::ones<bool>({2, 9});
  mask(1, 4) = false;
  SdpaOptions options = with_path({}, TestType::value);
  options.causal = true;
  SdpaCache<double> cd;
  SdpaCache<float> cf;
  const auto od = sdpa_forward(cd, qd, kd, vd, options, &mask);
  const auto of =
      sdpa_forward(cf, Tensor4<float>(xt::cast<float>(qd)), Tensor4<float>(xt::cast<float>(kd)),
                   Tensor4<float>(xt::cast<float>(vd)), options, &mask);
  CHECK(test::rel_error(od, of) < 1e-5);
  CHECK(cd.has_weights() == (TestType::value == SdpaPath::reference));
  CHECK(cf.has_weights() == (TestType::value == SdpaPath::reference));
  if (cd.has_weights()) CHECK(test::rel_error(cd.p, cf.p) < 1e-5);
  if (!cd.has_weights()) CHECK(test::rel_error(cd.lse, cf.lse) < 1e-5);
}

TEST_CASE_TEMPLATE("sdpa: bad inputs throw ShapeError naming both shapes", TestType, ReferencePath,
                   FusedPath) {
  Tensor4<double> q = xt::zeros<double>({2, 4, 5, 16});
  Tensor4<double> k = xt::zeros<double>({2, 4, 7, 16});
  Tensor4<double> v = xt::zeros<double>({2, 4, 7, 8});
  SdpaCache<double> cache;
  const SdpaOptions path_only = with_path({}, TestType::value);
  SUBCASE("rank mismatch") {
    xt::xarray<double> q3 = xt::zeros<double>({2, 5, 16});
    CHECK_THROWS_WITH_AS(
        sdpa_forward<double>(cache, q3, xt::xarray<double>(k), xt::xarray<double>(v), path_only),
        doctest::Contains("sdpa_forward: q expected (*, *, *, *), got (2, 5, 16)"), ShapeError);
  }
  SUBCASE("D of q differs from D of k") {
    Tensor4<double> k8 = xt::zeros<double>({2, 4, 7, 8});
    CHECK_THROWS_WITH_AS(sdpa_forward(cache, q, k8, v, path_only),
                         "sdpa_forward: k expected (2, 4, *, 16), got (2, 4, 7, 8)", ShapeError);
  }
  SUBCASE("Tk of k differs from Tk of v") {
    Tensor4<double> v6 = xt::zeros<double>({2, 4, 6, 8});
    CHECK_THROWS_WITH_AS(sdpa_forward(cache, q, k, v6, path_only),
                         "sdpa_forward: v expected (2, 4, 7, *), got (2, 4, 6, 8)", ShapeError);
  }
  SUBCASE("key mask of the wrong shape") {
    KeyMask mask = xt::ones<bool>({2, 5});
    CHECK_THROWS_WITH_AS(sdpa_forward(cache, q, k, v, path_only, &mask),
                         "sdpa_forward: key_mask expected (2, 7), got (2, 5)", ShapeError);
  }
  SUBCASE("non-finite explicit scale") {
    SdpaOptions options = path_only;
    options.scale = std::numeric_limits<double>::quiet_NaN();
    CHECK_THROWS_WITH_AS(
        sdpa_forward(cache, q, k, v, options),
        doctest::Contains("sdpa_forward: scale expected a finite scale > 0, got nan"),
        std::invalid_argument);
    options.scale = std::numeric_limits<double>::infinity();
    CHECK_THROWS_WITH_AS(sdpa_forward(cache, q, k, v, options),
                         doctest::Contains("scale expected a finite scale > 0, got inf"),
                         std::invalid_argument);
  }
  SUBCASE("dout of the wrong shape") {
    sdpa_forward(cache, q, k, v, path_only);
    Tensor4<double> dout = xt::zeros<double>({2, 4, 5, 16});
    CHECK_THROWS_WITH_AS(sdpa_backward(dout, cache, q, k, v),
                         "sdpa_backward: dout expected (2, 4, 5, 8), got (2, 4, 5, 16)",
                         ShapeError);
  }
}

TEST_CASE("sdpa: backward before forward throws logic_error") {
  Tensor4<double> q = xt::zeros<double>({1, 1, 2, 2});
  SdpaCache<double> empty;
  SUBCASE("reference") {}
  SUBCASE("fused") {
    empty.path = SdpaPath::fused;
  }
  CHECK_THROWS_AS(sdpa_backward(Tensor4<double>(xt::zeros<double>({1, 1, 2, 2})), empty, q, q, q),
                  std::logic_error);
}

TEST_CASE("scaling modes parse and print") {
  for (Scaling m : {Scaling::none, Scaling::sqrt_dk, Scaling::dk}) {
    CHECK(parse_scaling(to_string(m)) == m);
  }
  CHECK_THROWS_WITH_AS(parse_scaling("sqrt"),
                       "parse_scaling: mode expected none|sqrt_dk|dk, got 'sqrt'",
                       std::invalid_argument);
}
