// The one place that calls a GEMM library. Row-major, explicit leading dimensions, float and
// double. Every matmul in attnlab goes through here: never write a matmul as an xtensor expression.
// It also makes sure OpenBLAS runs kernels the CPU supports (blas::init_process, blas_info), and
// chooses the engine of float GEMMs: oneDNN where it is built in (faster on the shapes of a
// training step: tests/bench/README.md), else OpenBLAS. Double GEMMs always run in OpenBLAS (oneDNN
// has none).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "attnlab/enum_table.hpp"
#include "attnlab/gemm_precision.hpp"

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

template <>
struct EnumTable<GemmEngine> {
  static constexpr EnumEntry<GemmEngine> entries[] = {
      {GemmEngine::onednn, "onednn", "oneDNN's sgemm"},
      {GemmEngine::openblas, "openblas", "OpenBLAS's sgemm"},
  };
  static constexpr EnumParseText parse = {"parse_gemm_engine", "engine"};
};

// The arithmetic of float GEMMs: GemmPrecision (attnlab/gemm_precision.hpp).

template <>
struct EnumTable<GemmPrecision> {
  static constexpr EnumEntry<GemmPrecision> entries[] = {
      {GemmPrecision::fp32, "fp32", "as stored"},
      {GemmPrecision::bf16, "bf16",
       "mixed precision: operands rounded to bfloat16, fp32 sums; weights, optimizer state, "
       "softmax, norms and loss stay fp32. On a CPU fast only with AMX (elsewhere emulated, "
       "slower than fp32); on a CUDA device cuBLAS bf16 GEMMs and tensor-core attention"},
      {GemmPrecision::tf32, "tf32",
       "operands rounded to TensorFloat-32 (10 mantissa bits), fp32 sums: tensor cores for an "
       "fp32 model; a CUDA device only"},
  };
  static constexpr EnumParseText parse = {"parse_gemm_precision", "", NameList::or_words, true};
};

// How bf16 GEMMs run. onednn: oneDNN's bf16 matmul primitives (the CPU's bf16 units); emulated:
// A and B rounded into fp32 copies (the low 16 bits zero) and an fp32 GEMM of the float engine.
// Every product of two bf16 values is exact in fp32, so the two differ only in the order of the
// fp32 sums; emulated is slower than fp32 by the rounding pass.
enum class Bf16Engine { onednn, emulated };

template <>
struct EnumTable<Bf16Engine> {
  static constexpr EnumEntry<Bf16Engine> entries[] = {
      {Bf16Engine::onednn, "onednn", "oneDNN's bf16 matmul"},
      {Bf16Engine::emulated, "emulated", "rounded fp32 copies through the float engine"},
  };
  static constexpr EnumParseText parse = {"parse_bf16_engine", "engine"};
};

// Which BLAS kernels attnlab runs, and why. Filled once: by blas::init() (init_process), or by the
// first gemm.
struct BlasInfo {
  std::string library;        // e.g. "OpenBLAS 0.3.21"
  std::string core;           // the kernels in use (openblas_get_corename())
  std::string openblas_core;  // the core OpenBLAS chose by itself (before a restart, if any)
  bool switched = false;      // init_process restarted the program from openblas_core on core
  std::string reason;         // why it switched, or why it did not
  CpuFeatures cpu;
  // The engine of float GEMMs, from ATTNLAB_GEMM (auto or a name of EnumTable<GemmEngine>; auto:
  // oneDNN when it is built in), its name ("oneDNN 2.6.3, avx512_core_bf16 kernels" or the OpenBLAS
  // library) and why it was chosen. oneDNN is checked like a switched core (the exact gemm against
  // a plain loop) and left for OpenBLAS, with a warning, when it fails.
  GemmEngine engine = GemmEngine::openblas;
  std::string engine_name;
  std::string engine_reason;
  // How bf16 GEMMs run (GemmPrecision::bf16), from ATTNLAB_BF16 (auto or a name of
  // EnumTable<Bf16Engine>; auto: oneDNN's bf16 matmul where oneDNN's kernels have AMX tiles, or
  // AVX-512 BF16 on an AMD CPU, emulated elsewhere, where oneDNN's bf16 GEMMs were measured slower
  // than the emulation), its name and why. oneDNN's bf16 matmul is checked like the engine (exact
  // products against a plain loop); under auto a failed check emulates without a warning
  // (bf16_reason says why).
  Bf16Engine bf16_engine = Bf16Engine::emulated;
  std::string bf16_engine_name;
  std::string bf16_reason;
  bool amx = false;         // oneDNN's kernels on this CPU use AMX tiles (avx512_core_amx)
  bool bf16_units = false;  // ... bf16 units that beat the emulation (AMX; AMD's avx512_core_bf16)
  std::string warning;  // empty unless something went wrong; the app shows it, the library never
};

// The kernels in use and why (filled once, by blas::init or the first gemm; where init_process
// would restart the program on another core, `warning` says so).
const BlasInfo& blas_info();

// One line: "OpenBLAS 0.3.21, core SkylakeX (switched from Prescott: <reason>)" or
// "OpenBLAS 0.3.21, core Cooperlake (<reason>)", then "; float gemm: <engine_name> (<reason>)".
std::string blas_summary(const BlasInfo& info);

// The names of the tables above; parse_gemm_precision throws std::invalid_argument "<what>:
// expected <the names>, got '<name>'" for another name.
inline const char* to_string(GemmEngine engine) {
  return enum_name(engine).data();
}
inline const char* to_string(GemmPrecision precision) {
  return enum_name(precision).data();
}
inline GemmPrecision parse_gemm_precision(const std::string& name, const std::string& what) {
  return parse_enum<GemmPrecision>(name, what, "");
}
inline const char* to_string(Bf16Engine engine) {
  return enum_name(engine).data();
}

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

// Chooses the BLAS kernels for the whole process: the one explicit, process-wide call, made first
// in main() (the attnlab CLI, its test runner and its benchmarks do), then init().
// OpenBLAS's DYNAMIC_ARCH picks its core once, while it loads, from OPENBLAS_CORETYPE or the CPU
// model; on models it does not know (0.3.21 on Emerald Rapids) it falls back to a generic SSE
// core such as Prescott, several times slower. When the core is such a fallback and the CPU has
// AVX-512 (F, BW, DQ, VL) or AVX2 + FMA, or ATTNLAB_BLAS_CORE asks for another core, init_process
// starts the program again (execve of /proc/self/exe with this argv, same pid) with
// OPENBLAS_CORETYPE=SkylakeX / Haswell / the asked core added to the new image's environment, and
// returns in that image. There it checks a small sgemm and dgemm against a plain loop, and on a
// mismatch starts once more on OpenBLAS's own core (BlasInfo::warning says so). No OpenBLAS
// internals are called and no environment variable of a running process is written. argv must be
// main's (std::invalid_argument otherwise); std::runtime_error if a failed self-check could not be
// undone. Where no restart is needed, it is init(). Environment:
//   OPENBLAS_CORETYPE set       the user chose: attnlab changes nothing;
//   ATTNLAB_BLAS_CORE=keep      keep OpenBLAS's choice;
//   ATTNLAB_BLAS_CORE=<core>    use this core: Prescott, Core2, Nehalem, Sandybridge, Haswell, Zen
//                               or SkylakeX (refused, with a warning, if the CPU lacks its
//                               instructions);
//   ATTNLAB_BLAS_RESTART        set by the restart for the new image ("<from>:<to>[:failed]");
//   ATTNLAB_GEMM=auto|<GemmEngine>      the engine of float GEMMs (BlasInfo::engine); another
//                               value, or onednn in a build without it, is ignored with a warning;
//   ATTNLAB_BF16=auto|<Bf16Engine>      how bf16 gemms run (BlasInfo::bf16_engine); onednn where
//                               oneDNN has no bf16 matmul, or another value, is ignored with a
//                               warning;
//   ATTNLAB_BLAS_SIMULATE_FALLBACK=1, ATTNLAB_BLAS_SIMULATE_BAD_KERNEL=1   for tests only: treat
//                               the core named by OPENBLAS_CORETYPE as OpenBLAS's own fallback;
//                               make the self-check fail (of the core, and of oneDNN).
void init_process(char* const argv[]);

// Fills blas_info() without restarting anything: OpenBLAS's core stands, and where init_process
// would restart the program on another core, BlasInfo::warning says so. A gemm before init runs the
// same check. Thread-safe; later calls do nothing.
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
// parallel region it always runs serially. Float GEMMs run in BlasInfo::engine; oneDNN reads an
// operand whose rows lie a multiple of 2 KB apart through a copy at another stride (cache-set
// conflicts: lib/README.md, "Numbers and parallelism"), with the same result.
template <class T>
void gemm(bool trans_a, bool trans_b, int m, int n, int k, T alpha, const T* a, int lda, const T* b,
          int ldb, T beta, T* c, int ldc);

// The precision of float gemms is a setting of the process, like the engine: bf16 while at least
// one GemmPrecisionScope(bf16) is alive on any thread (so that the OpenMP threads of a parallel
// step see it), fp32 otherwise. Runs on several threads at once (the study's jobs) therefore share
// it: a bf16 run makes a concurrent fp32 run's gemms bf16 too. The CPU has no tf32 mode: a
// GemmPrecisionScope(tf32) leaves the gemms fp32 (a device's is DeviceOps::set_precision).
GemmPrecision gemm_precision();

class GemmPrecisionScope {
 public:
  // fp32 changes nothing (it cannot undo another thread's bf16 scope).
  explicit GemmPrecisionScope(GemmPrecision precision);
  ~GemmPrecisionScope();
  GemmPrecisionScope(const GemmPrecisionScope&) = delete;
  GemmPrecisionScope& operator=(const GemmPrecisionScope&) = delete;

 private:
  bool counted_;
};

// A float matrix rounded to bf16 once, for several bf16 gemms: an op that reads the same operand in
// several gemms (a linear layer's W in every row chunk, dy in the backward's two products) rounds
// it once instead of once per gemm and thread. Stored compact (row stride cols()) as the bf16
// engine reads it: bf16 bits for oneDNN's matmul, floats whose low 16 bits are zero when emulated.
// gemm_bf16 on rounded operands gives the bits gemm<float> gives under a bf16 scope on the same
// values, for the same shapes and thread count.
class Bf16Operand {
 public:
  // Rows x cols of src (row stride ld >= cols), each value rounded as bf16_high_bits; split over
  // the threads when large and outside a parallel region. Reuses the storage of earlier calls.
  // With column_sums (cols floats), also column_sums[j] = the sum of src's column j in fp32, added
  // from 0 in row order (a linear's db from its dy): in the same pass where the rows are not split,
  // in a second pass over the columns where they are; the same bits either way.
  void round(const float* src, int rows, int cols, int ld, float* column_sums = nullptr);
  int rows() const { return rows_; }
  int cols() const { return cols_; }

 private:
  friend void gemm_bf16(bool, bool, int, int, int, float, const Bf16Operand&, int,
                        const Bf16Operand&, int, float, float*, int);
  std::vector<std::uint16_t> bits_;  // oneDNN's bf16 matmul
  std::vector<float> floats_;        // the emulated engine
  bool as_bits_ = false;
  int rows_ = 0, cols_ = 0;
};

// C (m, n) = alpha * op(A) * op(B) + beta * C in bf16 arithmetic (fp32 sums), as gemm<float> under
// a GemmPrecisionScope(bf16), where op(A) and op(B) start at rows a_row and b_row of the rounded
// operands (so a row chunk of a rounded matrix needs no copy). std::invalid_argument when the
// shapes do not fit: op(A)'s stored rows [a_row, a_row + (trans_a ? k : m)) within a.rows() and
// a.cols() == (trans_a ? m : k); likewise for B with (k, n).
void gemm_bf16(bool trans_a, bool trans_b, int m, int n, int k, float alpha, const Bf16Operand& a,
               int a_row, const Bf16Operand& b, int b_row, float beta, float* c, int ldc);

namespace testing {
// oneDNN's matmul primitive exactly as the oneDNN bf16 engine runs it (cached per shape, on the
// calling thread), with A and B in f32, so that its strides, transposes, alpha and beta are
// checked on a CPU without bf16 units. False when built without oneDNN or when oneDNN has none.
bool onednn_matmul_f32(bool trans_a, bool trans_b, int m, int n, int k, float alpha, const float* a,
                       int lda, const float* b, int ldb, float beta, float* c, int ldc);
}  // namespace testing

}  // namespace blas
}  // namespace attnlab
