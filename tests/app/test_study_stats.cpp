// The study report's statistics: Wilson intervals against published values, the bootstrap's
// coverage, and the LR-window width.
#include <doctest/doctest.h>

#include <cmath>
#include <cstdint>

#include "attnlab/app/study_stats.hpp"
#include "attnlab/random.hpp"

using namespace attnlab;
using namespace attnlab::app;

TEST_CASE("wilson_interval: Wilson (1927) score interval at 95%, values of Newcombe (1998)") {
  // Newcombe 1998, Table I: 81/263 -> [0.2553, 0.3662]; 15/148 -> [0.0624, 0.1605];
  // 0/20 -> [0, 0.1611]; 1/29 -> [0.0061, 0.1718].
  struct Case {
    int k, n;
    double lo, hi;
  };
  for (const Case c : {Case{81, 263, 0.2553, 0.3662}, Case{15, 148, 0.0624, 0.1605},
                       Case{0, 20, 0.0, 0.1611}, Case{1, 29, 0.0061, 0.1718}}) {
    CAPTURE(c.k);
    const Interval i = wilson_interval(c.k, c.n);
    CHECK(i.lo == doctest::Approx(c.lo).epsilon(5e-4).scale(1));
    CHECK(i.hi == doctest::Approx(c.hi).epsilon(5e-4));
  }
  const Interval all = wilson_interval(5, 5);
  CHECK(all.hi == 1.0);
  CHECK(all.lo == doctest::Approx(0.5655).epsilon(5e-4));
  const Interval none = wilson_interval(0, 0);
  CHECK(none.lo == 0.0);
  CHECK(none.hi == 1.0);
  CHECK_THROWS_AS(wilson_interval(6, 5), std::invalid_argument);
  CHECK_THROWS_AS(wilson_interval(-1, 5), std::invalid_argument);
}

TEST_CASE("bootstrap_mean_interval: holds the mean, is reproducible, and covers about 95%") {
  const std::vector<double> x = {1, 2, 3, 4, 10};
  const Interval a = bootstrap_mean_interval(x);
  const Interval b = bootstrap_mean_interval(x);
  CHECK(a.lo == b.lo);
  CHECK(a.hi == b.hi);
  CHECK(a.lo < mean(x));
  CHECK(a.hi > mean(x));
  CHECK(a.lo >= 1.0);
  CHECK(a.hi <= 10.0);
  const Interval one = bootstrap_mean_interval({3.5});
  CHECK(one.lo == 3.5);
  CHECK(one.hi == 3.5);
  CHECK(std::isnan(bootstrap_mean_interval({}).lo));
  CHECK_THROWS_AS(bootstrap_mean_interval(x, 1.0), std::invalid_argument);
  CHECK_THROWS_AS(bootstrap_mean_interval(x, 0.95, 0), std::invalid_argument);

  // Coverage: 300 samples of 30 normals with mean 2; the percentile bootstrap of a normal mean
  // covers close to its nominal 95% (a little under for small samples).
  Rng rng(7);
  int covered = 0;
  double width = 0;
  for (int rep = 0; rep < 300; ++rep) {
    std::vector<double> s(30);
    for (double& v : s) v = 2 + rng.normal();
    const Interval i = bootstrap_mean_interval(s, 0.95, 1000, static_cast<std::uint64_t>(rep));
    covered += (i.lo <= 2 && 2 <= i.hi) ? 1 : 0;
    width += i.hi - i.lo;
  }
  CHECK(covered >= 270);  // 90%
  CHECK(covered <= 297);  // 99%
  // The normal interval's width is 2 · 1.96 / sqrt(30) = 0.716.
  CHECK(width / 300 == doctest::Approx(0.716).epsilon(0.1));
}

TEST_CASE("window_decades and window_edges: the working LRs in decades, and bounded sides") {
  const std::vector<double> lrs = {1e-4, 3.1623e-4, 1e-3, 3.1623e-3, 1e-2};
  CHECK(window_decades(lrs, {false, false, false, false, false}) == 0.0);
  CHECK(window_decades(lrs, {false, true, true, false, false}) == doctest::Approx(1.0));
  CHECK(window_decades(lrs, {true, false, true, false, true}) == doctest::Approx(1.5));
  CHECK_THROWS_AS(window_decades(lrs, {true}), std::invalid_argument);
  CHECK_THROWS_AS(window_decades({1e-2, 1e-3}, {true, true}), std::invalid_argument);

  const WindowEdges both = window_edges({{false, true, false}, {false, true, true, false}});
  CHECK(both.lower);
  CHECK(both.upper);
  const WindowEdges open_top = window_edges({{false, true, false}, {false, true, true}});
  CHECK(open_top.lower);
  CHECK_FALSE(open_top.upper);
  const WindowEdges never = window_edges({{false, false}, {false, false}});
  CHECK_FALSE(never.lower);
  CHECK_FALSE(never.upper);
}
