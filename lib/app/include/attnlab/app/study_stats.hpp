// The statistics of the √d_k study's report: intervals for means and success rates, and the width
// of a learning-rate window. Everything is deterministic (the bootstrap draws from a fixed seed),
// so a report regenerated from the same runs is byte-identical.
#pragma once

#include <cstdint>
#include <vector>

namespace attnlab::app {

struct Interval {
  double lo = 0, hi = 0;
};

// The Wilson score interval of a binomial proportion k/n at z (1.96: 95%). n = 0 gives [0, 1].
// Throws std::invalid_argument unless 0 <= k <= n.
Interval wilson_interval(int successes, int trials, double z = 1.959963984540054);

// The percentile bootstrap interval of the mean: `resamples` resamples of x with replacement, the
// (1 − level)/2 and (1 + level)/2 quantiles of their means. One value gives [x, x]; none gives
// [NaN, NaN]. Throws std::invalid_argument for a level outside (0, 1) or resamples < 1.
Interval bootstrap_mean_interval(const std::vector<double>& x, double level = 0.95,
                                 int resamples = 4000, std::uint64_t seed = 0x5eedb007);

double mean(const std::vector<double>& x);  // NaN for none

// The working window of one seed over a learning-rate grid spaced evenly in log10: the number of
// grid LRs at which the run worked, times the spacing in decades (so one working LR of a
// half-decade grid is 0.5 decades; none is 0). A window with a gap counts only its working LRs.
// `works[i]` is the run at lrs[i]; the LRs must be increasing. Throws std::invalid_argument for
// sizes that differ or fewer than two LRs.
double window_decades(const std::vector<double>& lrs, const std::vector<bool>& works);

// Whether a window is bounded on each side within the grid: the smallest (largest) LR of the grid
// fails for every seed while some LR works for some seed.
struct WindowEdges {
  bool lower = false, upper = false;
};
WindowEdges window_edges(const std::vector<std::vector<bool>>& works_per_seed);

}  // namespace attnlab::app
