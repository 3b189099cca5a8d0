// bf16 gemms (GemmPrecision::bf16): A and B rounded to bfloat16, fp32 sums, in oneDNN's bf16 matmul
// (blas_onednn.cpp) or emulated on the float engine; the process's precision setting.
#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <optional>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <vector>

#include "attnlab/device_ops.hpp"
#include "blas_private.hpp"

#ifdef __AVX2__
#include <immintrin.h>
#endif

namespace attnlab {
namespace blas {
namespace detail {

namespace {

// The precision of float gemms and how bf16 ones run; set before any gemm like float_engine.
std::atomic<int> bf16_scopes{0};  // GemmPrecisionScope(bf16)s alive in the process
std::atomic<Bf16Engine> bf16_engine{Bf16Engine::emulated};

#ifdef __AVX2__
// bf16_high_bits on 8 floats at once, bit for bit: round to nearest even, NaN made quiet. The
// result is the bf16 bits in each 32-bit lane's high half.
inline __m256i high_bits8(const float* x) {
  const __m256i u = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(x));
  const __m256i lsb = _mm256_and_si256(_mm256_srli_epi32(u, 16), _mm256_set1_epi32(1));
  const __m256i rounded = _mm256_add_epi32(_mm256_add_epi32(u, _mm256_set1_epi32(0x7fff)), lsb);
  const __m256i quiet = _mm256_or_si256(u, _mm256_set1_epi32(0x00400000));
  // |u| as a signed int is >= 0, so the signed compare is the unsigned one
  const __m256i nan = _mm256_cmpgt_epi32(_mm256_and_si256(u, _mm256_set1_epi32(0x7fffffff)),
                                         _mm256_set1_epi32(0x7f800000));
  return _mm256_and_si256(_mm256_blendv_epi8(rounded, quiet, nan),
                          _mm256_set1_epi32(static_cast<int>(0xffff0000u)));
}
#endif

void round_row(const float* __restrict in, int cols, float* __restrict out) {
  int j = 0;
#ifdef __AVX2__
  for (; j + 8 <= cols; j += 8)
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(out + j), high_bits8(in + j));
#endif
  for (; j < cols; ++j) {
    const std::uint32_t bits = bf16_high_bits(in[j]);
    std::memcpy(&out[j], &bits, sizeof bits);
  }
}

// The rows over the threads where the copy is large and no parallel region is running (a gemm
// called from one runs the copy on its own thread, as the gemm itself). Rows of floats or of bf16
// bits (round_row_bf16).
constexpr double kParallelCopyMinValues = 1 << 16;

template <class E>
void copy_row(const float* in, int cols, E* out) {
  if constexpr (std::is_same_v<E, float>) {
    round_row(in, cols, out);
  } else {
    round_row_bf16(in, cols, out);
  }
}

// sums[j] += row[j] for the columns [j0, j1).
void add_row(const float* __restrict row, int j0, int j1, float* __restrict sums) {
  for (int j = j0; j < j1; ++j) sums[j] += row[j];
}

// With sums, each column's sum in row order: beside the copy while the row is in cache, or, where
// the rows are split over the threads, after it with the columns split instead.
template <class E>
void copy_rows(const float* src, int rows, int cols, int ld, E* dst, float* sums) {
  const int threads = num_threads();
  const bool split = threads > 1 && !omp_in_parallel() &&
                     static_cast<double>(rows) * cols >= kParallelCopyMinValues;
  const auto row = [&](int r) { return src + static_cast<std::ptrdiff_t>(r) * ld; };
  if (sums) std::fill(sums, sums + cols, 0.0f);
  if (sums && !split) {
    for (int r = 0; r < rows; ++r) {
      copy_row(row(r), cols, dst + static_cast<std::ptrdiff_t>(r) * cols);
      add_row(row(r), 0, cols, sums);
    }
    return;
  }
#pragma omp parallel for num_threads(threads) schedule(static) if (split)
  for (int r = 0; r < rows; ++r)
    copy_row(row(r), cols, dst + static_cast<std::ptrdiff_t>(r) * cols);
  if (!sums) return;
#pragma omp parallel num_threads(threads)
  {
    const int t = omp_get_thread_num(), n = omp_get_num_threads();
    const int j0 = static_cast<int>(static_cast<std::int64_t>(cols) * t / n);
    const int j1 = static_cast<int>(static_cast<std::int64_t>(cols) * (t + 1) / n);
    for (int r = 0; r < rows; ++r) add_row(row(r), j0, j1, sums);
  }
}

}  // namespace

void round_row_bf16(const float* __restrict in, int cols, std::uint16_t* __restrict out) {
  int j = 0;
#ifdef __AVX2__
  for (; j + 16 <= cols; j += 16) {
    // packus works within 128-bit lanes: a0-3 b0-3 a4-7 b4-7, put back in order by the permute
    const __m256i a = _mm256_srli_epi32(high_bits8(in + j), 16);
    const __m256i b = _mm256_srli_epi32(high_bits8(in + j + 8), 16);
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(out + j),
                        _mm256_permute4x64_epi64(_mm256_packus_epi32(a, b), 0xd8));
  }
#endif
  for (; j < cols; ++j) out[j] = static_cast<std::uint16_t>(bf16_high_bits(in[j]) >> 16);
}

void copy_rounded(const float* src, int rows, int cols, int ld, float* __restrict dst,
                  float* column_sums) {
  copy_rows(src, rows, cols, ld, dst, column_sums);
}

void copy_rounded(const float* src, int rows, int cols, int ld, std::uint16_t* __restrict dst,
                  float* column_sums) {
  copy_rows(src, rows, cols, ld, dst, column_sums);
}

bool bf16_active() {
  return bf16_scopes.load(std::memory_order_relaxed) > 0;
}

namespace {

bool bf16_on_onednn() {
  return bf16_engine.load(std::memory_order_relaxed) == Bf16Engine::onednn;
}

// A product of compact rounded copies (row strides a_cols, b_cols) split over the threads as any
// gemm, each part oneDNN's bf16 matmul on bf16 bits or an fp32 gemm of the float engine on floats
// whose low 16 bits are zero: every product of two bf16 values is exact in fp32 (8 + 8 significant
// bits), so the two differ only in the order of the fp32 sums.
template <class E>
void rounded_product(bool trans_a, bool trans_b, int m, int n, int k, float alpha, const E* a,
                     int a_cols, const E* b, int b_cols, float beta, float* c, int ldc) {
  if constexpr (std::is_same_v<E, std::uint16_t>) {
    split_gemm(onednn()->bf16_part, trans_a, trans_b, m, n, k, alpha, a, a_cols, b, b_cols, beta, c,
               ldc);
  } else {
    const auto serial = [](auto... args) { serial_gemm(args...); };
    split_gemm(serial, trans_a, trans_b, m, n, k, alpha, a, a_cols, b, b_cols, beta, c, ldc);
  }
}

}  // namespace

// A bf16 gemm: A and B rounded once into the calling thread's operands (bf16 bits for oneDNN's
// bf16 matmul, floats for the emulation), then their product (gemm_bf16).
void bf16_gemm(bool trans_a, bool trans_b, int m, int n, int k, float alpha, const float* a,
               int lda, const float* b, int ldb, float beta, float* c, int ldc) {
  thread_local Bf16Operand a_rounded, b_rounded;
  a_rounded.round(a, trans_a ? k : m, trans_a ? m : k, lda);
  b_rounded.round(b, trans_b ? n : k, trans_b ? k : n, ldb);
  gemm_bf16(trans_a, trans_b, m, n, k, alpha, a_rounded, 0, b_rounded, 0, beta, c, ldc);
}

void select_bf16(BlasInfo& info) {
  const char* env = std::getenv("ATTNLAB_BF16");
  const std::string request = env && *env ? env : "auto";
  info.bf16_engine = Bf16Engine::emulated;
  info.bf16_engine_name = "emulated: operands rounded to bf16, fp32 gemm in " + info.engine_name;
  info.amx = false;
  info.bf16_units = false;
  const OneDnn* dnn = onednn();
  if (dnn) info.amx = dnn->amx(), info.bf16_units = dnn->bf16_units();
  const auto try_native = [&](const std::string& why) {
    if (!dnn) {
      info.bf16_reason = "built without oneDNN";
      return false;
    }
    if (dnn->bf16_self_check()) {
      info.bf16_engine = Bf16Engine::onednn;
      info.bf16_engine_name = dnn->name() + ", bf16 matmul";
      info.bf16_reason = why;
      return true;
    }
    info.bf16_reason = "oneDNN's bf16 matmul is missing on this CPU or failed attnlab's self-check";
    return false;
  };
  const std::optional<Bf16Engine> named = find_enum<Bf16Engine>(request);
  if (named == Bf16Engine::emulated) {
    info.bf16_reason = "ATTNLAB_BF16=" + request;
  } else if (named == Bf16Engine::onednn) {
    if (!try_native("ATTNLAB_BF16=" + request))
      add_warning(info, "ATTNLAB_BF16=" + request + " ignored (" + info.bf16_reason +
                            "); bf16 gemms are emulated");
  } else if (request == "auto") {
    if (!info.bf16_units) {
      info.bf16_reason =
          "no AMX, nor AMD's AVX-512 BF16: oneDNN's bf16 gemms would be slower than the emulation";
    } else {
      // A failed check leaves bf16 emulated, said in bf16_reason only: auto never warns, since
      // bf16 is asked for by a run, not by the process, and fp32 runs are unaffected.
      try_native(info.amx ? "AMX" : "AVX-512 BF16");
    }
  } else {
    info.bf16_reason = "ATTNLAB_BF16=" + request + " is not a bf16 engine";
    add_warning(info, "ATTNLAB_BF16=" + request + " ignored: expected auto, " +
                          enum_names<Bf16Engine>(NameList::or_words) + "; bf16 gemms are emulated");
  }
  bf16_engine.store(info.bf16_engine, std::memory_order_relaxed);
}

}  // namespace detail

GemmPrecision gemm_precision() {
  return detail::bf16_active() ? GemmPrecision::bf16 : GemmPrecision::fp32;
}

void Bf16Operand::round(const float* src, int rows, int cols, int ld, float* column_sums) {
  if (rows < 0 || cols < 0 || ld < cols)
    throw std::invalid_argument(
        "Bf16Operand::round: expected rows, cols >= 0 and ld >= cols, got " + std::to_string(rows) +
        ", " + std::to_string(cols) + " and " + std::to_string(ld));
  detail::ensure_checked();
  rows_ = rows;
  cols_ = cols;
  as_bits_ = detail::bf16_on_onednn();
  const auto size = static_cast<std::size_t>(rows) * cols;
  if (as_bits_) {
    bits_.resize(std::max(bits_.size(), size));
    detail::copy_rounded(src, rows, cols, ld, bits_.data(), column_sums);
  } else {
    floats_.resize(std::max(floats_.size(), size));
    detail::copy_rounded(src, rows, cols, ld, floats_.data(), column_sums);
  }
}

void gemm_bf16(bool trans_a, bool trans_b, int m, int n, int k, float alpha, const Bf16Operand& a,
               int a_row, const Bf16Operand& b, int b_row, float beta, float* c, int ldc) {
  const auto fits = [](const Bf16Operand& x, int row, int rows, int cols) {
    return row >= 0 && rows >= 0 && row + rows <= x.rows() && x.cols() == cols;
  };
  const auto shape = [](const Bf16Operand& x, int row) {
    return std::to_string(x.rows()) + " x " + std::to_string(x.cols()) + " from row " +
           std::to_string(row);
  };
  if (!fits(a, a_row, trans_a ? k : m, trans_a ? m : k) ||
      !fits(b, b_row, trans_b ? n : k, trans_b ? k : n) || a.as_bits_ != b.as_bits_)
    throw std::invalid_argument(
        "gemm_bf16: expected operands rounded by one engine holding op(A) (" + std::to_string(m) +
        " x " + std::to_string(k) + ") and op(B) (" + std::to_string(k) + " x " +
        std::to_string(n) + "), got A " + shape(a, a_row) + " and B " + shape(b, b_row));
  if (a.as_bits_) {
    detail::rounded_product(trans_a, trans_b, m, n, k, alpha,
                            a.bits_.data() + static_cast<std::ptrdiff_t>(a_row) * a.cols_, a.cols_,
                            b.bits_.data() + static_cast<std::ptrdiff_t>(b_row) * b.cols_, b.cols_,
                            beta, c, ldc);
  } else {
    detail::rounded_product(
        trans_a, trans_b, m, n, k, alpha,
        a.floats_.data() + static_cast<std::ptrdiff_t>(a_row) * a.cols_, a.cols_,
        b.floats_.data() + static_cast<std::ptrdiff_t>(b_row) * b.cols_, b.cols_, beta, c, ldc);
  }
}

GemmPrecisionScope::GemmPrecisionScope(GemmPrecision precision)
    : counted_(precision == GemmPrecision::bf16) {
  if (counted_) detail::bf16_scopes.fetch_add(1);
}

GemmPrecisionScope::~GemmPrecisionScope() {
  if (counted_) detail::bf16_scopes.fetch_sub(1);
}

}  // namespace blas

void refuse_precision(const std::string& backend, GemmPrecision precision) {
  throw std::invalid_argument("set_precision: expected fp32 on " + backend + ", got '" +
                              std::string(enum_name(precision)) + "'");
}

}  // namespace attnlab
