// OpenBLAS's cblas.h is included here and only here (it clashes with xtensor-blas's declarations).
#include "attnlab/blas.hpp"

#include <cblas.h>
#include <omp.h>
#ifdef ATTNLAB_WITH_ONEDNN
#include <oneapi/dnnl/dnnl.h>

#include <oneapi/dnnl/dnnl.hpp>
#endif

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>
#include <tuple>
#include <vector>

#include "attnlab/threads.hpp"
#include "blas_private.hpp"

namespace attnlab {
namespace blas {

namespace {

CBLAS_TRANSPOSE to_cblas(bool trans) {
  return trans ? CblasTrans : CblasNoTrans;
}

// The engine of float gemms (BlasInfo::engine), set once by ensure_checked before any gemm runs.
std::atomic<GemmEngine> float_engine{GemmEngine::openblas};

void openblas_gemm(bool trans_a, bool trans_b, int m, int n, int k, float alpha, const float* a,
                   int lda, const float* b, int ldb, float beta, float* c, int ldc) {
  cblas_sgemm(CblasRowMajor, to_cblas(trans_a), to_cblas(trans_b), m, n, k, alpha, a, lda, b, ldb,
              beta, c, ldc);
}

void openblas_gemm(bool trans_a, bool trans_b, int m, int n, int k, double alpha, const double* a,
                   int lda, const double* b, int ldb, double beta, double* c, int ldc) {
  cblas_dgemm(CblasRowMajor, to_cblas(trans_a), to_cblas(trans_b), m, n, k, alpha, a, lda, b, ldb,
              beta, c, ldc);
}

#ifdef ATTNLAB_WITH_ONEDNN
// Cache-set conflicts in oneDNN's sgemm. It reads an operand stored k rows deep (B when not
// transposed, A when transposed) a panel at a time down those k rows; when the rows lie a multiple
// of 2 KB apart (a row stride of 512, 1024... floats: a d_ff of 512, attention's T x T
// probabilities) the panel's lines fall into a few cache sets and evict each other. Measured alone
// on a Zen 3 (avx2 kernels, one thread each on two cores, copy included): x (384, 128) · W (128,
// 512) at 69 GFLOP/s with W's own stride 512 and at 95 through a copy at stride 528; the weight
// gradient x^T (128, 384) · dy (384, 512) at 47-57 and 83-88; P^T (64, 1024) · dO (1024, 64) at
// 41 and 77. Strides of 128 and 256 floats gained on some shapes and lost up to 30% on others (a
// (2112, 256) operand), and OpenBLAS (its Zen core) lost nothing to any of them, so only oneDNN's
// operands at multiples of 2 KB are copied: at a stride off those multiples, when at least
// kRestageRows deep and the other side of C at least kRestageOther wide (the copy is k times the
// operand's width, the gemm k times both widths, so a narrow C would not pay for it). The same
// shapes take the same path, so the bits still depend only on the thread count.
// An operand over kRestageMax floats (8 MiB) is read in place: the copies stay within 16 MiB per
// thread, kept for the next call (attention's T x T probabilities at T 4096 would add 64 MiB per
// thread, and a copy of that size gains nothing measurable).
constexpr int kConflictStride = 512;  // floats: 2 KB
constexpr int kRestageRows = 128;
constexpr int kRestageOther = 32;
constexpr std::size_t kRestageMax = std::size_t(2) << 20;

bool restage(int ld, int rows, int width, int other) {
  return ld % kConflictStride == 0 && rows >= kRestageRows && other >= kRestageOther &&
         static_cast<std::size_t>(rows) * static_cast<std::size_t>(width) <= kRestageMax;
}

// rows x width floats from src (row stride ld) into buf, at a row stride of width rounded up to 16
// floats (64-byte rows), moved off the multiples of kConflictStride; returns that stride.
int restaged(const float* src, int rows, int width, int ld, std::vector<float>& buf) {
  int stride = (width + 15) / 16 * 16;
  if (stride % kConflictStride == 0) stride += 16;
  buf.resize(static_cast<std::size_t>(rows) * static_cast<std::size_t>(stride));
  for (int r = 0; r < rows; ++r)
    std::memcpy(buf.data() + static_cast<std::ptrdiff_t>(r) * stride,
                src + static_cast<std::ptrdiff_t>(r) * ld,
                static_cast<std::size_t>(width) * sizeof(float));
  return stride;
}

// oneDNN's sgemm on the calling thread alone. Inside an active parallel region oneDNN runs serially
// by itself; outside one it would start omp_get_max_threads() threads, so the calling thread's
// OpenMP count is 1 for the call (attnlab splits a gemm across threads itself: gemm_impl). A
// status other than success (which the arguments attnlab passes never give) falls back to OpenBLAS.
void onednn_gemm(bool trans_a, bool trans_b, int m, int n, int k, float alpha, const float* a,
                 int lda, const float* b, int ldb, float beta, float* c, int ldc) {
  // Per thread, kept: the copies of the operands that restage picks (above).
  thread_local std::vector<float> a_copy, b_copy;
  if (trans_a && restage(lda, k, m, n)) {
    lda = restaged(a, k, m, lda, a_copy);
    a = a_copy.data();
  }
  if (!trans_b && restage(ldb, k, n, m)) {
    ldb = restaged(b, k, n, ldb, b_copy);
    b = b_copy.data();
  }
  const bool serial = !omp_in_parallel();
  const int previous = serial ? omp_get_max_threads() : 1;
  if (serial && previous != 1) omp_set_num_threads(1);
  const dnnl_status_t status = dnnl_sgemm(trans_a ? 'T' : 'N', trans_b ? 'T' : 'N', m, n, k, alpha,
                                          a, lda, b, ldb, beta, c, ldc);
  if (serial && previous != 1) omp_set_num_threads(previous);
  if (status != dnnl_success)
    openblas_gemm(trans_a, trans_b, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
}
#endif

void serial_gemm(bool trans_a, bool trans_b, int m, int n, int k, float alpha, const float* a,
                 int lda, const float* b, int ldb, float beta, float* c, int ldc) {
#ifdef ATTNLAB_WITH_ONEDNN
  if (float_engine.load(std::memory_order_relaxed) == GemmEngine::onednn) {
    onednn_gemm(trans_a, trans_b, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
    return;
  }
#endif
  openblas_gemm(trans_a, trans_b, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
}

void serial_gemm(bool trans_a, bool trans_b, int m, int n, int k, double alpha, const double* a,
                 int lda, const double* b, int ldb, double beta, double* c, int ldc) {
  openblas_gemm(trans_a, trans_b, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
}

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

template <class T>
void gemm_impl(bool trans_a, bool trans_b, int m, int n, int k, T alpha, const T* a, int lda,
               const T* b, int ldb, T beta, T* c, int ldc) {
  const auto serial = [](auto... args) { serial_gemm(args...); };
  split_gemm(serial, trans_a, trans_b, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
}

// ---- bf16 gemms (GemmPrecision::bf16) ----

// bf16 bits of x, rounded to nearest, ties to even (a NaN stays a quiet NaN; overflow gives inf),
// as PyTorch's .bfloat16() and io/safetensors.hpp's float_to_bf16. Branch-free, so the copy loops
// below vectorise.
inline std::uint32_t bf16_high_bits(float x) {
  std::uint32_t u;
  std::memcpy(&u, &x, sizeof u);
  const std::uint32_t rounded = (u + 0x7fffu + ((u >> 16) & 1u)) & 0xffff0000u;
  const std::uint32_t quiet_nan = (u | 0x00400000u) & 0xffff0000u;
  return (u & 0x7fffffffu) > 0x7f800000u ? quiet_nan : rounded;
}

// A matrix of `rows` x `cols` stored with row stride ld, copied with row stride cols, each value
// rounded to bf16: as a float (the emulated path) or as bf16 bits (oneDNN's bf16 matmul).
void copy_rounded(const float* src, int rows, int cols, int ld, float* __restrict dst) {
  for (int r = 0; r < rows; ++r) {
    const float* __restrict in = src + static_cast<std::ptrdiff_t>(r) * ld;
    float* __restrict out = dst + static_cast<std::ptrdiff_t>(r) * cols;
    for (int j = 0; j < cols; ++j) {
      const std::uint32_t bits = bf16_high_bits(in[j]);
      std::memcpy(&out[j], &bits, sizeof bits);
    }
  }
}

#ifdef ATTNLAB_WITH_ONEDNN
void copy_rounded(const float* src, int rows, int cols, int ld, std::uint16_t* __restrict dst) {
  for (int r = 0; r < rows; ++r) {
    const float* __restrict in = src + static_cast<std::ptrdiff_t>(r) * ld;
    std::uint16_t* __restrict out = dst + static_cast<std::ptrdiff_t>(r) * cols;
    for (int j = 0; j < cols; ++j) out[j] = static_cast<std::uint16_t>(bf16_high_bits(in[j]) >> 16);
  }
}
#endif

// The precision of float gemms and how bf16 ones run; set before any gemm like float_engine.
std::atomic<int> bf16_scopes{0};  // GemmPrecisionScope(bf16)s alive in the process
std::atomic<Bf16Engine> bf16_engine{Bf16Engine::emulated};

#ifdef ATTNLAB_WITH_ONEDNN
// oneDNN's matmul primitive for one gemm shape: C = alpha · op(A) op(B) + beta · C with A and B in
// `in` (bf16, or f32 for the tests of this path on any CPU) and C in f32, row-major with the
// leading dimensions given. Primitives cost 0.2-4 ms to create, so each thread keeps the ones it
// made, per shape (a step has a few dozen). nullopt where oneDNN has no such matmul on this CPU.
struct MatmulKey {
  bool bf16, trans_a, trans_b, accumulate;
  int m, n, k, lda, ldb, ldc;
  float alpha, beta;
  bool operator<(const MatmulKey& o) const {
    return std::tie(bf16, trans_a, trans_b, accumulate, m, n, k, lda, ldb, ldc, alpha, beta) <
           std::tie(o.bf16, o.trans_a, o.trans_b, o.accumulate, o.m, o.n, o.k, o.lda, o.ldb, o.ldc,
                    o.alpha, o.beta);
  }
};

struct Matmul {
  dnnl::memory::desc a, b, c;
  dnnl::matmul primitive;
};

const dnnl::engine& cpu_engine() {
  static const dnnl::engine engine(dnnl::engine::kind::cpu, 0);
  return engine;
}

const Matmul* find_matmul(const MatmulKey& key) {
  thread_local std::map<MatmulKey, std::optional<Matmul>> made;
  auto it = made.find(key);
  if (it == made.end()) {
    using dims = dnnl::memory::dims;
    using dt = dnnl::memory::data_type;
    std::optional<Matmul> matmul;
    try {
      const dt in = key.bf16 ? dt::bf16 : dt::f32;
      // op(A) is m x k: stored as k x m (row stride lda) when transposed, so its strides swap.
      const dnnl::memory::desc a(dims{key.m, key.k}, in,
                                 key.trans_a ? dims{1, key.lda} : dims{key.lda, 1});
      const dnnl::memory::desc b(dims{key.k, key.n}, in,
                                 key.trans_b ? dims{1, key.ldb} : dims{key.ldb, 1});
      const dnnl::memory::desc c(dims{key.m, key.n}, dt::f32, dims{key.ldc, 1});
      dnnl::primitive_attr attr;
      if (key.alpha != 1) attr.set_output_scales(0, {key.alpha});
      if (key.accumulate) {
        dnnl::post_ops ops;
        ops.append_sum(key.beta);
        attr.set_post_ops(ops);
      }
      const dnnl::matmul::primitive_desc pd(dnnl::matmul::desc(a, b, c), attr, cpu_engine());
      matmul = Matmul{a, b, c, dnnl::matmul(pd)};
    } catch (const dnnl::error&) {
      // unimplemented here: the caller falls back
    }
    it = made.emplace(key, std::move(matmul)).first;
  }
  return it->second ? &*it->second : nullptr;
}

// One matmul on the calling thread alone (as onednn_gemm). False when oneDNN has none for it.
bool onednn_matmul(bool bf16, bool trans_a, bool trans_b, int m, int n, int k, float alpha,
                   const void* a, int lda, const void* b, int ldb, float beta, float* c, int ldc) {
  const MatmulKey key{bf16, trans_a, trans_b, beta != 0, m, n, k, lda, ldb, ldc, alpha, beta};
  const Matmul* matmul = find_matmul(key);
  if (!matmul) return false;
  thread_local dnnl::stream stream(cpu_engine());
  const dnnl::memory a_mem(matmul->a, cpu_engine(), const_cast<void*>(a));
  const dnnl::memory b_mem(matmul->b, cpu_engine(), const_cast<void*>(b));
  const dnnl::memory c_mem(matmul->c, cpu_engine(), c);
  const bool serial = !omp_in_parallel();
  const int previous = serial ? omp_get_max_threads() : 1;
  if (serial && previous != 1) omp_set_num_threads(1);
  matmul->primitive.execute(
      stream, {{DNNL_ARG_SRC, a_mem}, {DNNL_ARG_WEIGHTS, b_mem}, {DNNL_ARG_DST, c_mem}});
  stream.wait();
  if (serial && previous != 1) omp_set_num_threads(previous);
  return true;
}
#endif

#ifdef ATTNLAB_WITH_ONEDNN
// A matrix of bf16 bits (rows x cols, row stride ld) widened into compact floats, exactly.
void widen(const std::uint16_t* src, int rows, int cols, int ld, std::vector<float>& dst) {
  dst.resize(static_cast<std::size_t>(rows) * cols);
  for (int r = 0; r < rows; ++r)
    for (int j = 0; j < cols; ++j) {
      const std::uint32_t bits =
          static_cast<std::uint32_t>(src[static_cast<std::ptrdiff_t>(r) * ld + j]) << 16;
      std::memcpy(&dst[static_cast<std::size_t>(r) * cols + j], &bits, sizeof bits);
    }
}

// One part of a bf16 gemm in oneDNN's bf16 matmul; a shape it has no matmul for (it passed the
// self-check, so none is expected) runs as the emulated path on the same rounded values.
void onednn_bf16_part(bool trans_a, bool trans_b, int m, int n, int k, float alpha,
                      const std::uint16_t* a, int lda, const std::uint16_t* b, int ldb, float beta,
                      float* c, int ldc) {
  if (onednn_matmul(true, trans_a, trans_b, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc)) return;
  thread_local std::vector<float> a32, b32;
  widen(a, trans_a ? k : m, trans_a ? m : k, lda, a32);
  widen(b, trans_b ? n : k, trans_b ? k : n, ldb, b32);
  serial_gemm(trans_a, trans_b, m, n, k, alpha, a32.data(), trans_a ? m : k, b32.data(),
              trans_b ? k : n, beta, c, ldc);
}
#endif

// A bf16 gemm: A and B rounded once into the calling thread's scratch (compact copies), then the
// product split over the threads as any gemm. On the oneDNN engine the copies are bf16 and each
// part a bf16 matmul; emulated, they are floats whose low 16 bits are zero and each part an fp32
// gemm of the float engine: every product of two bf16 values is exact in fp32 (8 + 8 significant
// bits), so it differs from a bf16 unit only in the order of the fp32 sums.
void bf16_gemm(bool trans_a, bool trans_b, int m, int n, int k, float alpha, const float* a,
               int lda, const float* b, int ldb, float beta, float* c, int ldc) {
  const int a_rows = trans_a ? k : m, a_cols = trans_a ? m : k;
  const int b_rows = trans_b ? n : k, b_cols = trans_b ? k : n;
  const auto a_size = static_cast<std::size_t>(a_rows) * a_cols;
  const auto b_size = static_cast<std::size_t>(b_rows) * b_cols;
#ifdef ATTNLAB_WITH_ONEDNN
  if (bf16_engine.load(std::memory_order_relaxed) == Bf16Engine::onednn) {
    thread_local std::vector<std::uint16_t> a16, b16;
    if (a16.size() < a_size) a16.resize(a_size);
    if (b16.size() < b_size) b16.resize(b_size);
    copy_rounded(a, a_rows, a_cols, lda, a16.data());
    copy_rounded(b, b_rows, b_cols, ldb, b16.data());
    split_gemm(onednn_bf16_part, trans_a, trans_b, m, n, k, alpha, a16.data(), a_cols, b16.data(),
               b_cols, beta, c, ldc);
    return;
  }
#endif
  thread_local std::vector<float> a32, b32;
  if (a32.size() < a_size) a32.resize(a_size);
  if (b32.size() < b_size) b32.resize(b_size);
  copy_rounded(a, a_rows, a_cols, lda, a32.data());
  copy_rounded(b, b_rows, b_cols, ldb, b32.data());
  gemm_impl(trans_a, trans_b, m, n, k, alpha, a32.data(), a_cols, b32.data(), b_cols, beta, c, ldc);
}

bool env_is_one(const char* name) {
  const char* v = std::getenv(name);
  return v && std::string(v) == "1";
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

}  // namespace

bool detail::openblas_self_check() {
  const bool corrupt = env_is_one("ATTNLAB_BLAS_SIMULATE_BAD_KERNEL");
  const auto sgemm = [](auto... args) { openblas_gemm(args...); };
  for (bool trans_a : {false, true}) {
    for (bool trans_b : {false, true}) {
      if (!gemm_exact<float>(sgemm, trans_a, trans_b, corrupt)) return false;
      if (!gemm_exact<double>(sgemm, trans_a, trans_b, false)) return false;
    }
  }
  return true;
}

namespace {

#ifdef ATTNLAB_WITH_ONEDNN
// oneDNN's sgemm, as the core's.
bool onednn_self_check() {
  const bool corrupt = env_is_one("ATTNLAB_BLAS_SIMULATE_BAD_KERNEL");
  const auto sgemm = [](auto... args) { onednn_gemm(args...); };
  for (bool trans_a : {false, true})
    for (bool trans_b : {false, true})
      if (!gemm_exact<float>(sgemm, trans_a, trans_b, corrupt)) return false;
  return true;
}

// "avx512_core_bf16": the kernels oneDNN dispatches to on this CPU.
const char* onednn_isa_name() {
  switch (dnnl_get_effective_cpu_isa()) {
    case dnnl_cpu_isa_sse41:
      return "sse41";
    case dnnl_cpu_isa_avx:
      return "avx";
    case dnnl_cpu_isa_avx2:
      return "avx2";
    case dnnl_cpu_isa_avx2_vnni:
      return "avx2_vnni";
    case dnnl_cpu_isa_avx512_core:
      return "avx512_core";
    case dnnl_cpu_isa_avx512_core_vnni:
      return "avx512_core_vnni";
    case dnnl_cpu_isa_avx512_core_bf16:
      return "avx512_core_bf16";
    case dnnl_cpu_isa_avx512_core_amx:
      return "avx512_core_amx";
    default:
      return "other";
  }
}

std::string onednn_name() {
  const dnnl_version_t* v = dnnl_version();
  char text[96];
  std::snprintf(text, sizeof text, "oneDNN %d.%d.%d, %s kernels", v->major, v->minor, v->patch,
                onednn_isa_name());
  return text;
}
#endif

void add_warning(BlasInfo& info, const std::string& warning) {
  info.warning += (info.warning.empty() ? "" : "; ") + warning;
}

// Fills info's engine fields from ATTNLAB_GEMM and sets float_engine. Changes nothing outside
// attnlab, so the check of a gemm before init runs it too.
void select_engine(BlasInfo& info) {
  const char* env = std::getenv("ATTNLAB_GEMM");
  const std::string request = env && *env ? env : "auto";
  const std::optional<GemmEngine> named = find_enum<GemmEngine>(request);
  info.engine = GemmEngine::openblas;
  info.engine_name = info.library;
  const bool built = onednn_built();
  if (named == GemmEngine::openblas) {
    info.engine_reason = "ATTNLAB_GEMM=" + request;
  } else if (request == "auto" || named == GemmEngine::onednn) {
    if (!built) {
      info.engine_reason = "built without oneDNN";
      if (named)
        add_warning(info, "ATTNLAB_GEMM=" + request +
                              " ignored: this attnlab was built without oneDNN; float gemms run "
                              "in " +
                              info.library);
    } else {
#ifdef ATTNLAB_WITH_ONEDNN
      const std::string why =
          named ? "ATTNLAB_GEMM=" + request : "faster than OpenBLAS on a step's shapes";
      if (onednn_self_check()) {
        info.engine = GemmEngine::onednn;
        info.engine_name = onednn_name();
        info.engine_reason = why;
      } else {
        info.engine_reason = "oneDNN failed attnlab's sgemm self-check";
        add_warning(info, onednn_name() + " failed attnlab's sgemm self-check (" + why +
                              "); float gemms run in " + info.library);
      }
#endif
    }
  } else {
    info.engine_reason = "ATTNLAB_GEMM=" + request + " is not an engine";
    add_warning(info, "ATTNLAB_GEMM=" + request + " ignored: expected auto, " +
                          enum_names<GemmEngine>(NameList::or_words) + "; float gemms run in " +
                          info.library);
  }
  float_engine.store(info.engine, std::memory_order_relaxed);
}

#ifdef ATTNLAB_WITH_ONEDNN
// oneDNN's bf16 matmul against a plain loop, as the engine's sgemm (the inputs are bf16 values).
bool onednn_bf16_self_check() {
  const bool corrupt = env_is_one("ATTNLAB_BLAS_SIMULATE_BAD_KERNEL");
  bool implemented = true;
  const auto matmul = [&implemented](bool ta, bool tb, int m, int n, int k, float alpha,
                                     const float* a, int lda, const float* b, int ldb, float beta,
                                     float* c, int ldc) {
    const int a_rows = ta ? k : m, b_rows = tb ? n : k;
    std::vector<std::uint16_t> a16(static_cast<std::size_t>(a_rows) * lda);
    std::vector<std::uint16_t> b16(static_cast<std::size_t>(b_rows) * ldb);
    copy_rounded(a, a_rows, lda, lda, a16.data());
    copy_rounded(b, b_rows, ldb, ldb, b16.data());
    if (!onednn_matmul(true, ta, tb, m, n, k, alpha, a16.data(), lda, b16.data(), ldb, beta, c,
                       ldc))
      implemented = false;
  };
  for (bool trans_a : {false, true})
    for (bool trans_b : {false, true})
      if (!gemm_exact<float>(matmul, trans_a, trans_b, corrupt) || !implemented) return false;
  return true;
}
#endif

// Fills info's bf16 fields from ATTNLAB_BF16 and sets bf16_engine (after select_engine: the
// emulated path runs in the float engine).
void select_bf16(BlasInfo& info) {
  const char* env = std::getenv("ATTNLAB_BF16");
  const std::string request = env && *env ? env : "auto";
  info.bf16_engine = Bf16Engine::emulated;
  info.bf16_engine_name = "emulated: operands rounded to bf16, fp32 gemm in " + info.engine_name;
  info.amx = false;
  std::string native_name;
#ifdef ATTNLAB_WITH_ONEDNN
  info.amx = dnnl_get_effective_cpu_isa() == dnnl_cpu_isa_avx512_core_amx;
  native_name = onednn_name() + ", bf16 matmul";
#endif
  const auto try_native = [&](const std::string& why) {
#ifdef ATTNLAB_WITH_ONEDNN
    if (onednn_bf16_self_check()) {
      info.bf16_engine = Bf16Engine::onednn;
      info.bf16_engine_name = native_name;
      info.bf16_reason = why;
      return true;
    }
    info.bf16_reason = "oneDNN's bf16 matmul is missing on this CPU or failed attnlab's self-check";
#else
    (void)why;
    info.bf16_reason = "built without oneDNN";
#endif
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
    if (!info.amx) {
      info.bf16_reason = "no AMX: oneDNN's bf16 gemms would run at half its fp32 speed";
    } else {
      // A failed check leaves bf16 emulated, said in bf16_reason only: auto never warns, since
      // bf16 is asked for by a run, not by the process, and fp32 runs are unaffected.
      try_native("AMX");
    }
  } else {
    info.bf16_reason = "ATTNLAB_BF16=" + request + " is not a bf16 engine";
    add_warning(info, "ATTNLAB_BF16=" + request + " ignored: expected auto, " +
                          enum_names<Bf16Engine>(NameList::or_words) + "; bf16 gemms are emulated");
  }
  bf16_engine.store(info.bf16_engine, std::memory_order_relaxed);
}

BlasInfo& info_storage() {
  static BlasInfo info;
  return info;
}

// Fills info_storage() once, before the first gemm or by init: the core, the float engine and the
// bf16 engine. Nothing in it changes after that (the core is chosen when OpenBLAS loads), so gemms
// in flight need no lock.
void ensure_checked() {
  static std::once_flag checked;
  std::call_once(checked, [] {
    (void)detail::describe_core(info_storage());
    select_engine(info_storage());
    select_bf16(info_storage());
  });
}

std::atomic<bool> init_called{false};

}  // namespace

void init() {
  ensure_checked();
  init_called.store(true, std::memory_order_release);
}

bool initialized() {
  return init_called.load(std::memory_order_acquire);
}

template <>
void gemm<float>(bool trans_a, bool trans_b, int m, int n, int k, float alpha, const float* a,
                 int lda, const float* b, int ldb, float beta, float* c, int ldc) {
  ensure_checked();
  if (bf16_scopes.load(std::memory_order_relaxed) > 0) {
    bf16_gemm(trans_a, trans_b, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
    return;
  }
  gemm_impl(trans_a, trans_b, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
}

GemmPrecision gemm_precision() {
  return bf16_scopes.load(std::memory_order_relaxed) > 0 ? GemmPrecision::bf16
                                                         : GemmPrecision::fp32;
}

GemmPrecisionScope::GemmPrecisionScope(GemmPrecision precision)
    : counted_(precision == GemmPrecision::bf16) {
  if (counted_) bf16_scopes.fetch_add(1);
}

GemmPrecisionScope::~GemmPrecisionScope() {
  if (counted_) bf16_scopes.fetch_sub(1);
}

namespace testing {
bool onednn_matmul_f32(bool trans_a, bool trans_b, int m, int n, int k, float alpha, const float* a,
                       int lda, const float* b, int ldb, float beta, float* c, int ldc) {
#ifdef ATTNLAB_WITH_ONEDNN
  return onednn_matmul(false, trans_a, trans_b, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
#else
  (void)trans_a, (void)trans_b, (void)m, (void)n, (void)k, (void)alpha, (void)a, (void)lda;
  (void)b, (void)ldb, (void)beta, (void)c, (void)ldc;
  return false;
#endif
}
}  // namespace testing

template <>
void gemm<double>(bool trans_a, bool trans_b, int m, int n, int k, double alpha, const double* a,
                  int lda, const double* b, int ldb, double beta, double* c, int ldc) {
  ensure_checked();
  gemm_impl(trans_a, trans_b, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
}

}  // namespace blas

const BlasInfo& blas_info() {
  blas::ensure_checked();
  return blas::info_storage();
}

std::string blas_summary(const BlasInfo& info) {
  std::string line = info.library + ", core " + info.core + " (";
  if (info.switched) line += "switched from " + info.openblas_core + ": ";
  line += info.reason + ")";
  if (!info.engine_name.empty())
    line += "; float gemm: " + info.engine_name + " (" + info.engine_reason + ")";
  if (!info.bf16_engine_name.empty())
    line += "; bf16 gemm: " + info.bf16_engine_name + " (" + info.bf16_reason + ")";
  return line;
}

bool onednn_built() {
#ifdef ATTNLAB_WITH_ONEDNN
  return true;
#else
  return false;
#endif
}

std::string to_string(const CpuFeatures& cpu) {
  std::string out;
  auto add = [&out](bool has, const char* name) {
    if (!has) return;
    if (!out.empty()) out += ' ';
    out += name;
  };
  add(cpu.avx2, "avx2");
  add(cpu.fma, "fma");
  add(cpu.avx512f, "avx512f");
  add(cpu.avx512bw, "avx512bw");
  add(cpu.avx512dq, "avx512dq");
  add(cpu.avx512vl, "avx512vl");
  add(cpu.avx512bf16, "avx512bf16");
  return out.empty() ? "none" : out;
}

}  // namespace attnlab

namespace attnlab {

// tensor.hpp's check_arg, declared here: this file includes cblas.h and keeps xtensor out.
void check_arg(bool ok, std::string_view op, std::string_view name, std::string_view what,
               std::string_view got);

template <class T>
double measure_gemm_peak_gflops(int threads, int n, int rounds) {
  const char* op = "measure_gemm_peak_gflops";
  check_arg(threads >= 1, op, "threads", ">= 1", std::to_string(threads));
  check_arg(n >= 16, op, "n", ">= 16", std::to_string(n));
  check_arg(rounds >= 1, op, "rounds", ">= 1", std::to_string(rounds));
  blas::ensure_checked();
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
        blas::serial_gemm(false, false, n, n, n, T(1), a[id].data(), n, b[id].data(), n, T(0),
                          c[id].data(), n);
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
