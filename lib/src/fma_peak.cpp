#include "attnlab/fma_peak.hpp"

#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <stdexcept>
#include <string>
#include <string_view>

#include "amx_tile_config.hpp"

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define ATTNLAB_FMA_X86 1
#endif
#if defined(__x86_64__) && defined(__linux__)
#include <sys/syscall.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#define ATTNLAB_AMX_LINUX 1
#endif

namespace attnlab {

void check_arg(bool ok, std::string_view op, std::string_view name, std::string_view what,
               std::string_view got);

namespace {

// Independent accumulation chains per loop: more than latency × FMA ports (4 × 2 on the cores in
// view), so that the ports never wait, and with the two constants no more than the registers (32
// zmm with AVX-512; 16 ymm or xmm without it).
constexpr int kZmmChains = 16, kYmmChains = 12, kXmmChains = 12;

// acc ← acc · a + b converges to b / (1 − a): no overflow, no subnormals, whatever the iterations.
constexpr float kA = 0.9999999f, kB = 1e-7f;

volatile float g_sink = 0;  // what the loops return goes here, so that none is optimised away

#ifdef ATTNLAB_FMA_X86
__attribute__((target("avx512f"))) float loop_zmm(std::int64_t iters, float seed) {
  const __m512 a = _mm512_set1_ps(kA), b = _mm512_set1_ps(kB);
  __m512 acc[kZmmChains];
#pragma GCC unroll 16
  for (int c = 0; c < kZmmChains; ++c) acc[c] = _mm512_set1_ps(seed + float(c));
  for (std::int64_t i = 0; i < iters; ++i) {
#pragma GCC unroll 16
    for (int c = 0; c < kZmmChains; ++c) acc[c] = _mm512_fmadd_ps(acc[c], a, b);
  }
  __m512 sum = acc[0];
#pragma GCC unroll 16
  for (int c = 1; c < kZmmChains; ++c) sum = _mm512_add_ps(sum, acc[c]);
  alignas(64) float lanes[16];
  _mm512_store_ps(lanes, sum);
  float s = 0;
  for (float v : lanes) s += v;
  return s;
}

__attribute__((target("avx2,fma"))) float loop_ymm(std::int64_t iters, float seed) {
  const __m256 a = _mm256_set1_ps(kA), b = _mm256_set1_ps(kB);
  __m256 acc[kYmmChains];
#pragma GCC unroll 12
  for (int c = 0; c < kYmmChains; ++c) acc[c] = _mm256_set1_ps(seed + float(c));
  for (std::int64_t i = 0; i < iters; ++i) {
#pragma GCC unroll 12
    for (int c = 0; c < kYmmChains; ++c) acc[c] = _mm256_fmadd_ps(acc[c], a, b);
  }
  __m256 sum = acc[0];
#pragma GCC unroll 12
  for (int c = 1; c < kYmmChains; ++c) sum = _mm256_add_ps(sum, acc[c]);
  alignas(32) float lanes[8];
  _mm256_store_ps(lanes, sum);
  float s = 0;
  for (float v : lanes) s += v;
  return s;
}

// Without FMA: a multiply and an add, counted as 2 flops as an FMA is.
float loop_xmm(std::int64_t iters, float seed) {
  const __m128 a = _mm_set1_ps(kA), b = _mm_set1_ps(kB);
  __m128 acc[kXmmChains];
#pragma GCC unroll 12
  for (int c = 0; c < kXmmChains; ++c) acc[c] = _mm_set1_ps(seed + float(c));
  for (std::int64_t i = 0; i < iters; ++i) {
#pragma GCC unroll 12
    for (int c = 0; c < kXmmChains; ++c) acc[c] = _mm_add_ps(_mm_mul_ps(acc[c], a), b);
  }
  __m128 sum = acc[0];
#pragma GCC unroll 12
  for (int c = 1; c < kXmmChains; ++c) sum = _mm_add_ps(sum, acc[c]);
  alignas(16) float lanes[4];
  _mm_store_ps(lanes, sum);
  return lanes[0] + lanes[1] + lanes[2] + lanes[3];
}
#else
float loop_scalar(std::int64_t iters, float seed) {
  float acc[8];
  for (int c = 0; c < 8; ++c) acc[c] = seed + float(c);
  for (std::int64_t i = 0; i < iters; ++i) {
    for (float& v : acc) v = std::fma(v, kA, kB);
  }
  float s = 0;
  for (float v : acc) s += v;
  return s;
}
#endif

#ifdef ATTNLAB_AMX_LINUX
// 4 TDPBF16PS per iteration on zero operands (their timing does not depend on the values), the
// accumulators independent so that the tile unit never waits for a result. The tile configuration
// (palette 1): tiles 0-3 accumulate 16 x 16 floats, 4-5 hold A (16 rows of 32 bf16), 6-7 hold B
// (16 rows of 32 bf16 pairs); 64 bytes per row each.
__attribute__((target("amx-tile,amx-bf16"))) float loop_amx(std::int64_t iters, float seed) {
  detail::AmxTileConfig config;
  for (int t = 0; t < 8; ++t) config.colsb[t] = 64, config.rows[t] = 16;
  _tile_loadconfig(&config);
  alignas(64) static const std::uint16_t zeros[16 * 32] = {};
  alignas(64) float out[16 * 16];
  _tile_zero(0);
  _tile_zero(1);
  _tile_zero(2);
  _tile_zero(3);
  _tile_loadd(4, zeros, 64);
  _tile_loadd(5, zeros, 64);
  _tile_loadd(6, zeros, 64);
  _tile_loadd(7, zeros, 64);
  for (std::int64_t i = 0; i < iters; ++i) {
    _tile_dpbf16ps(0, 4, 6);
    _tile_dpbf16ps(1, 4, 7);
    _tile_dpbf16ps(2, 5, 6);
    _tile_dpbf16ps(3, 5, 7);
  }
  _tile_stored(0, out, 64);
  _tile_release();
  return out[0] + seed;
}
#endif

struct Loop {
  const char* name;
  float (*run)(std::int64_t, float);
  double flops_per_iteration;  // chains · lanes · 2
};

// The team's best GFLOP/s of one loop; `team` gets the threads OpenMP gave.
double time_loop(const Loop& loop, int threads, double seconds, int rounds, int& team) {
  // Calibrate on this thread: iterations for about `seconds`.
  std::int64_t iters = 1 << 12;
  for (;;) {
    const auto t0 = std::chrono::steady_clock::now();
    g_sink = g_sink + loop.run(iters, 1.0f);
    const double t = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    if (t > seconds / 8 || iters > (std::int64_t{1} << 40)) {
      iters = std::max<std::int64_t>(1, static_cast<std::int64_t>(double(iters) * seconds / t));
      break;
    }
    iters *= 4;
  }
  double best = 0;
  for (int round = -1; round < rounds; ++round) {  // round -1: wakes the team's cores
    double start = 0, stop = 0;
#pragma omp parallel num_threads(threads)
    {
#pragma omp barrier
#pragma omp single
      {
        team = omp_get_num_threads();
        start = omp_get_wtime();
      }
      const float r = loop.run(iters, 1.0f + float(omp_get_thread_num()));
#pragma omp barrier
#pragma omp single
      stop = omp_get_wtime();
#pragma omp critical(attnlab_fma_sink)
      g_sink = g_sink + r;
    }
    if (round < 0) continue;
    const double flops = loop.flops_per_iteration * double(iters) * team;
    best = std::max(best, flops / (stop - start) / 1e9);
  }
  return best;
}

void check_peak_args(const char* op, int threads, double seconds, int rounds) {
  check_arg(threads >= 1, op, "threads", ">= 1", std::to_string(threads));
  check_arg(std::isfinite(seconds) && seconds > 0, op, "seconds", "a finite time > 0",
            std::to_string(seconds));
  check_arg(rounds >= 1, op, "rounds", ">= 1", std::to_string(rounds));
}

}  // namespace

FmaPeak measure_fma_peak(int threads, double seconds, int rounds) {
  check_peak_args("measure_fma_peak", threads, seconds, rounds);
  Loop loops[3];
  int n = 0;
#ifdef ATTNLAB_FMA_X86
  __builtin_cpu_init();
  if (__builtin_cpu_supports("avx512f"))
    loops[n++] = {"avx512 zmm", loop_zmm, double(kZmmChains) * 16 * 2};
  if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma"))
    loops[n++] = {"avx2 ymm", loop_ymm, double(kYmmChains) * 8 * 2};
  if (n == 0) loops[n++] = {"sse xmm", loop_xmm, double(kXmmChains) * 4 * 2};
#else
  loops[n++] = {"scalar", loop_scalar, 8.0 * 2};
#endif
  // The peak is the fastest loop's. Where two widths tie (Zen 4 runs a zmm FMA as two 256-bit
  // halves, so its zmm and ymm loops reach the same flops), the name is the widest loop within 3%
  // of it, so that run-to-run noise does not flip the name between equal loops.
  double gflops[3] = {0, 0, 0};
  int teams[3] = {0, 0, 0};
  FmaPeak peak;
  for (int i = 0; i < n; ++i) {
    gflops[i] = time_loop(loops[i], threads, seconds, rounds, teams[i]);
    if (gflops[i] > peak.gflops) peak = {gflops[i], teams[i], loops[i].name};
  }
  for (int i = 0; i < n; ++i) {  // loops[] runs widest first
    if (gflops[i] >= 0.97 * peak.gflops) {
      peak.vector = loops[i].name;
      break;
    }
  }
  return peak;
}

const AmxSupport& amx_support() {
  static const AmxSupport support = [] {
    AmxSupport s;
#ifdef ATTNLAB_AMX_LINUX
    __builtin_cpu_init();
    if (!__builtin_cpu_supports("amx-tile") || !__builtin_cpu_supports("amx-bf16")) {
      s.reason = "this CPU has no AMX bf16 tiles (amx_tile, amx_bf16)";
      return s;
    }
    constexpr int kReqXcompPerm = 0x1023, kXtileData = 18;  // linux/arch/x86/include/uapi/asm
    if (::syscall(SYS_arch_prctl, kReqXcompPerm, kXtileData) != 0) {
      s.reason = std::string(
                     "the kernel did not grant the AMX tile state (arch_prctl "
                     "ARCH_REQ_XCOMP_PERM: ") +
                 std::strerror(errno) + ")";
      return s;
    }
    s.usable = true;
#else
    s.reason = "AMX needs Linux on x86-64";
#endif
    return s;
  }();
  return support;
}

FmaPeak measure_amx_peak(int threads, double seconds, int rounds) {
  const char* op = "measure_amx_peak";
  check_peak_args(op, threads, seconds, rounds);
  const AmxSupport& amx = amx_support();
  if (!amx.usable) throw std::runtime_error(std::string(op) + ": " + amx.reason);
#ifdef ATTNLAB_AMX_LINUX
  const Loop loop{"amx bf16", loop_amx, 4.0 * 16 * 16 * 32 * 2};  // 4 tiles of 16x16x32 FMAs
  FmaPeak peak;
  peak.gflops = time_loop(loop, threads, seconds, rounds, peak.threads);
  peak.vector = loop.name;
  return peak;
#else
  return {};
#endif
}

std::string to_string(const FmaPeak& peak) {
  char text[96];
  std::snprintf(text, sizeof text, "%.1f GFLOP/s (%d thread%s, %s)", peak.gflops, peak.threads,
                peak.threads == 1 ? "" : "s", peak.vector.c_str());
  return text;
}

}  // namespace attnlab
