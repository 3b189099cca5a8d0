// Autoregressive generation (issue 14), float, greedy, on nanoGPT's Shakespeare model shape
// (train_models.hpp "nanogpt": 4 layers, 4 heads, d_model 128, 65 characters) with a context of
// 256 tokens (max_len 256): from a prompt of P random tokens, 256 - P new tokens, so the context
// grows from P to 256 and never slides. Cached decoding (Transformer::forward_cached, O(T) per
// token) against uncached (forward over the whole context per token, O(T^2)), interleaved, the
// minimum time over iterations; P = 192 gives the cost per token near T = 256, P = 1 the average
// over a whole context.
#include "bench_generate.hpp"
#include "train_models.hpp"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <limits>
#include <string>

#include <benchmark/benchmark.h>

#include "attnlab/nn/generate.hpp"
#include "attnlab/random.hpp"
#include "attnlab/threads.hpp"

namespace attnlab::bench {

namespace {

constexpr std::size_t kContext = 256;
constexpr std::size_t kPrompts[] = {192, 1};

double now() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

std::string generate_name(int threads) {
  return "generate/nanogpt/T:256/thr:" + std::to_string(threads);
}

void bench_generate(benchmark::State& state, int threads) {
  set_num_threads(threads);
  TransformerConfig c = train_config(kTrainModels[2]);
  c.max_len = kContext;
  Rng rng(11);
  Transformer<float> model(c, rng);
  double best[2][2];
  for (auto& row : best) std::fill(std::begin(row), std::end(row), 1e30);
  for (auto _ : state) {
    for (std::size_t p = 0; p < std::size(kPrompts); ++p) {
      std::vector<int> prompt(kPrompts[p]);
      for (auto& id : prompt) id = static_cast<int>(rng.below(c.out_vocab));
      for (int cached = 1; cached >= 0; --cached) {
        Sampler sampler({.greedy = true});
        const double start = now();
        const auto out = generate(model, prompt, kContext - kPrompts[p], sampler, {},
                                  {.use_cache = cached == 1});
        benchmark::DoNotOptimize(out.data());
        best[p][cached] = std::min(best[p][cached], now() - start);
      }
    }
  }
  for (std::size_t p = 0; p < std::size(kPrompts); ++p) {
    const std::string prompt = std::to_string(kPrompts[p]);
    state.counters["cached_p" + prompt] = best[p][1];
    state.counters["uncached_p" + prompt] = best[p][0];
  }
}

}  // namespace

void register_generate_benchmarks() {
  for (int threads : {1, 2}) {
    benchmark::RegisterBenchmark(generate_name(threads).c_str(), bench_generate, threads)
        ->UseRealTime()
        ->Unit(benchmark::kMillisecond)
        ->Iterations(2);
  }
}

void print_generate_table(const std::map<std::string, std::map<std::string, double>>& seconds) {
  std::printf(
      "\nGeneration, float, greedy: nanoGPT's Shakespeare shape (4 layers, 4 heads, d_model 128), "
      "context %zu;\nfrom a prompt of P tokens, %zu - P new tokens (tokens/s, the best of 2 "
      "runs)\n",
      kContext, kContext);
  std::printf("%3s %5s | %11s %11s | %13s\n", "thr", "P", "KV cache", "no cache", "cache speedup");
  for (int threads : {1, 2}) {
    const auto it = seconds.find(generate_name(threads));
    if (it == seconds.end()) continue;
    for (std::size_t prompt : kPrompts) {
      const std::string p = std::to_string(prompt);
      const double n = static_cast<double>(kContext - prompt);
      const double cached = it->second.at("cached_p" + p),
                   uncached = it->second.at("uncached_p" + p);
      std::printf("%3d %5zu | %11.0f %11.0f | %13.1f\n", threads, prompt, n / cached, n / uncached,
                  uncached / cached);
    }
  }
}

}  // namespace attnlab::bench
