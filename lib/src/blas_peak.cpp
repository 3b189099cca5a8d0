// The measured gemm peak, the denominator of MFU (measure_gemm_peak_gflops, attnlab/blas.hpp).
#include <omp.h>

#include <algorithm>
#include <string>
#include <string_view>
#include <vector>

#include "blas_private.hpp"

namespace attnlab {

// tensor.hpp's check_arg, declared here: the blas files keep xtensor out.
void check_arg(bool ok, std::string_view op, std::string_view name, std::string_view what,
               std::string_view got);

template <class T>
double measure_gemm_peak_gflops(int threads, int n, int rounds) {
  const char* op = "measure_gemm_peak_gflops";
  check_arg(threads >= 1, op, "threads", ">= 1", std::to_string(threads));
  check_arg(n >= 16, op, "n", ">= 16", std::to_string(n));
  check_arg(rounds >= 1, op, "rounds", ">= 1", std::to_string(rounds));
  blas::detail::ensure_checked();
  constexpr int kCallsPerRound = 3;
  const std::size_t elements = static_cast<std::size_t>(n) * static_cast<std::size_t>(n);
  std::vector<std::vector<T>> a(threads), b(threads), c(threads);
  double best = 0;
  for (int round = -1; round < rounds; ++round) {  // round -1: first touch and warm-up
    double start = 0, stop = 0;
    int team = 0;  // the threads OpenMP gave (fewer inside a parallel region, or when dynamic)
#pragma omp parallel num_threads(threads)
    {
      const int id = omp_get_thread_num();
      if (a[id].empty()) {  // each thread's matrices in its own memory, before the clock starts
        a[id].assign(elements, T(0.5));
        b[id].assign(elements, T(0.25));
        c[id].assign(elements, T(0));
      }
#pragma omp barrier
#pragma omp single
      {
        team = omp_get_num_threads();
        start = omp_get_wtime();
      }
      for (int call = 0; call < kCallsPerRound; ++call)
        blas::detail::serial_gemm(false, false, n, n, n, T(1), a[id].data(), n, b[id].data(), n,
                                  T(0), c[id].data(), n);
#pragma omp barrier
#pragma omp single
      stop = omp_get_wtime();
    }
    if (round < 0) continue;
    const double flops = 2.0 * n * static_cast<double>(n) * n * kCallsPerRound * team;
    best = std::max(best, flops / (stop - start) / 1e9);
  }
  return best;
}

template double measure_gemm_peak_gflops<float>(int, int, int);
template double measure_gemm_peak_gflops<double>(int, int, int);

}  // namespace attnlab
