// Attention variants against plain attention (issue 13), float, forward + backward, the minimum
// over iterations, the variants interleaved so that load drifts hit them alike:
//  - grouped-query attention: H = 8 query heads read Hkv ∈ {8, 2, 1} key/value heads (8: plain
//    attention, 1: multi-query), B = 8, T = 1024, D = 64, causal, on each CPU path; the attention
//    FLOPs are the same for every Hkv, only K, V and their gradients shrink;
//  - sliding window: T = 4096, B·H = 8, D = 64, causal, fused path, windows 256 and 1024 against
//    full causal attention; the work ratio is about T·w / (T²/2) = 2w/T;
//  - ALiBi: the same GQA shape with Hkv = 8, each path, with and without ALiBi (its overhead);
//  - an additive bias of shape (1, H, T, T), the same shape: with dBias (a learned per-head bias;
//    the backward sums dS over the batch) and without (a constant bias);
//  - attention dropout p = 0.1, the same shape (the Philox mask drawn in the forward and twice
//    regenerated in the backward).
#include "bench_variants.hpp"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <limits>
#include <string>

#include <benchmark/benchmark.h>

#include "attnlab/ops/attention.hpp"
#include "attnlab/random.hpp"
#include "attnlab/threads.hpp"

namespace attnlab::bench {

namespace {

constexpr std::size_t kB = 8, kH = 8, kT = 1024, kD = 64;
constexpr std::size_t kKvHeads[] = {8, 2, 1};

double now() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

std::string gqa_name(SdpaPath path, int threads) {
  std::string name("gqa/");
  name.append(to_string(path)).append("/thr:").append(std::to_string(threads));
  return name;
}

void bench_gqa(benchmark::State& state, SdpaPath path, int threads) {
  set_num_threads(threads);
  Rng rng(3);
  const Tensor4<float> q = randn<float, 4>({kB, kH, kT, kD}, rng);
  const Tensor4<float> dout = randn<float, 4>({kB, kH, kT, kD}, rng);
  std::vector<Tensor4<float>> k, v;
  std::vector<SdpaCache<float>> caches(std::size(kKvHeads));
  for (std::size_t hkv : kKvHeads) {
    k.push_back(randn<float, 4>({kB, hkv, kT, kD}, rng));
    v.push_back(randn<float, 4>({kB, hkv, kT, kD}, rng));
  }
  SdpaOptions options;
  options.causal = true;
  options.path = path;
  SdpaOptions alibi = options;
  alibi.alibi_slopes = alibi_slopes(kH);
  SdpaCache<float> alibi_cache, bias_cache, const_bias_cache, dropout_cache;
  SdpaOptions dropout = options;
  dropout.dropout_p = 0.1;
  dropout.dropout_seed = 7;
  const Tensor4<float> bias = randn<float, 4>({1, kH, kT, kT}, rng);
  SdpaOptions const_bias = options;
  const_bias.bias_requires_grad = false;
  const auto step = [&](SdpaCache<float>& cache, const Tensor4<float>& k_in,
                        const Tensor4<float>& v_in, const SdpaOptions& o, double& best,
                        const Tensor4<float>* b = nullptr) {
    const double start = now();
    const Tensor4<float> out = sdpa_forward(cache, q, k_in, v_in, o, nullptr, b);
    const SdpaGrads<float> g = sdpa_backward(dout, cache, q, k_in, v_in);
    benchmark::DoNotOptimize(out.data());
    benchmark::DoNotOptimize(g.dk.data());
    best = std::min(best, now() - start);
  };
  std::vector<double> best(std::size(kKvHeads), std::numeric_limits<double>::infinity());
  double best_alibi = std::numeric_limits<double>::infinity();
  double best_bias = best_alibi, best_const_bias = best_alibi, best_dropout = best_alibi;
  for (auto _ : state) {
    for (std::size_t i = 0; i < std::size(kKvHeads); ++i)
      step(caches[i], k[i], v[i], options, best[i]);
    step(alibi_cache, k[0], v[0], alibi, best_alibi);
    step(bias_cache, k[0], v[0], options, best_bias, &bias);
    step(const_bias_cache, k[0], v[0], const_bias, best_const_bias, &bias);
    step(dropout_cache, k[0], v[0], dropout, best_dropout);
  }
  for (std::size_t i = 0; i < std::size(kKvHeads); ++i) {
    state.counters[std::string("kv").append(std::to_string(kKvHeads[i]))] = best[i];
  }
  state.counters["alibi"] = best_alibi;
  state.counters["bias"] = best_bias;
  state.counters["bias_const"] = best_const_bias;
  state.counters["dropout"] = best_dropout;
}

constexpr std::size_t kWindowT = 4096, kWindowBH = 8;
constexpr std::size_t kWindows[] = {0, 1024, 256};  // 0: full causal

std::string window_name(int threads) {
  return "window/fused/thr:" + std::to_string(threads);
}

void bench_window(benchmark::State& state, int threads) {
  set_num_threads(threads);
  Rng rng(5);
  const auto make = [&] { return randn<float, 4>({kWindowBH / 4, 4, kWindowT, kD}, rng); };
  const Tensor4<float> q = make(), k = make(), v = make(), dout = make();
  std::vector<SdpaCache<float>> caches(std::size(kWindows));
  std::vector<double> best(std::size(kWindows), std::numeric_limits<double>::infinity());
  for (auto _ : state) {
    for (std::size_t i = 0; i < std::size(kWindows); ++i) {
      SdpaOptions options;
      options.causal = true;
      options.window = kWindows[i];
      options.path = SdpaPath::fused;
      const double start = now();
      const Tensor4<float> out = sdpa_forward(caches[i], q, k, v, options);
      const SdpaGrads<float> g = sdpa_backward(dout, caches[i], q, k, v);
      benchmark::DoNotOptimize(out.data());
      benchmark::DoNotOptimize(g.dk.data());
      best[i] = std::min(best[i], now() - start);
    }
  }
  for (std::size_t i = 0; i < std::size(kWindows); ++i) {
    state.counters[std::string("w").append(std::to_string(kWindows[i]))] = best[i];
  }
}

}  // namespace

void register_variant_benchmarks() {
  for (int threads : {1, 2}) {
    benchmark::RegisterBenchmark(window_name(threads).c_str(), bench_window, threads)
        ->UseRealTime()
        ->Unit(benchmark::kMillisecond)
        ->Iterations(2);
  }
  for (SdpaPath path : {SdpaPath::reference, SdpaPath::fused}) {
    for (int threads : {1, 2}) {
      benchmark::RegisterBenchmark(gqa_name(path, threads).c_str(), bench_gqa, path, threads)
          ->UseRealTime()
          ->Unit(benchmark::kMillisecond);
    }
  }
}

void print_variant_table(const std::map<std::string, std::map<std::string, double>>& seconds) {
  std::printf(
      "\nSliding-window attention, fused path, float, causal, forward+backward (min ms): B*H %zu, "
      "T %zu, D %zu;\nwork ratio 2w/T: 0.500 for w 1024, 0.125 for w 256\n",
      kWindowBH, kWindowT, kD);
  std::printf("%3s | %9s %9s %9s | %11s %11s\n", "thr", "causal", "w 1024", "w 256", "w1024/full",
              "w256/full");
  for (int threads : {1, 2}) {
    const auto it = seconds.find(window_name(threads));
    if (it == seconds.end()) continue;
    const double full = it->second.at("w0"), w1 = it->second.at("w1024"),
                 w2 = it->second.at("w256");
    std::printf("%3d | %9.1f %9.1f %9.1f | %11.3f %11.3f\n", threads, full * 1e3, w1 * 1e3,
                w2 * 1e3, w1 / full, w2 / full);
  }
  std::printf(
      "\nGrouped-query attention, ALiBi and an additive bias (1, H, T, T), float, causal, "
      "forward+backward (min ms): B %zu, H "
      "%zu, "
      "T %zu, D %zu;\nHkv = 8 is plain attention, 1 multi-query (same attention FLOPs); ALiBi with "
      "Hkv = 8, the bias with dBias (bias) and without (const), dropout 0.1\n",
      kB, kH, kT, kD);
  std::printf("%-9s %3s | %9s %9s %9s | %9s %9s | %9s %11s\n", "path", "thr", "Hkv 8", "Hkv 2",
              "Hkv 1", "8 / 2", "8 / 1", "ALiBi", "ALiBi / 8");
  std::printf("%-9s %3s | %9s %11s %9s %11s %9s %11s\n", "", "", "bias", "bias / 8", "const",
              "const / 8", "drop 0.1", "drop / 8");
  for (SdpaPath path : {SdpaPath::reference, SdpaPath::fused}) {
    for (int threads : {1, 2}) {
      const auto it = seconds.find(gqa_name(path, threads));
      if (it == seconds.end()) continue;
      const double a = it->second.at("kv8"), b = it->second.at("kv2"), c = it->second.at("kv1");
      const double al = it->second.at("alibi");
      std::printf("%-9s %3d | %9.2f %9.2f %9.2f | %9.3f %9.3f | %9.2f %11.3f\n",
                  std::string(to_string(path)).c_str(), threads, a * 1e3, b * 1e3, c * 1e3, a / b,
                  a / c, al * 1e3, al / a);
      const double bi = it->second.at("bias"), bc = it->second.at("bias_const"),
                   dr = it->second.at("dropout");
      std::printf("%-9s %3s | %9.2f %11.3f %9.2f %11.3f %9.2f %11.3f\n", "", "", bi * 1e3, bi / a,
                  bc * 1e3, bc / a, dr * 1e3, dr / a);
    }
  }
}

}  // namespace attnlab::bench
