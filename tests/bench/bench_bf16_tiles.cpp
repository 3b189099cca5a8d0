// The fused attention, float, forward + backward, B 4, H 8, T 1024, D 64, not causal: fp32
// products, the bf16 tiles under a bf16 GemmPrecisionScope (AMX where the CPU has it, else the
// portable tiles: the table says which), and bf16 through blas::gemm's bf16 gemm (the default,
// ATTNLAB_BF16_TILES=auto or off). Interleaved, the minimum over iterations.
#include "bench_bf16_tiles.hpp"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <limits>
#include <string>

#include <benchmark/benchmark.h>

#include "attnlab/blas.hpp"
#include "attnlab/fma_peak.hpp"
#include "attnlab/ops/attention.hpp"
#include "attnlab/random.hpp"
#include "attnlab/threads.hpp"
#include "kernels/bf16_tiles.hpp"

namespace attnlab::bench {

namespace {

constexpr std::size_t kB = 4, kH = 8, kT = 1024, kD = 64;
constexpr const char* kNames[] = {"fp32", "bf16_tiles", "bf16_gemm"};

double now() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

std::string tiles_name(int threads) {
  return "bf16_tiles/thr:" + std::to_string(threads);
}

void bench_tiles(benchmark::State& state, int threads) {
  set_num_threads(threads);
  Rng rng(5);
  const auto q = randn<float, 4>({kB, kH, kT, kD}, rng);
  const auto k = randn<float, 4>({kB, kH, kT, kD}, rng);
  const auto v = randn<float, 4>({kB, kH, kT, kD}, rng);
  const auto dout = randn<float, 4>({kB, kH, kT, kD}, rng);
  SdpaOptions options;
  options.path = SdpaPath::fused;
  SdpaCache<float> caches[3];
  double best[3];
  std::fill(best, best + 3, std::numeric_limits<double>::infinity());
  namespace tiles = detail::tiles;
  for (auto _ : state) {
    for (int variant = 0; variant < 3; ++variant) {
      tiles::set_tile_choice(variant == 2           ? tiles::TileChoice::off
                             : amx_support().usable ? tiles::TileChoice::amx
                                                    : tiles::TileChoice::portable);
      const blas::GemmPrecisionScope scope(variant == 0 ? GemmPrecision::fp32
                                                        : GemmPrecision::bf16);
      const double start = now();
      const auto out = sdpa_forward(caches[variant], q, k, v, options);
      const auto g = sdpa_backward(dout, caches[variant], q, k, v);
      benchmark::DoNotOptimize(out.data());
      benchmark::DoNotOptimize(g.dq.data());
      best[variant] = std::min(best[variant], now() - start);
    }
  }
  tiles::set_tile_choice(tiles::TileChoice::automatic);
  for (int variant = 0; variant < 3; ++variant) state.counters[kNames[variant]] = best[variant];
}

}  // namespace

void register_bf16_tile_benchmarks() {
  for (int threads : {1, 2}) {
    benchmark::RegisterBenchmark(tiles_name(threads).c_str(), bench_tiles, threads)
        ->UseRealTime()
        ->Unit(benchmark::kMillisecond)
        ->Iterations(2);
  }
}

void print_bf16_tile_table(const std::map<std::string, std::map<std::string, double>>& seconds) {
  std::printf(
      "\nFused attention, float, forward+backward (min ms): B %zu, H %zu, T %zu, D %zu, not "
      "causal;\nbf16 tiles: %s; bf16 gemm: blas::gemm's bf16 (the default)\n",
      kB, kH, kT, kD, amx_support().usable ? "amx" : "portable");
  std::printf("%3s | %9s %10s %9s | %11s %10s\n", "thr", "fp32", "bf16 tiles", "bf16 gemm",
              "tiles/fp32", "gemm/fp32");
  for (int threads : {1, 2}) {
    const auto it = seconds.find(tiles_name(threads));
    if (it == seconds.end()) continue;
    const double f = it->second.at("fp32"), t = it->second.at("bf16_tiles"),
                 g = it->second.at("bf16_gemm");
    std::printf("%3d | %9.1f %10.1f %9.1f | %11.3f %10.3f\n", threads, f * 1e3, t * 1e3, g * 1e3,
                t / f, g / f);
  }
}

}  // namespace attnlab::bench
