// OpenBLAS's cblas.h is included here and only here (it clashes with xtensor-blas's declarations).
#include "attnlab/blas.hpp"

#include <cblas.h>
#include <omp.h>

#include <algorithm>

#include "attnlab/threads.hpp"

namespace attnlab::blas {

namespace {

CBLAS_TRANSPOSE to_cblas(bool trans) {
  return trans ? CblasTrans : CblasNoTrans;
}

void serial_gemm(bool trans_a, bool trans_b, int m, int n, int k, float alpha, const float* a,
                 int lda, const float* b, int ldb, float beta, float* c, int ldc) {
  cblas_sgemm(CblasRowMajor, to_cblas(trans_a), to_cblas(trans_b), m, n, k, alpha, a, lda, b, ldb,
              beta, c, ldc);
}

void serial_gemm(bool trans_a, bool trans_b, int m, int n, int k, double alpha, const double* a,
                 int lda, const double* b, int ldb, double beta, double* c, int ldc) {
  cblas_dgemm(CblasRowMajor, to_cblas(trans_a), to_cblas(trans_b), m, n, k, alpha, a, lda, b, ldb,
              beta, c, ldc);
}

// Below this many multiply-adds a gemm runs on one thread: forking costs more than it saves.
constexpr double kParallelGemmMinWork = 1 << 20;
// Chunks are multiples of this many rows (or columns), the register blocking of the kernels.
constexpr int kChunkAlign = 16;

// Outside a parallel region, with several attnlab threads and enough work, the gemm is cut into
// num_threads() (the calling thread's count) contiguous blocks of rows of C (or of columns, when C
// is wider than tall), one per thread, each an independent single-threaded BLAS call. OpenBLAS
// itself stays at one thread (threads.hpp); inside attention's parallel loops every gemm runs
// serially. The cut depends only on the shapes and the thread count, so results are deterministic
// for a fixed thread count.
template <class T>
void gemm_impl(bool trans_a, bool trans_b, int m, int n, int k, T alpha, const T* a, int lda,
               const T* b, int ldb, T beta, T* c, int ldc) {
  const int threads = num_threads();
  const bool split = threads > 1 && !omp_in_parallel() &&
                     static_cast<double>(m) * n * k >= kParallelGemmMinWork &&
                     std::max(m, n) >= 2 * kChunkAlign;
  if (!split) {
    serial_gemm(trans_a, trans_b, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
    return;
  }
  const bool by_rows = m >= n;
  const int extent = by_rows ? m : n;
  const int chunks = std::min(threads, extent / kChunkAlign);
  const int chunk = (extent / chunks + kChunkAlign - 1) / kChunkAlign * kChunkAlign;
#pragma omp parallel for num_threads(chunks) schedule(static)
  for (int part = 0; part < chunks; ++part) {
    const int begin = part * chunk;
    const int size = std::min(chunk, extent - begin);
    if (size <= 0) continue;
    if (by_rows) {
      // Rows [begin, begin + size) of op(A) and of C.
      const T* a_part = trans_a ? a + begin : a + static_cast<std::ptrdiff_t>(begin) * lda;
      serial_gemm(trans_a, trans_b, size, n, k, alpha, a_part, lda, b, ldb, beta,
                  c + static_cast<std::ptrdiff_t>(begin) * ldc, ldc);
    } else {
      // Columns [begin, begin + size) of op(B) and of C.
      const T* b_part = trans_b ? b + static_cast<std::ptrdiff_t>(begin) * ldb : b + begin;
      serial_gemm(trans_a, trans_b, m, size, k, alpha, a, lda, b_part, ldb, beta, c + begin, ldc);
    }
  }
}

}  // namespace

template <>
void gemm<float>(bool trans_a, bool trans_b, int m, int n, int k, float alpha, const float* a,
                 int lda, const float* b, int ldb, float beta, float* c, int ldc) {
  gemm_impl(trans_a, trans_b, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
}

template <>
void gemm<double>(bool trans_a, bool trans_b, int m, int n, int k, double alpha, const double* a,
                  int lda, const double* b, int ldb, double beta, double* c, int ldc) {
  gemm_impl(trans_a, trans_b, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
}

}  // namespace attnlab::blas
