// Everything of oneDNN (Debian's libdnnl-dev 2.6.3): its sgemm as the float engine, its matmul
// primitives for bf16 gemms, and their self-checks. The one file built with oneDNN
// (ATTNLAB_WITH_ONEDNN, cmake/AttnlabOneDnn.cmake). The dispatch reaches it through one table,
// detail::onednn(), which is null without oneDNN.
#include <omp.h>

#include <cstdint>
#include <cstdio>
#include <cstring>
#include <map>
#include <optional>
#include <stdexcept>
#include <string>
#include <tuple>
#include <vector>

#ifdef ATTNLAB_WITH_ONEDNN
#include <oneapi/dnnl/dnnl.h>

#include <oneapi/dnnl/dnnl.hpp>
#endif

#include "blas_private.hpp"

namespace attnlab {

bool onednn_built() {
  return blas::detail::onednn() != nullptr;
}

namespace blas {

#ifdef ATTNLAB_WITH_ONEDNN
namespace detail {

// Cache-set conflicts in oneDNN's sgemm. It reads an operand stored k rows deep (B when not
// transposed, A when transposed) a panel at a time down those k rows; when the rows lie a multiple
// of 2 KB apart (a row stride of 512, 1024... floats: a d_ff of 512, attention's T x T
// probabilities) the panel's lines fall into a few cache sets and evict each other; the same
// product through a copy at another stride runs markedly faster, copy included. Other strides
// (128, 256 floats) helped some shapes and hurt others, and OpenBLAS's kernels showed no such loss
// (the timings: tests/bench/README.md, "GEMM operands read through a copy"), so only oneDNN's
// operands at multiples of 2 KB are copied: at a stride off those multiples, when at least
// kRestageRows deep and the other side of C at least kRestageOther wide (the copy is k times the
// operand's width, the gemm k times both widths, so a narrow C would not pay for it). The same
// shapes take the same path, so the bits still depend only on the thread count.
// The copies were measured to help oneDNN's avx2 kernels (a Zen 3); its avx512 kernels on a Xeon
// with AMX (family 6 model 167) ran about 3% slower with them (C 512 / T 256 and nanoGPT's shape,
// lib/README.md), so they are made only where oneDNN's kernels are narrower than AVX-512.
// An operand over kRestageMax floats (8 MiB) is read in place: the copies stay within 16 MiB per
// thread, kept for the next call (attention's T x T probabilities at T 4096 would add 64 MiB per
// thread, and a copy of that size gains nothing measurable).
constexpr int kConflictStride = 512;  // floats: 2 KB
constexpr int kRestageRows = 128;
constexpr int kRestageOther = 32;
constexpr std::size_t kRestageMax = std::size_t(2) << 20;

const char* onednn_isa_name();

bool restage(int ld, int rows, int width, int other) {
  static const bool narrow_kernels = std::strncmp(onednn_isa_name(), "avx512", 6) != 0;
  return narrow_kernels && ld % kConflictStride == 0 && rows >= kRestageRows &&
         other >= kRestageOther &&
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

// oneDNN's matmul primitive for one gemm shape: C = alpha · op(A) op(B) + beta · C with A and B in
// `in` (bf16, or f32 for the tests of this path on any CPU) and C in f32, row-major with the
// leading dimensions given. Primitives cost milliseconds to create, so each thread keeps the ones
// it made, per shape (a step has a few dozen). nullopt where oneDNN has no such matmul on this CPU.
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

// oneDNN's sgemm, as the core's.
bool onednn_self_check() {
  const bool corrupt = env_is_one("ATTNLAB_BLAS_SIMULATE_BAD_KERNEL");
  const auto sgemm = [](auto... args) { onednn_gemm(args...); };
  for (bool trans_a : {false, true})
    for (bool trans_b : {false, true})
      if (!gemm_exact<float>(sgemm, trans_a, trans_b, corrupt)) return false;
  return true;
}

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

bool onednn_amx() {
  return dnnl_get_effective_cpu_isa() == dnnl_cpu_isa_avx512_core_amx;
}

bool onednn_bf16_units() {
  const dnnl_cpu_isa_t isa = dnnl_get_effective_cpu_isa();
  if (isa == dnnl_cpu_isa_avx512_core_amx) return true;
#if defined(__x86_64__) || defined(__i386__)
  // AVX-512 BF16 without AMX: oneDNN's bf16 matmul beat the emulation on an AMD Zen 4 and ran at
  // half the fp32 speed on a Xeon (tests/bench/README.md, "bf16 on AVX-512 BF16"), so only AMD's
  // units count here.
  return isa == dnnl_cpu_isa_avx512_core_bf16 && __builtin_cpu_is("amd");
#else
  return false;
#endif
}

}  // namespace detail
#endif

namespace detail {

const OneDnn* onednn() {
#ifdef ATTNLAB_WITH_ONEDNN
  static constexpr OneDnn table{
      onednn_gemm, onednn_bf16_part, onednn_self_check, onednn_bf16_self_check,
      onednn_name, onednn_amx,       onednn_bf16_units};
  return &table;
#else
  return nullptr;
#endif
}

}  // namespace detail

namespace testing {
bool onednn_matmul_f32(bool trans_a, bool trans_b, int m, int n, int k, float alpha, const float* a,
                       int lda, const float* b, int ldb, float beta, float* c, int ldc) {
#ifdef ATTNLAB_WITH_ONEDNN
  return detail::onednn_matmul(false, trans_a, trans_b, m, n, k, alpha, a, lda, b, ldb, beta, c,
                               ldc);
#else
  (void)trans_a, (void)trans_b, (void)m, (void)n, (void)k, (void)alpha, (void)a, (void)lda;
  (void)b, (void)ldb, (void)beta, (void)c, (void)ldc;
  return false;
#endif
}
}  // namespace testing

}  // namespace blas
}  // namespace attnlab
