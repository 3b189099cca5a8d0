// OutlierDetector (attnlab/optim/outlier.hpp), llm.c's sliding-window z-score: NaN until the
// window is full, the z-score against a hand computation and against llm.c's running sums, the
// window sliding, the sqrt(N - 1) bound, non-finite values, and its state saved and restored.
#include <doctest/doctest.h>

#include <cmath>
#include <limits>
#include <stdexcept>
#include <vector>

#include "attnlab/optim/outlier.hpp"
#include "attnlab/random.hpp"

using namespace attnlab;

namespace {

// llm.c's update_detector, as written there (running sum and sum of squares), for comparison.
struct LlmcDetector {
  std::vector<double> buffer;
  std::size_t count = 0, index = 0;
  double sum = 0, sum_sq = 0;
  explicit LlmcDetector(std::size_t n) : buffer(n, 0.0) {}
  double update(double x) {
    const std::size_t n = buffer.size();
    if (count < n) {
      buffer[count++] = x;
      sum += x;
      sum_sq += x * x;
      return std::numeric_limits<double>::quiet_NaN();
    }
    const double old = buffer[index];
    sum -= old;
    sum_sq -= old * old;
    buffer[index] = x;
    sum += x;
    sum_sq += x * x;
    index = (index + 1) % n;
    const double mean = sum / static_cast<double>(n);
    const double sd = std::sqrt(sum_sq / static_cast<double>(n) - mean * mean);
    return sd == 0 ? 0.0 : (x - mean) / sd;
  }
};

}  // namespace

TEST_CASE("OutlierDetector: NaN until the window is full, then the z-score of a hand computation") {
  OutlierDetector d(4);
  CHECK(d.window() == 4);
  CHECK(OutlierDetector().window() == 128);      // llm.c's OUTLIER_DETECTOR_WINDOW_SIZE
  for (const double x : {1.0, 2.0, 3.0, 4.0}) {  // the 4th fills the window: still NaN
    CHECK_FALSE(d.full());
    CHECK(std::isnan(d.update(x)));
  }
  CHECK(d.full());
  CHECK(d.state().position == 0);
  // 10 replaces the oldest (1): window {10, 2, 3, 4}, mean 4.75, population variance
  // (5.25² + 2.75² + 1.75² + 0.75²) / 4 = 9.6875.
  CHECK(d.update(10.0) == doctest::Approx(5.25 / std::sqrt(9.6875)).epsilon(1e-15));
  CHECK(d.state().values == std::vector<double>{10, 2, 3, 4});
  CHECK(d.state().position == 1);
  // The window slides: 10 again replaces 2: {10, 10, 3, 4}, mean 6.75, variance
  // (3.25² + 3.25² + 3.75² + 2.75²) / 4 = 10.6875.
  CHECK(d.update(10.0) == doctest::Approx(3.25 / std::sqrt(10.6875)).epsilon(1e-15));
  // A low value has a negative z-score (never an outlier above a positive threshold): {10, 10,
  // 0, 4}, mean 6, variance (16 + 16 + 36 + 4) / 4 = 18.
  CHECK(d.update(0.0) == doctest::Approx(-6 / std::sqrt(18.0)).epsilon(1e-15));
  CHECK(d.state().position == 3);
  CHECK(d.update(4.0) == doctest::Approx(-2 / std::sqrt(18.0)).epsilon(1e-15));  // wraps
  CHECK(d.state().position == 0);
  CHECK(d.state().values == std::vector<double>{10, 10, 0, 4});
  // Equal values: deviation 0, z-score 0 (llm.c's rule).
  OutlierDetector flat(3);
  for (int i = 0; i < 3; ++i) CHECK(std::isnan(flat.update(2.5)));
  CHECK(flat.update(2.5) == 0);
}

TEST_CASE("OutlierDetector: one value among N - 1 equal ones reaches the bound sqrt(N - 1)") {
  OutlierDetector d;  // N = 128
  for (int i = 0; i < 128; ++i) CHECK(std::isnan(d.update(3.0)));
  CHECK(d.update(1000.0) == doctest::Approx(std::sqrt(127.0)).epsilon(1e-12));
  CHECK(d.update(3.0) < 0);
}

TEST_CASE("OutlierDetector: agrees with llm.c's running sums to rounding") {
  Rng rng(7);
  OutlierDetector d(16);
  LlmcDetector ref(16);
  int compared = 0;
  for (int i = 0; i < 300; ++i) {
    // A decaying loss-like signal with noise and a spike every 37 steps.
    const double x = 2.0 * std::exp(-i / 80.0) + 0.05 * rng.normal() + (i % 37 == 36 ? 1.5 : 0);
    const double z = d.update(x), z_ref = ref.update(x);
    CAPTURE(i);
    if (i < 16) {
      CHECK(std::isnan(z));
      CHECK(std::isnan(z_ref));
    } else {
      CHECK(z == doctest::Approx(z_ref).epsilon(1e-9));
      ++compared;
    }
  }
  CHECK(compared == 284);
}

TEST_CASE("OutlierDetector: a non-finite value is not entered and gives NaN") {
  OutlierDetector d(3);
  CHECK(std::isnan(d.update(std::numeric_limits<double>::quiet_NaN())));
  CHECK(d.state().values.empty());
  for (const double x : {1.0, 2.0, 3.0}) d.update(x);
  const auto before = d.state();
  CHECK(std::isnan(d.update(std::numeric_limits<double>::infinity())));
  CHECK(std::isnan(d.update(-std::numeric_limits<double>::infinity())));
  CHECK(d.state().values == before.values);
  CHECK(d.state().position == before.position);
  CHECK(std::isfinite(d.update(2.0)));
}

TEST_CASE("OutlierDetector: a restored state gives bit for bit the z-scores of an unbroken one") {
  Rng rng(11);
  std::vector<double> xs(400);
  for (auto& x : xs) x = 1.0 + 0.1 * rng.normal() + (rng.below(50) == 0 ? 2.0 : 0.0);
  for (const std::size_t cut :
       {std::size_t{0}, std::size_t{70}, std::size_t{128}, std::size_t{129}, std::size_t{300}}) {
    CAPTURE(cut);
    OutlierDetector unbroken, first;
    std::vector<double> a, b;
    for (std::size_t i = 0; i < cut; ++i) {
      a.push_back(unbroken.update(xs[i]));
      b.push_back(first.update(xs[i]));
    }
    OutlierDetector second;
    second.set_state(first.state());
    for (std::size_t i = cut; i < xs.size(); ++i) {
      a.push_back(unbroken.update(xs[i]));
      b.push_back(second.update(xs[i]));
    }
    REQUIRE(a.size() == b.size());
    for (std::size_t i = 0; i < a.size(); ++i) {
      CAPTURE(i);
      if (std::isnan(a[i]))
        CHECK(std::isnan(b[i]));
      else
        CHECK(a[i] == b[i]);
    }
  }
}

TEST_CASE("OutlierDetector: bad windows and states are refused naming the field") {
  CHECK_THROWS_WITH_AS(OutlierDetector(1), "OutlierDetector: window expected >= 2, got 1",
                       std::invalid_argument);
  OutlierDetector d(3);
  d.update(1.0);
  CHECK_THROWS_WITH_AS(d.set_state({{1, 2, 3, 4}, 0}),
                       "OutlierDetector: values expected at most window = 3 values, got 4 values",
                       std::invalid_argument);
  CHECK_THROWS_WITH_AS(
      d.set_state({{1, std::numeric_limits<double>::quiet_NaN()}, 2}),
      "OutlierDetector: values expected finite numbers, got a non-finite value at index 1",
      std::invalid_argument);
  CHECK_THROWS_WITH_AS(d.set_state({{1, 2}, 0}),
                       "OutlierDetector: position expected values.size() = 2 while not full, got 0",
                       std::invalid_argument);
  CHECK_THROWS_WITH_AS(d.set_state({{1, 2, 3}, 3}),
                       "OutlierDetector: position expected below window = 3, got 3",
                       std::invalid_argument);
  CHECK(d.state().values == std::vector<double>{1});  // unchanged by the refused states
  d.set_state({{1, 2, 3}, 2});
  CHECK(d.full());
  // 6 replaces slot 2: {1, 2, 6}, mean 3, variance (4 + 1 + 9) / 3.
  CHECK(d.update(6.0) == doctest::Approx(3 / std::sqrt(14.0 / 3)).epsilon(1e-14));
}
