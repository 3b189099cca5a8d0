// The one place that calls a GEMM library. Row-major, explicit leading dimensions, float and
// double. Every matmul in attnlab goes through here: never write a matmul as an xtensor expression.
// It also makes sure OpenBLAS runs kernels the CPU supports (blas::init, blas_info), and chooses
// the engine of float GEMMs: oneDNN where it is built in (faster on the shapes of a training step:
// tests/bench/README.md), else OpenBLAS. Double GEMMs always run in OpenBLAS (oneDNN has none).
#pragma once

#include <string>

namespace attnlab {

// The CPU features that decide the BLAS kernels, read with __builtin_cpu_supports (which also
// requires the OS to save the AVX / AVX-512 registers).
struct CpuFeatures {
  bool avx2 = false, fma = false;
  bool avx512f = false, avx512bw = false, avx512dq = false, avx512vl = false;
  bool avx512bf16 = false;
};

// The library that runs float GEMMs (double ones always run in OpenBLAS).
enum class GemmEngine { openblas, onednn };

// Which BLAS kernels attnlab runs, and why. Filled by blas::init(), or read-only by the first gemm
// when init was not called.
struct BlasInfo {
  std::string library;        // e.g. "OpenBLAS 0.3.21"
  std::string core;           // the kernels in use (openblas_get_corename() after blas::init)
  std::string openblas_core;  // the core OpenBLAS chose by itself when it loaded
  bool switched = false;      // attnlab moved OpenBLAS from openblas_core to core
  std::string reason;         // why it switched, or why it did not
  CpuFeatures cpu;
  // The engine of float GEMMs, from ATTNLAB_GEMM (auto | onednn | openblas; auto: oneDNN when it
  // is built in), its name ("oneDNN 2.6.3, avx512_core_bf16 kernels" or the OpenBLAS library) and
  // why it was chosen. oneDNN is checked like a switched core (the exact gemm against a plain
  // loop) and left for OpenBLAS, with a warning, when it fails.
  GemmEngine engine = GemmEngine::openblas;
  std::string engine_name;
  std::string engine_reason;
  std::string warning;  // empty unless something went wrong; the app shows it, the library never
};

// The result of blas::init(), or, when init was not called, of the read-only check the first gemm
// runs (which switches nothing and says in `warning` when init would).
const BlasInfo& blas_info();

// One line: "OpenBLAS 0.3.21, core SkylakeX (switched from Prescott: <reason>)" or
// "OpenBLAS 0.3.21, core Cooperlake (<reason>)", then "; float gemm: <engine_name> (<reason>)".
std::string blas_summary(const BlasInfo& info);

// "onednn" or "openblas".
const char* to_string(GemmEngine engine);

// True when this attnlab was built with oneDNN (the ATTNLAB_ONEDNN CMake switch).
bool onednn_built();

// "avx2 fma avx512f ..." (the features present, in this order), or "none".
std::string to_string(const CpuFeatures& cpu);

// The machine's measured GEMM peak in GFLOP/s, the denominator of MFU: `threads` OpenMP threads
// (>= 1; std::invalid_argument otherwise) each run single-threaded sgemm (T = float) or dgemm on
// square matrices of side n (default 1024) of their own, as attnlab's parallel loops do; the best
// of `rounds` rounds, the flops of the threads OpenMP actually gave (fewer when called inside a
// parallel region) over the round's wall time. Takes (rounds + 1) × 3 gemms of 2·n³ flops per
// thread (about 0.1 s at 1024 on a 100 GFLOP/s core) and 3 · n² values per thread of memory.
template <class T>
double measure_gemm_peak_gflops(int threads, int n = 1024, int rounds = 3);

namespace blas {

// Chooses the BLAS kernels. Call it once at program start, before starting threads: a core switch
// sets OPENBLAS_CORETYPE for its duration, which races with any thread reading the environment
// (the attnlab CLI calls it first). Later calls do nothing. No other attnlab call changes the
// process: a gemm before init only checks, read-only, which core init would choose (BlasInfo says
// so in its warning). A switch waits for attnlab's gemms in flight. OpenBLAS's DYNAMIC_ARCH picks a
// core from the CPU model; on models it does not know (0.3.21 on Emerald Rapids) it falls back to a
// generic SSE core such as Prescott, several times slower. When the core is such a fallback and the
// CPU has AVX-512 (F, BW, DQ, VL) or AVX2 + FMA, init switches OpenBLAS to Cooperlake (AVX-512
// BF16) / SkylakeX / Haswell, checks a small sgemm and dgemm against a plain loop, and switches
// back on a mismatch (BlasInfo::warning says so). Environment:
//   OPENBLAS_CORETYPE set       the user chose: attnlab changes nothing;
//   ATTNLAB_BLAS_CORE=keep      keep OpenBLAS's choice;
//   ATTNLAB_BLAS_CORE=<core>    use this core: Prescott, Core2, Nehalem, Sandybridge, Haswell, Zen,
//                               SkylakeX or Cooperlake (refused, with a warning, if the CPU lacks
//                               its instructions);
//   ATTNLAB_GEMM=auto|onednn|openblas   the engine of float GEMMs (BlasInfo::engine); another
//                               value, or onednn in a build without it, is ignored with a warning;
//   ATTNLAB_BLAS_SIMULATE_FALLBACK=1, ATTNLAB_BLAS_SIMULATE_BAD_KERNEL=1   for tests only: treat
//                               the core named by OPENBLAS_CORETYPE as OpenBLAS's own fallback;
//                               make the self-check fail (of the core, and of oneDNN).
// Not safe against BLAS calls made outside attnlab at the same moment (see blas.cpp).
void init();

// True once init() has run in this process.
bool initialized();

// C (m, n) = alpha * op(A) (m, k) * op(B) (k, n) + beta * C, all row-major.
// op(X) is X or X^T; lda/ldb/ldc are the row strides of A, B and C as stored, so a head slice of a
// (B, T, H*D) activation is passed with ld = H*D and no copy. With beta = 0, C is assigned
// (its previous contents, even NaN, are ignored); otherwise it is added to.
// Called outside a parallel region with num_threads() > 1 (the calling thread's count, threads.hpp)
// and a large enough product, the rows (or columns) of C are split over that many threads, one
// single-threaded BLAS call each; deterministic for a fixed thread count and engine. Inside a
// parallel region it always runs serially. Float GEMMs run in BlasInfo::engine.
template <class T>
void gemm(bool trans_a, bool trans_b, int m, int n, int k, T alpha, const T* a, int lda, const T* b,
          int ldb, T beta, T* c, int ldc);

}  // namespace blas
}  // namespace attnlab
