// Attention programs (attnlab/attention/program.hpp) against the built-in paths, float, fused CPU
// path, forward + backward, the minimum over iterations with the sides interleaved:
//  - packed documents: T = 4096 holding 8 documents of 512, causal within each, B·H = 4, D = 64;
//    the document mask program through its block mask (built once, outside the timing), the same
//    visibility as a dense additive -inf bias (every tile computed), and 8 separate causal T = 512
//    attentions (one call over 8× the batch);
//  - causal block skipping: T = 2048 and 4096, B·H = 4, D = 64: built-in causal and the causal mask
//    program against non-causal attention;
//  - programs that re-express a built-in: the softcap program against the built-in softcap, the
//    causal mask program against built-in causal, B·H = 16, T = 1024, D = 64.
#include "bench_programs.hpp"

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <limits>
#include <memory>
#include <string>
#include <vector>

#include <benchmark/benchmark.h>

#include "attnlab/attention/programs.hpp"
#include "attnlab/ops/attention.hpp"
#include "attnlab/random.hpp"
#include "attnlab/threads.hpp"

namespace attnlab::bench {

namespace {

constexpr std::size_t kD = 64, kHeads = 4;
constexpr std::size_t kDocT = 4096, kDocs = 8;
constexpr std::size_t kCausalT[] = {2048, 4096};
constexpr std::size_t kRuleB = 4, kRuleT = 1024;

double now() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

struct Side {
  std::string name;
  Tensor4<float> q, k, v, dout;
  SdpaOptions options;
  const Tensor4<float>* bias = nullptr;
  SdpaCache<float> cache;
  double best = std::numeric_limits<double>::infinity();
};

Tensor4<float> random4(std::size_t B, std::size_t H, std::size_t T, Rng& rng) {
  return randn<float, 4>({B, H, T, kD}, rng);
}

void time_side(Side& s) {
  const double start = now();
  const Tensor4<float> out = sdpa_forward(s.cache, s.q, s.k, s.v, s.options, nullptr, s.bias);
  const SdpaGrads<float> g = sdpa_backward(s.dout, s.cache, s.q, s.k, s.v);
  benchmark::DoNotOptimize(out.data());
  benchmark::DoNotOptimize(g.dk.data());
  s.best = std::min(s.best, now() - start);
}

void run_sides(benchmark::State& state, std::vector<Side>& sides) {
  for (auto _ : state) {
    for (Side& s : sides) time_side(s);
  }
  for (const Side& s : sides) state.counters[s.name] = s.best;
}

SdpaOptions fused() {
  SdpaOptions o;
  o.path = SdpaPath::fused;
  return o;
}

void bench_documents(benchmark::State& state, int threads) {
  set_num_threads(threads);
  Rng rng(11);
  const std::size_t doc = kDocT / kDocs;
  std::vector<std::int32_t> ids(kDocT);
  for (std::size_t t = 0; t < kDocT; ++t) ids[t] = static_cast<std::int32_t>(t / doc);
  const auto mask = attention::document_mask(ids, kDocT);
  AttentionSizes sizes;
  sizes.B = 1, sizes.H = kHeads, sizes.Tq = sizes.Tk = kDocT;
  static Tensor4<float> dense;  // (1, 1, T, T): 0 where visible, -inf where hidden
  if (dense.size() == 0) {
    dense = Tensor4<float>::from_shape({1, 1, kDocT, kDocT});
    for (std::size_t i = 0; i < kDocT; ++i) {
      for (std::size_t j = 0; j < kDocT; ++j) {
        dense(0, 0, i, j) =
            ids[i] == ids[j] && j <= i ? 0.f : -std::numeric_limits<float>::infinity();
      }
    }
  }
  std::vector<Side> sides(3);
  sides[0].name = "program";
  sides[0].options = fused();
  sides[0].options.block_mask =
      std::make_shared<const attention::BlockMask>(attention::build_block_mask(mask, sizes));
  sides[1].name = "dense";
  sides[1].options = fused();
  sides[1].options.bias_requires_grad = false;
  sides[1].bias = &dense;
  for (std::size_t s = 0; s < 2; ++s) {
    sides[s].q = random4(1, kHeads, kDocT, rng), sides[s].k = random4(1, kHeads, kDocT, rng);
    sides[s].v = random4(1, kHeads, kDocT, rng), sides[s].dout = random4(1, kHeads, kDocT, rng);
  }
  sides[2].name = "separate";
  sides[2].options = fused();
  sides[2].options.causal = true;
  sides[2].q = random4(kDocs, kHeads, doc, rng), sides[2].k = random4(kDocs, kHeads, doc, rng);
  sides[2].v = random4(kDocs, kHeads, doc, rng), sides[2].dout = random4(kDocs, kHeads, doc, rng);
  run_sides(state, sides);
  state.counters["density"] = sides[0].options.block_mask->density();
}

void bench_causal(benchmark::State& state, std::size_t T, int threads) {
  set_num_threads(threads);
  Rng rng(13);
  AttentionSizes sizes;
  sizes.B = 1, sizes.H = kHeads, sizes.Tq = sizes.Tk = T;
  std::vector<Side> sides(3);
  sides[0].name = "full";
  sides[0].options = fused();
  sides[1].name = "causal";
  sides[1].options = fused();
  sides[1].options.causal = true;
  sides[2].name = "causal_program";
  sides[2].options = fused();
  sides[2].options.block_mask = std::make_shared<const attention::BlockMask>(
      attention::build_block_mask(attention::causal_mask(), sizes));
  const Tensor4<float> q = random4(1, kHeads, T, rng), k = random4(1, kHeads, T, rng),
                       v = random4(1, kHeads, T, rng), dout = random4(1, kHeads, T, rng);
  for (Side& s : sides) s.q = q, s.k = k, s.v = v, s.dout = dout;
  run_sides(state, sides);
}

void bench_rules(benchmark::State& state, int threads) {
  set_num_threads(threads);
  Rng rng(17);
  AttentionSizes sizes;
  sizes.B = kRuleB, sizes.H = kHeads, sizes.Tq = sizes.Tk = kRuleT;
  std::vector<Side> sides(4);
  sides[0].name = "softcap";
  sides[0].options = fused();
  sides[0].options.softcap = 30;
  sides[1].name = "softcap_program";
  sides[1].options = fused();
  sides[1].options.score_program = attention::softcap_program(30);
  sides[2].name = "causal";
  sides[2].options = fused();
  sides[2].options.causal = true;
  sides[3].name = "causal_program";
  sides[3].options = fused();
  sides[3].options.block_mask = std::make_shared<const attention::BlockMask>(
      attention::build_block_mask(attention::causal_mask(), sizes));
  const Tensor4<float> q = random4(kRuleB, kHeads, kRuleT, rng),
                       k = random4(kRuleB, kHeads, kRuleT, rng),
                       v = random4(kRuleB, kHeads, kRuleT, rng),
                       dout = random4(kRuleB, kHeads, kRuleT, rng);
  for (Side& s : sides) s.q = q, s.k = k, s.v = v, s.dout = dout;
  run_sides(state, sides);
}

std::string name(const char* what, int threads) {
  return std::string("programs/").append(what).append("/thr:").append(std::to_string(threads));
}

}  // namespace

void register_program_benchmarks() {
  for (int threads : {1, 2}) {
    benchmark::RegisterBenchmark(name("documents", threads).c_str(), bench_documents, threads)
        ->UseRealTime()
        ->Unit(benchmark::kMillisecond)
        ->Iterations(3);
    for (std::size_t T : kCausalT) {
      benchmark::RegisterBenchmark(name(("causal_T" + std::to_string(T)).c_str(), threads).c_str(),
                                   bench_causal, T, threads)
          ->UseRealTime()
          ->Unit(benchmark::kMillisecond)
          ->Iterations(3);
    }
    benchmark::RegisterBenchmark(name("rules", threads).c_str(), bench_rules, threads)
        ->UseRealTime()
        ->Unit(benchmark::kMillisecond)
        ->Iterations(5);
  }
}

void print_program_table(const std::map<std::string, std::map<std::string, double>>& seconds) {
  const auto find = [&](const std::string& key) -> const std::map<std::string, double>* {
    const auto it = seconds.find(key);
    return it == seconds.end() ? nullptr : &it->second;
  };
  std::printf(
      "\nAttention programs, fused path, float, forward+backward (min ms), D %zu, %zu heads\n"
      "Packed documents: T %zu with %zu causal documents of %zu; program = document mask "
      "program with its block mask,\ndense = the same visibility as a -inf bias (every tile), "
      "separate = %zu causal T %zu attentions (target: dense / program >= 4, program / separate "
      "<= 1.3)\n",
      kD, kHeads, kDocT, kDocs, kDocT / kDocs, kDocs, kDocT / kDocs);
  std::printf("%3s | %9s %9s %9s | %14s %17s | %8s\n", "thr", "program", "dense", "separate",
              "dense/program", "program/separate", "density");
  for (int threads : {1, 2}) {
    const auto* s = find(name("documents", threads));
    if (s == nullptr) continue;
    const double p = s->at("program"), d = s->at("dense"), sep = s->at("separate");
    std::printf("%3d | %9.1f %9.1f %9.1f | %14.2f %17.3f | %8.4f\n", threads, p * 1e3, d * 1e3,
                sep * 1e3, d / p, p / sep, s->at("density"));
  }
  std::printf(
      "\nCausal block skipping against non-causal (target: causal / full <= 0.6 at T >= 2048)\n");
  std::printf("%3s %5s | %9s %9s %9s | %12s %15s\n", "thr", "T", "full", "causal", "program",
              "causal/full", "program/full");
  for (int threads : {1, 2}) {
    for (std::size_t T : kCausalT) {
      const auto* s = find(name(("causal_T" + std::to_string(T)).c_str(), threads));
      if (s == nullptr) continue;
      const double f = s->at("full"), c = s->at("causal"), p = s->at("causal_program");
      std::printf("%3d %5zu | %9.1f %9.1f %9.1f | %12.3f %15.3f\n", threads, T, f * 1e3, c * 1e3,
                  p * 1e3, c / f, p / f);
    }
  }
  std::printf(
      "\nBuilt-ins re-expressed as programs, B %zu, T %zu (target: program / built-in <= 1.05)\n",
      kRuleB, kRuleT);
  std::printf("%3s | %9s %9s %9s | %9s %9s %9s\n", "thr", "softcap", "program", "ratio", "causal",
              "program", "ratio");
  for (int threads : {1, 2}) {
    const auto* s = find(name("rules", threads));
    if (s == nullptr) continue;
    const double a = s->at("softcap"), ap = s->at("softcap_program"), c = s->at("causal"),
                 cp = s->at("causal_program");
    std::printf("%3d | %9.1f %9.1f %9.3f | %9.1f %9.1f %9.3f\n", threads, a * 1e3, ap * 1e3, ap / a,
                c * 1e3, cp * 1e3, cp / c);
  }
}

}  // namespace attnlab::bench
