// OpenBLAS's cblas.h is included here and only here (it clashes with xtensor-blas's declarations).
#include "attnlab/blas.hpp"

#include <cblas.h>
#include <omp.h>
#include <strings.h>
#ifdef ATTNLAB_WITH_ONEDNN
#include <oneapi/dnnl/dnnl.h>
#endif

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <mutex>
#include <shared_mutex>
#include <string>
#include <string_view>
#include <vector>

#include "attnlab/threads.hpp"

// OpenBLAS's DYNAMIC_ARCH core selection (driver/others/dynamic.c). Weak: an OpenBLAS built for one
// fixed core lacks them, and attnlab then leaves its kernels alone.
extern "C" void gotoblas_dynamic_init(void) __attribute__((weak));
extern "C" void gotoblas_dynamic_quit(void) __attribute__((weak));

namespace attnlab {
namespace blas {

namespace {

CBLAS_TRANSPOSE to_cblas(bool trans) {
  return trans ? CblasTrans : CblasNoTrans;
}

// The engine of float gemms (BlasInfo::engine), set before any gemm runs: by init under the
// exclusive lock, or by the check of the first gemm; read by every gemm after ensure_checked.
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
// oneDNN's sgemm on the calling thread alone. Inside an active parallel region oneDNN runs serially
// by itself; outside one it would start omp_get_max_threads() threads, so the calling thread's
// OpenMP count is 1 for the call (attnlab splits a gemm across threads itself: gemm_impl). A
// status other than success (which the arguments attnlab passes never give) falls back to OpenBLAS.
void onednn_gemm(bool trans_a, bool trans_b, int m, int n, int k, float alpha, const float* a,
                 int lda, const float* b, int ldb, float beta, float* c, int ldc) {
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

// ---- Choosing the kernels (blas::init) ----
//
// Why switching OpenBLAS's core at run time is safe here (OpenBLAS 0.3.21, driver/others/dynamic.c
// and memory.c; the same in its pthread and OpenMP flavours, Debian links the pthread one):
// - gotoblas_dynamic_quit() only sets the global table pointer `gotoblas` to NULL, and
//   gotoblas_dynamic_init() points it at the table OPENBLAS_CORETYPE names and runs that table's
//   init(), which fills the core's blocking sizes (GEMM_P/Q/R, offsets, alignment) in its own
//   table. Nothing is freed or reallocated.
// - The work buffers of blas_memory_alloc() have one size, BUFFER_SIZE, fixed when memory.c is
//   compiled, once for all the cores of a DYNAMIC_ARCH library; every core's GEMM_P x GEMM_Q
//   blocks fit it, since OpenBLAS may itself start on any core (CPU model or OPENBLAS_CORETYPE).
// - A level-3 call reads the table (kernels and block sizes) while it runs and keeps nothing of
//   it between calls, so every call after the switch uses the new core throughout.
// - What is not safe is a BLAS call in flight during the switch: it would read a NULL table or mix
//   two cores. So every blas::gemm holds a shared lock of core_mutex() for its whole call and
//   blas::init switches under the exclusive lock, and OpenBLAS's own worker threads are idle
//   (attnlab pins OpenBLAS to 1 thread, and its workers only run inside a call). BLAS calls made
//   outside attnlab from another thread at that moment cannot be covered.
// - The switch sets OPENBLAS_CORETYPE for its duration (OpenBLAS reads the core from nowhere
//   else), and setenv races with any thread reading the environment. So only the explicit
//   blas::init switches, called by a program first, before it starts threads (the CLI does); a
//   gemm before init only checks, read-only, and says in BlasInfo::warning that init would switch.

// The instruction sets that separate OpenBLAS's x86-64 cores, in increasing order.
enum class Isa { sse3, ssse3, sse4_2, avx, avx2_fma, avx512, avx512_bf16 };

struct CoreName {
  const char* name;  // as openblas_get_corename() spells it
  Isa isa;           // what its kernels need
  bool forcible;     // accepted by ATTNLAB_BLAS_CORE
};

// dynamic.c's corename[] (0.3.21, plus SapphireRapids from 0.3.22). Every core below avx2_fma is a
// generic choice on a CPU that has AVX2 + FMA: the SSE cores are what OpenBLAS falls back to for
// models it does not know, the AVX ones (Sandybridge, the AMD Bulldozer family) predate AVX2.
constexpr CoreName kCores[] = {
    {"Unknown", Isa::sse3, false},
    {"Katmai", Isa::sse3, false},
    {"Coppermine", Isa::sse3, false},
    {"Northwood", Isa::sse3, false},
    {"Prescott", Isa::sse3, true},
    {"Banias", Isa::sse3, false},
    {"Atom", Isa::ssse3, false},
    {"Core2", Isa::ssse3, true},
    {"Penryn", Isa::ssse3, false},
    {"Dunnington", Isa::ssse3, false},
    {"Nehalem", Isa::sse4_2, true},
    {"Athlon", Isa::sse3, false},
    {"Opteron", Isa::sse3, false},
    {"Opteron_SSE3", Isa::sse3, false},
    {"Barcelona", Isa::sse3, false},
    {"Nano", Isa::sse3, false},
    {"Sandybridge", Isa::avx, true},
    {"Bobcat", Isa::sse3, false},
    {"Bulldozer", Isa::avx, false},
    {"Piledriver", Isa::avx, false},
    {"Haswell", Isa::avx2_fma, true},
    {"Steamroller", Isa::avx, false},
    {"Excavator", Isa::avx, false},
    {"Zen", Isa::avx2_fma, true},
    {"SkylakeX", Isa::avx512, true},
    {"Cooperlake", Isa::avx512_bf16, true},
    {"SapphireRapids", Isa::avx512_bf16, false},
};

const CoreName* find_core(const std::string& name) {
  for (const CoreName& core : kCores)
    if (strcasecmp(core.name, name.c_str()) == 0) return &core;
  return nullptr;
}

CpuFeatures detect_cpu() {
  __builtin_cpu_init();
  CpuFeatures cpu;
  cpu.avx2 = __builtin_cpu_supports("avx2");
  cpu.fma = __builtin_cpu_supports("fma");
  cpu.avx512f = __builtin_cpu_supports("avx512f");
  cpu.avx512bw = __builtin_cpu_supports("avx512bw");
  cpu.avx512dq = __builtin_cpu_supports("avx512dq");
  cpu.avx512vl = __builtin_cpu_supports("avx512vl");
  cpu.avx512bf16 = __builtin_cpu_supports("avx512bf16");
  return cpu;
}

Isa cpu_isa(const CpuFeatures& cpu) {
  const bool avx512 = cpu.avx512f && cpu.avx512bw && cpu.avx512dq && cpu.avx512vl;
  if (avx512 && cpu.avx2 && cpu.fma) return cpu.avx512bf16 ? Isa::avx512_bf16 : Isa::avx512;
  if (cpu.avx2 && cpu.fma) return Isa::avx2_fma;
  if (__builtin_cpu_supports("avx")) return Isa::avx;
  if (__builtin_cpu_supports("sse4.2")) return Isa::sse4_2;
  return __builtin_cpu_supports("ssse3") ? Isa::ssse3 : Isa::sse3;
}

const char* isa_name(Isa isa) {
  static constexpr const char* kNames[] = {"SSE3",     "SSSE3",   "SSE4.2",      "AVX",
                                           "AVX2+FMA", "AVX-512", "AVX-512 BF16"};
  return kNames[static_cast<int>(isa)];
}

// The best core attnlab picks for a CPU of at least AVX2 + FMA.
const char* best_core(Isa isa) {
  if (isa == Isa::avx512_bf16) return "Cooperlake";
  return isa == Isa::avx512 ? "SkylakeX" : "Haswell";
}

bool env_is_one(const char* name) {
  const char* v = std::getenv(name);
  return v && std::string(v) == "1";
}

// Points OpenBLAS at another core; true when it runs that core now. OpenBLAS reads the core from
// OPENBLAS_CORETYPE, set for the call and restored after it (child processes see the user's).
bool switch_core(const std::string& name) {
  const char* previous = std::getenv("OPENBLAS_CORETYPE");
  const std::string saved = previous ? previous : "";
  setenv("OPENBLAS_CORETYPE", name.c_str(), 1);
  gotoblas_dynamic_quit();
  gotoblas_dynamic_init();
  if (previous)
    setenv("OPENBLAS_CORETYPE", saved.c_str(), 1);
  else
    unsetenv("OPENBLAS_CORETYPE");
  return strcasecmp(openblas_get_corename(), name.c_str()) == 0;
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

// OpenBLAS's core: its sgemm and dgemm.
bool self_check() {
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
  info.engine = GemmEngine::openblas;
  info.engine_name = info.library;
  const bool built = onednn_built();
  if (request == "openblas") {
    info.engine_reason = "ATTNLAB_GEMM=openblas";
  } else if (request == "auto" || request == "onednn") {
    if (!built) {
      info.engine_reason = "built without oneDNN";
      if (request == "onednn")
        add_warning(info,
                    "ATTNLAB_GEMM=onednn ignored: this attnlab was built without oneDNN; "
                    "float gemms run in " +
                        info.library);
    } else {
#ifdef ATTNLAB_WITH_ONEDNN
      const std::string why =
          request == "onednn" ? "ATTNLAB_GEMM=onednn" : "faster than OpenBLAS on a step's shapes";
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
    add_warning(info, "ATTNLAB_GEMM=" + request + " ignored: expected auto, onednn or openblas; " +
                          "float gemms run in " + info.library);
  }
  float_engine.store(info.engine, std::memory_order_relaxed);
}

// "OpenBLAS 0.3.21" from "OpenBLAS 0.3.21 NO_LAPACKE DYNAMIC_ARCH ...".
std::string library_name() {
  const std::string config = openblas_get_config();
  const auto first = config.find(' ');
  const auto second = first == std::string::npos ? first : config.find(' ', first + 1);
  return config.substr(0, second);
}

std::string forcible_names() {
  std::string names;
  for (const CoreName& core : kCores)
    if (core.forcible) names.append(names.empty() ? "" : ", ").append(core.name);
  return names;
}

// Fills `info`. With may_switch false (a gemm before blas::init) nothing is changed: where init
// would switch, the reason and the warning say so and name init.
void select_core(BlasInfo& info, bool may_switch) {
  info = BlasInfo{};
  info.library = library_name();
  info.cpu = detect_cpu();
  info.openblas_core = info.core = openblas_get_corename();
  const char* user_core = std::getenv("OPENBLAS_CORETYPE");
  const char* request_env = std::getenv("ATTNLAB_BLAS_CORE");
  const std::string request = request_env ? request_env : "";
  if (user_core && *user_core && !env_is_one("ATTNLAB_BLAS_SIMULATE_FALLBACK")) {
    info.reason = std::string("OPENBLAS_CORETYPE=") + user_core + " set by the user";
    return;
  }
  if (request == "keep") {
    info.reason = "ATTNLAB_BLAS_CORE=keep";
    return;
  }
  if (!gotoblas_dynamic_init || !gotoblas_dynamic_quit) {
    info.reason = "this OpenBLAS has one fixed core";
    if (!request.empty())
      info.warning = "ATTNLAB_BLAS_CORE=" + request + " ignored: " + info.reason;
    return;
  }
  const Isa isa = cpu_isa(info.cpu);
  std::string target, why;
  if (!request.empty()) {
    const CoreName* forced = find_core(request);
    if (!forced || !forced->forcible) {
      info.reason = "kept: ATTNLAB_BLAS_CORE=" + request + " is not a core attnlab can select";
      info.warning = "ATTNLAB_BLAS_CORE=" + request + " ignored: expected keep or one of " +
                     forcible_names() + "; running " + info.core;
      return;
    }
    if (forced->isa > isa) {
      info.reason = "kept: ATTNLAB_BLAS_CORE=" + request + " needs " + isa_name(forced->isa);
      info.warning = "ATTNLAB_BLAS_CORE=" + request + " ignored: " + forced->name + " needs " +
                     isa_name(forced->isa) + ", which this CPU lacks; running " + info.core;
      return;
    }
    target = forced->name;
    why = "ATTNLAB_BLAS_CORE=" + request;
  } else {
    const CoreName* chosen = find_core(info.core);
    if (!chosen || chosen->isa >= Isa::avx2_fma || isa < Isa::avx2_fma) {
      info.reason = "OpenBLAS's choice for this CPU";
      return;
    }
    target = best_core(isa);
    why = std::string("generic fallback on a CPU with ") + isa_name(isa);
  }
  if (strcasecmp(target.c_str(), info.core.c_str()) == 0) {
    info.reason = why + ", already active";
    return;
  }
  if (!may_switch) {
    info.reason = "kept: " + why + ", but blas::init() was not called";
    info.warning = "BLAS core " + info.core + " kept (" + why +
                   "): call attnlab::blas::init() at program start to switch to " + target;
    return;
  }
  const bool moved = switch_core(target);
  if (moved && self_check()) {
    info.core = target;
    info.switched = true;
    info.reason = why;
    return;
  }
  switch_core(info.openblas_core);
  info.core = openblas_get_corename();
  const std::string failure =
      moved ? " failed attnlab's sgemm/dgemm self-check" : " is not available in this OpenBLAS";
  info.reason = "kept: " + target + failure;
  info.warning = "BLAS core " + target + failure + " (" + why + "); running " + info.core;
  if (request.empty()) info.warning += ", which may be several times slower";
}

BlasInfo& info_storage() {
  static BlasInfo info;
  return info;
}

// What has filled info_storage(): nothing, the read-only check of a gemm before init, or init.
enum class CoreState { unchecked, checked, initialized };
std::atomic<CoreState> core_state{CoreState::unchecked};
// Shared by the gemms in flight, exclusive while init switches the core or a check fills the info.
std::shared_mutex& core_mutex() {
  static std::shared_mutex m;
  return m;
}

// Before the first gemm: the read-only check, unless init ran (one atomic load after that).
void ensure_checked() {
  if (core_state.load(std::memory_order_acquire) != CoreState::unchecked) return;
  const std::unique_lock<std::shared_mutex> lock(core_mutex());
  if (core_state.load(std::memory_order_relaxed) != CoreState::unchecked) return;
  select_core(info_storage(), false);
  select_engine(info_storage());
  core_state.store(CoreState::checked, std::memory_order_release);
}

}  // namespace

void init() {
  const std::unique_lock<std::shared_mutex> lock(core_mutex());
  if (core_state.load(std::memory_order_relaxed) == CoreState::initialized) return;
  select_core(info_storage(), true);
  select_engine(info_storage());
  core_state.store(CoreState::initialized, std::memory_order_release);
}

bool initialized() {
  return core_state.load(std::memory_order_acquire) == CoreState::initialized;
}

template <>
void gemm<float>(bool trans_a, bool trans_b, int m, int n, int k, float alpha, const float* a,
                 int lda, const float* b, int ldb, float beta, float* c, int ldc) {
  ensure_checked();
  const std::shared_lock<std::shared_mutex> in_flight(core_mutex());
  gemm_impl(trans_a, trans_b, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
}

template <>
void gemm<double>(bool trans_a, bool trans_b, int m, int n, int k, double alpha, const double* a,
                  int lda, const double* b, int ldb, double beta, double* c, int ldc) {
  ensure_checked();
  const std::shared_lock<std::shared_mutex> in_flight(core_mutex());
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
  return line;
}

const char* to_string(GemmEngine engine) {
  return engine == GemmEngine::onednn ? "onednn" : "openblas";
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
