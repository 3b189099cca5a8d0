// Training-step benchmarks: one step = forward, fused softmax cross-entropy, zero_grad, backward
// and a plain SGD update, in float, on random tokens. Models:
//   study: the study's model, 1 layer, 1 head, attention only, d_model 64, d_k 256, T = 33, B = 64
//   small: 2 layers, 4 heads, d_model 128, d_ff 512, T = 256, B = 16
// both causal. Each iteration runs the reference and the fused attention path once each
// (interleaved; the minimum per path is reported), at 1 and at 2 threads.
#include "bench_train.hpp"
#include "train_models.hpp"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <limits>
#include <memory>
#include <vector>

#include <benchmark/benchmark.h>

#include "attnlab/nn/transformer.hpp"
#include "attnlab/ops/cross_entropy.hpp"
#include "attnlab/random.hpp"
#include "attnlab/threads.hpp"

namespace attnlab::bench {

namespace {

constexpr std::size_t kVocab = kTrainVocab;

double wall_seconds() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

// One training step of `model` on (tokens, targets); returns the loss.
float train_step(Transformer<float>& model, ParameterList<float>& params, const TokenIds& tokens,
                 const TokenIds& targets) {
  const Tensor3<float> logits = model.forward({tokens});
  const auto ce = softmax_cross_entropy<float, 3>(logits, targets);
  model.zero_grad();
  model.backward(ce.dlogits);
  constexpr float lr = 1e-3f;
  for (auto& p : params) {
    float* w = p.param->value.data();
    const float* g = p.param->grad.data();
    for (std::size_t i = 0; i < p.param->value.size(); ++i) w[i] -= lr * g[i];
  }
  return ce.loss;
}

void bench_train(benchmark::State& state, TrainModel m, int threads) {
  set_num_threads(threads);
  Rng rng(5);
  TokenIds tokens({m.B, m.T}), targets({m.B, m.T});
  for (std::size_t i = 0; i < tokens.size(); ++i) {
    tokens.data()[i] = static_cast<int>(rng.below(kVocab));
    targets.data()[i] = static_cast<int>(rng.below(kVocab));
  }
  const SdpaPath paths[] = {SdpaPath::reference, SdpaPath::fused};
  std::vector<std::unique_ptr<Transformer<float>>> models;
  std::vector<ParameterList<float>> params;
  for (SdpaPath path : paths) {
    Rng init(7);
    models.push_back(std::make_unique<Transformer<float>>(train_config(m, path), init));
    params.push_back(models.back()->parameters());
  }
  double best[2] = {std::numeric_limits<double>::infinity(),
                    std::numeric_limits<double>::infinity()};
  for (auto _ : state) {
    for (std::size_t i = 0; i < 2; ++i) {
      const double start = wall_seconds();
      benchmark::DoNotOptimize(train_step(*models[i], params[i], tokens, targets));
      best[i] = std::min(best[i], wall_seconds() - start);
    }
  }
  state.counters["ref"] = best[0];
  state.counters["fused"] = best[1];
}

std::string train_name(const TrainModel& m, int threads) {
  return std::string("train/") + m.name + "/thr:" + std::to_string(threads);
}

}  // namespace

void register_train_benchmarks(bool) {
  for (const TrainModel& m : kTrainModels) {
    for (int threads : {1, 2}) {
      benchmark::RegisterBenchmark(train_name(m, threads).c_str(), bench_train, m, threads)
          ->UseRealTime()
          ->Unit(benchmark::kMillisecond);
    }
  }
}

void print_train_table(const std::map<std::string, std::map<std::string, double>>& seconds) {
  std::printf(
      "\nTraining step (forward, cross-entropy, backward, SGD), float, wall clock, tokens/s\n"
      "study: 1 layer, 1 head, attention only, d_model 64, d_k 256, T 33, B 64\n"
      "small: 2 layers, 4 heads, d_model 128, d_ff 512, T 256, B 16 (both causal)\n");
  std::printf("%-6s %3s | %12s %12s %10s | %14s\n", "model", "thr", "ref tok/s", "fused tok/s",
              "fused/ref", "thr 2 / thr 1");
  for (const TrainModel& m : kTrainModels) {
    for (int threads : {1, 2}) {
      const auto it = seconds.find(train_name(m, threads));
      if (it == seconds.end()) continue;
      const double tokens = static_cast<double>(m.B * m.T);
      const double ref = it->second.at("ref"), fused = it->second.at("fused");
      std::printf("%-6s %3d | %12.0f %12.0f %10.2f |", m.name, threads, tokens / ref,
                  tokens / fused, ref / fused);
      const auto one = seconds.find(train_name(m, 1));
      if (threads == 2 && one != seconds.end()) {
        std::printf(" ref %4.2f fused %4.2f", one->second.at("ref") / ref,
                    one->second.at("fused") / fused);
      }
      std::printf("\n");
    }
  }
}

}  // namespace attnlab::bench
