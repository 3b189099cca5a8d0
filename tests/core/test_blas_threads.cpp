// blas::gemm split over threads (outside parallel regions, large products): the same result as one
// thread for every transpose combination, for row and column splits, with padded leading
// dimensions, and bit-identical on a repeat with the same thread count.
#include <doctest/doctest.h>

#include <cstring>
#include <vector>

#include "attnlab/blas.hpp"
#include "attnlab/random.hpp"
#include "attnlab/threads.hpp"
#include "helpers.hpp"

using namespace attnlab;

namespace {
struct ThreadCountGuard {
  ~ThreadCountGuard() { set_num_threads(1); }
};

// C (m, n) = 0.5 op(A) op(B) + 0.25 C with padded leading dimensions (+3), at `threads` threads.
std::vector<float> run_gemm(bool ta, bool tb, int m, int n, int k, int threads) {
  set_num_threads(threads);
  Rng rng(3);
  const int a_rows = ta ? k : m, a_cols = ta ? m : k, b_rows = tb ? n : k, b_cols = tb ? k : n;
  const int lda = a_cols + 3, ldb = b_cols + 3, ldc = n + 3;
  const auto a = randn<float, 1>({static_cast<std::size_t>(a_rows * lda)}, rng);
  const auto b = randn<float, 1>({static_cast<std::size_t>(b_rows * ldb)}, rng);
  const auto c0 = randn<float, 1>({static_cast<std::size_t>(m * ldc)}, rng);
  std::vector<float> c(c0.begin(), c0.end());
  blas::gemm<float>(ta, tb, m, n, k, 0.5f, a.data(), lda, b.data(), ldb, 0.25f, c.data(), ldc);
  return c;
}
}  // namespace

TEST_CASE("blas::gemm on 2 threads equals 1 thread, rows or columns split, all transposes") {
  ThreadCountGuard guard;
  struct Dims {
    int m, n, k;
  };
  // Tall (split by rows), wide (split by columns), and an extent not a multiple of the chunk.
  for (const Dims d : {Dims{301, 64, 96}, Dims{40, 517, 80}, Dims{130, 129, 70}}) {
    for (bool ta : {false, true}) {
      for (bool tb : {false, true}) {
        CAPTURE(d.m);
        CAPTURE(d.n);
        CAPTURE(ta);
        CAPTURE(tb);
        const auto one = run_gemm(ta, tb, d.m, d.n, d.k, 1);
        const auto two = run_gemm(ta, tb, d.m, d.n, d.k, 2);
        const auto again = run_gemm(ta, tb, d.m, d.n, d.k, 2);
        CHECK(test::rel_error(one, two) < 1e-6);
        CHECK(std::memcmp(two.data(), again.data(), two.size() * sizeof(float)) == 0);
      }
    }
  }
}
