// The seed note's numbers, computed by the library: the variance of q·k for unit-variance random q
// and k grows like d_k; 1/√d_k brings it back to 1; the worked example 45, 2 -> 5.625, 0.25.
#include <cmath>
#include <cstdio>

#include "attnlab/attnlab.hpp"

using namespace attnlab;

namespace {
struct Moments {
  double var = 0, entropy = 0, max_weight = 0;
};

Moments measure(std::size_t d, Scaling mode) {
  Rng rng(1234 + d);
  const std::size_t B = 4, H = 4, T = 64;
  const auto q = randn<double, 4>({B, H, T, d}, rng);
  const auto k = randn<double, 4>({B, H, T, d}, rng);
  const auto v = randn<double, 4>({B, H, T, 1}, rng);
  SdpaOptions options;
  options.scaling = mode;
  const auto s = sdpa_scores(q, k, options);
  double mean = 0, sq = 0;
  for (double x : s) mean += x;
  mean /= static_cast<double>(s.size());
  for (double x : s) sq += (x - mean) * (x - mean);
  SdpaCache<double> cache;
  sdpa_forward(cache, q, k, v, options);
  Moments m;
  m.var = sq / static_cast<double>(s.size() - 1);
  const std::size_t rows = B * H * T;
  for (std::size_t r = 0; r < rows; ++r) {
    double row_max = 0;
    for (std::size_t j = 0; j < T; ++j) {
      const double p = cache.p.data()[r * T + j];
      if (p > 0) m.entropy -= p * std::log(p);
      row_max = std::max(row_max, p);
    }
    m.max_weight += row_max;
  }
  m.entropy /= static_cast<double>(rows);
  m.max_weight /= static_cast<double>(rows);
  return m;
}
}  // namespace

int main() {
  std::printf("Scaled dot-product attention: why divide by sqrt(d_k)\n\n");
  std::printf("q, k ~ N(0, I), 64 keys per query; entropy in nats (ln 64 = %.2f is uniform)\n\n",
              std::log(64.0));
  std::printf("%6s | %12s %10s %10s | %12s %10s %10s\n", "d_k", "Var(q.k)", "entropy", "max w",
              "Var(q.k/sd)", "entropy", "max w");
  for (std::size_t d : {4, 16, 64, 256, 1024}) {
    const Moments raw = measure(d, Scaling::none);
    const Moments scaled = measure(d, Scaling::sqrt_dk);
    std::printf("%6zu | %12.2f %10.3f %10.3f | %12.3f %10.3f %10.3f\n", d, raw.var, raw.entropy,
                raw.max_weight, scaled.var, scaled.entropy, scaled.max_weight);
  }
  const double s64 = scaling_factor(Scaling::sqrt_dk, 64);
  std::printf("\nWorked example, d_k = 64: scores 45 and 2 become %.3f and %.3f\n", 45 * s64,
              2 * s64);
  std::printf("d_k = 16: sqrt(16) = %.0f, a raw score of 40 becomes %.0f\n",
              1 / scaling_factor(Scaling::sqrt_dk, 16), 40 * scaling_factor(Scaling::sqrt_dk, 16));
  return 0;
}
