#include "attnlab/app/study_stats.hpp"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <stdexcept>
#include <string>

#include "attnlab/random.hpp"

namespace attnlab::app {

Interval wilson_interval(int successes, int trials, double z) {
  if (trials < 0 || successes < 0 || successes > trials)
    throw std::invalid_argument("wilson_interval: expected 0 <= successes <= trials, got " +
                                std::to_string(successes) + " of " + std::to_string(trials));
  if (trials == 0) return {0, 1};
  const double n = trials, p = successes / n, z2 = z * z;
  const double centre = (p + z2 / (2 * n)) / (1 + z2 / n);
  const double half = z / (1 + z2 / n) * std::sqrt(p * (1 - p) / n + z2 / (4 * n * n));
  return {std::max(0.0, centre - half), std::min(1.0, centre + half)};
}

double mean(const std::vector<double>& x) {
  if (x.empty()) return std::numeric_limits<double>::quiet_NaN();
  double s = 0;
  for (double v : x) s += v;
  return s / static_cast<double>(x.size());
}

Interval bootstrap_mean_interval(const std::vector<double>& x, double level, int resamples,
                                 std::uint64_t seed) {
  if (!(level > 0 && level < 1))
    throw std::invalid_argument("bootstrap_mean_interval: level expected in (0, 1), got " +
                                std::to_string(level));
  if (resamples < 1)
    throw std::invalid_argument("bootstrap_mean_interval: resamples expected >= 1, got " +
                                std::to_string(resamples));
  const double nan = std::numeric_limits<double>::quiet_NaN();
  if (x.empty()) return {nan, nan};
  if (x.size() == 1) return {x[0], x[0]};
  Rng rng(seed);
  std::vector<double> means(static_cast<std::size_t>(resamples));
  for (double& m : means) {
    double s = 0;
    for (std::size_t i = 0; i < x.size(); ++i) s += x[rng.below(x.size())];
    m = s / static_cast<double>(x.size());
  }
  std::sort(means.begin(), means.end());
  // The quantile q of the sorted means, interpolated linearly between neighbours.
  const auto quantile = [&](double q) {
    const double pos = q * static_cast<double>(means.size() - 1);
    const auto i = static_cast<std::size_t>(std::floor(pos));
    const std::size_t j = std::min(i + 1, means.size() - 1);
    return means[i] + (pos - static_cast<double>(i)) * (means[j] - means[i]);
  };
  return {quantile((1 - level) / 2), quantile((1 + level) / 2)};
}

double window_decades(const std::vector<double>& lrs, const std::vector<bool>& works) {
  if (lrs.size() != works.size() || lrs.size() < 2)
    throw std::invalid_argument("window_decades: expected >= 2 LRs with one outcome each, got " +
                                std::to_string(lrs.size()) + " LRs and " +
                                std::to_string(works.size()) + " outcomes");
  const double spacing = std::log10(lrs.back() / lrs.front()) / static_cast<double>(lrs.size() - 1);
  if (!(spacing > 0)) throw std::invalid_argument("window_decades: the LRs must increase");
  return spacing * static_cast<double>(std::count(works.begin(), works.end(), true));
}

WindowEdges window_edges(const std::vector<std::vector<bool>>& works_per_seed) {
  WindowEdges e;
  bool any = false, first = false, last = false;
  for (const auto& w : works_per_seed) {
    if (w.empty()) continue;
    any = any || std::find(w.begin(), w.end(), true) != w.end();
    first = first || w.front();
    last = last || w.back();
  }
  e.lower = any && !first;
  e.upper = any && !last;
  return e;
}

}  // namespace attnlab::app
