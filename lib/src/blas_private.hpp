// Private to lib/src: what the files of the gemm dispatch share. blas.cpp: the OpenBLAS calls, the
// thread split, the float engine and blas_info; blas_core.cpp: OpenBLAS's core; blas_onednn.cpp:
// everything of oneDNN (the one file built with it); blas_bf16.cpp: bf16 gemms; blas_peak.cpp: the
// measured gemm peak.
#pragma once

#include <omp.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "attnlab/blas.hpp"
#include "attnlab/threads.hpp"

namespace attnlab {
namespace blas {
namespace detail {

// ---- blas_core.cpp ----

// Fills info's library, cpu, core, openblas_core, switched, reason and warning for the core
// OpenBLAS runs now; changes nothing. Returns the core init_process would restart the program on,
// or "" when OpenBLAS's core stands (or a restart already happened).
std::string describe_core(BlasInfo& info);

// ---- blas.cpp ----

// OpenBLAS's sgemm and dgemm against a plain loop, exactly.
bool openblas_self_check();

// Fills blas_info() once (the core, the float engine, the bf16 engine).
void ensure_checked();

// One single-threaded call: OpenBLAS, or the float engine for float.
void openblas_gemm(bool trans_a, bool trans_b, int m, int n, int k, float alpha, const float* a,
                   int lda, const float* b, int ldb, float beta, float* c, int ldc);
void openblas_gemm(bool trans_a, bool trans_b, int m, int n, int k, double alpha, const double* a,
                   int lda, const double* b, int ldb, double beta, double* c, int ldc);
void serial_gemm(bool trans_a, bool trans_b, int m, int n, int k, float alpha, const float* a,
                 int lda, const float* b, int ldb, float beta, float* c, int ldc);
void serial_gemm(bool trans_a, bool trans_b, int m, int n, int k, double alpha, const double* a,
                 int lda, const double* b, int ldb, double beta, double* c, int ldc);

bool env_is_one(const char* name);
void add_warning(BlasInfo& info, const std::string& warning);

// Below this many multiply-adds a gemm runs on one thread: forking costs more than it saves.
constexpr double kParallelGemmMinWork = 1 << 20;
// Chunks are multiples of this many rows (or columns), the register blocking of the kernels.
constexpr int kChunkAlign = 16;

// Outside a parallel region, with several attnlab threads and enough work, the gemm is cut into
// num_threads() (the calling thread's count) contiguous blocks of rows of C (or of columns, when C
// is wider than tall), one per thread, each an independent single-threaded call of `serial` (a
// BLAS call, or a bf16 matmul: TA is the element type of A and B). OpenBLAS itself stays at one
// thread (threads.hpp); inside attention's parallel loops every gemm runs serially. The cut depends
// only on the shapes and the thread count, so results are deterministic for a fixed thread count.
template <class TA, class T, class Serial>
void split_gemm(const Serial& serial, bool trans_a, bool trans_b, int m, int n, int k, T alpha,
                const TA* a, int lda, const TA* b, int ldb, T beta, T* c, int ldc) {
  const int threads = num_threads();
  const bool split = threads > 1 && !omp_in_parallel() &&
                     static_cast<double>(m) * n * k >= kParallelGemmMinWork &&
                     std::max(m, n) >= 2 * kChunkAlign;
  if (!split) {
    serial(trans_a, trans_b, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
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
      const TA* a_part = trans_a ? a + begin : a + static_cast<std::ptrdiff_t>(begin) * lda;
      serial(trans_a, trans_b, size, n, k, alpha, a_part, lda, b, ldb, beta,
             c + static_cast<std::ptrdiff_t>(begin) * ldc, ldc);
    } else {
      // Columns [begin, begin + size) of op(B) and of C.
      const TA* b_part = trans_b ? b + static_cast<std::ptrdiff_t>(begin) * ldb : b + begin;
      serial(trans_a, trans_b, m, size, k, alpha, a, lda, b_part, ldb, beta, c + begin, ldc);
    }
  }
}

// One gemm (37 x 29 x 41, odd on purpose, padded leading dimensions) against a plain loop. Inputs
// are multiples of 1/4 in [-5/4, 5/4], so every product and partial sum is exact in float: any
// correct kernel, in any summation order, returns exactly the loop's result.
template <class T, class Gemm>
bool gemm_exact(const Gemm& gemm, bool trans_a, bool trans_b, bool corrupt) {
  constexpr int m = 37, n = 29, k = 41, pad = 3;
  const int lda = (trans_a ? m : k) + pad, ldb = (trans_b ? k : n) + pad, ldc = n + pad;
  auto fill = [](std::vector<T>& x, int shift) {
    for (std::size_t i = 0; i < x.size(); ++i)
      x[i] = static_cast<T>(static_cast<int>((i * 7 + shift) % 11) - 5) / 4;
  };
  std::vector<T> a(static_cast<std::size_t>((trans_a ? k : m) * lda));
  std::vector<T> b(static_cast<std::size_t>((trans_b ? n : k) * ldb));
  std::vector<T> c(static_cast<std::size_t>(m * ldc));
  fill(a, 0);
  fill(b, 3);
  fill(c, 5);
  std::vector<T> expected = c;
  for (int i = 0; i < m; ++i) {
    for (int j = 0; j < n; ++j) {
      T sum = 0;
      for (int p = 0; p < k; ++p)
        sum += (trans_a ? a[p * lda + i] : a[i * lda + p]) *
               (trans_b ? b[j * ldb + p] : b[p * ldb + j]);
      expected[i * ldc + j] = T(0.5) * sum + T(0.25) * expected[i * ldc + j];
    }
  }
  gemm(trans_a, trans_b, m, n, k, T(0.5), a.data(), lda, b.data(), ldb, T(0.25), c.data(), ldc);
  if (corrupt) c[ldc + 1] += 1;  // ATTNLAB_BLAS_SIMULATE_BAD_KERNEL
  return c == expected;
}

// ---- blas_onednn.cpp ----

using FloatGemm = void (*)(bool trans_a, bool trans_b, int m, int n, int k, float alpha,
                           const float* a, int lda, const float* b, int ldb, float beta, float* c,
                           int ldc);

// Everything the dispatch takes from oneDNN, in one table: onednn() is null in a build without
// oneDNN, so no call can reach oneDNN code that was not built, and no stub stands in for it.
struct OneDnn {
  // oneDNN's sgemm on the calling thread alone; operands at a stride of a multiple of 2 KB read
  // through a copy (cache-set conflicts).
  FloatGemm gemm;
  // One part of a bf16 gemm in oneDNN's bf16 matmul, on the calling thread alone: A and B are
  // bf16 bits (copy_rounded).
  void (*bf16_part)(bool trans_a, bool trans_b, int m, int n, int k, float alpha,
                    const std::uint16_t* a, int lda, const std::uint16_t* b, int ldb, float beta,
                    float* c, int ldc);
  bool (*self_check)();       // the sgemm against a plain loop
  bool (*bf16_self_check)();  // the bf16 matmul, likewise
  std::string (*name)();      // "oneDNN 2.6.3, avx512_core_bf16 kernels"
  bool (*amx)();              // oneDNN's kernels use AMX tiles
  bool (*bf16_units)();       // ... bf16 units faster than the emulation: AMX, AMD's AVX-512 BF16
};
const OneDnn* onednn();

// ---- blas_bf16.cpp ----

// bf16 bits of x in the high half, rounded to nearest, ties to even (a NaN stays a quiet NaN;
// overflow gives inf), as PyTorch's .bfloat16() and io/safetensors.hpp's float_to_bf16: the one
// rounding of every bf16 operand (the gemms here, the attention's bf16 tiles). Branch-free, so the
// copy loops vectorise.
inline std::uint32_t bf16_high_bits(float x) {
  std::uint32_t u;
  std::memcpy(&u, &x, sizeof u);
  const std::uint32_t rounded = (u + 0x7fffu + ((u >> 16) & 1u)) & 0xffff0000u;
  const std::uint32_t quiet_nan = (u | 0x00400000u) & 0xffff0000u;
  return (u & 0x7fffffffu) > 0x7f800000u ? quiet_nan : rounded;
}

// A matrix of `rows` x `cols` stored with row stride ld, copied with row stride cols, each value
// rounded to bf16: as a float (the emulated path) or as bf16 bits (oneDNN's bf16 matmul); with
// column_sums, also each column's sum in row order (Bf16Operand::round).
void copy_rounded(const float* src, int rows, int cols, int ld, float* __restrict dst,
                  float* column_sums = nullptr);
void copy_rounded(const float* src, int rows, int cols, int ld, std::uint16_t* __restrict dst,
                  float* column_sums = nullptr);
// One row of `cols` floats rounded into bf16 bits, as bf16_high_bits, on this thread.
void round_row_bf16(const float* __restrict in, int cols, std::uint16_t* __restrict out);
bool bf16_active();  // a GemmPrecisionScope(bf16) is alive

void bf16_gemm(bool trans_a, bool trans_b, int m, int n, int k, float alpha, const float* a,
               int lda, const float* b, int ldb, float beta, float* c, int ldc);
// Fills info's bf16 fields from ATTNLAB_BF16 (after the engine: the emulated path runs in it).
void select_bf16(BlasInfo& info);

}  // namespace detail
}  // namespace blas
}  // namespace attnlab
