// Training-step benchmarks: one step = forward, fused softmax cross-entropy, zero_grad, backward
// and the library's SGD update, in float, on random tokens, for the models of train_models.hpp
// (study, small, nanogpt). Each iteration runs the reference and the fused attention path once each
// (interleaved; the minimum per path is reported), at 1 and at 2 threads. The table adds model
// FLOPs per token (transformer_flops_per_token), GFLOP/s, the utilisation against the cores' FMA
// peak (measure_fma_peak) and against the sgemm peak (measure_gemm_peak_gflops, the MFU), both
// measured at the same thread count, and PyTorch eager when given its times.
#include "bench_train.hpp"
#include "train_models.hpp"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <limits>
#include <memory>
#include <sstream>
#include <vector>

#include <benchmark/benchmark.h>

#include "attnlab/blas.hpp"
#include "attnlab/fma_peak.hpp"
#include "attnlab/nn/transformer.hpp"
#include "attnlab/ops/cross_entropy.hpp"
#include "attnlab/optim/sgd.hpp"
#include "attnlab/random.hpp"
#include "attnlab/threads.hpp"

namespace attnlab::bench {

namespace {

double wall_seconds() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

// One training step of `model` on (tokens, targets), with the library's SGD (lr 1e-3, as
// torch_step.py's torch.optim.SGD); returns the loss.
float train_step(Transformer<float>& model, SGD<float>& optimizer, const TokenIds& tokens,
                 const TokenIds& targets) {
  const Tensor3<float> logits = model.forward({tokens});
  const auto ce = softmax_cross_entropy<float, 3>(logits, targets);
  model.zero_grad();
  model.backward(ce.dlogits);
  optimizer.step();
  return ce.loss;
}

void bench_train(benchmark::State& state, TrainModel m, int threads) {
  set_num_threads(threads);
  Rng rng(5);
  TokenIds tokens({m.B, m.T}), targets({m.B, m.T});
  for (std::size_t i = 0; i < tokens.size(); ++i) {
    tokens.data()[i] = static_cast<int>(rng.below(m.vocab));
    targets.data()[i] = static_cast<int>(rng.below(m.vocab));
  }
  const SdpaPath paths[] = {SdpaPath::reference, SdpaPath::fused};
  std::vector<std::unique_ptr<Transformer<float>>> models;
  std::vector<std::unique_ptr<SGD<float>>> optimizers;
  for (SdpaPath path : paths) {
    Rng init(7);
    models.push_back(std::make_unique<Transformer<float>>(train_config(m, path), init));
    optimizers.push_back(
        std::make_unique<SGD<float>>(models.back()->parameters(), SgdOptions{.lr = 1e-3}));
  }
  double best[2] = {std::numeric_limits<double>::infinity(),
                    std::numeric_limits<double>::infinity()};
  for (auto _ : state) {
    for (std::size_t i = 0; i < 2; ++i) {
      const double start = wall_seconds();
      benchmark::DoNotOptimize(train_step(*models[i], *optimizers[i], tokens, targets));
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

void print_train_table(const std::map<std::string, std::map<std::string, double>>& seconds,
                       const std::string& torch_file) {
  std::map<std::string, double> torch;  // train_name -> seconds per step
  if (!torch_file.empty()) {
    std::ifstream in(torch_file);
    if (!in) std::printf("\n(cannot read the PyTorch times in %s)\n", torch_file.c_str());
    std::string line;
    while (std::getline(in, line)) {
      std::istringstream fields(line);
      std::string model;
      int threads = 0;
      double step = 0;
      if (fields >> model >> threads >> step)
        torch["train/" + model + "/thr:" + std::to_string(threads)] = step;
    }
  }
  std::printf(
      "\nTraining step (forward, cross-entropy, backward, SGD), float, wall clock (best step)\n"
      "study:   1 layer, 1 head, attention only, d_model 64, d_k 256, T 33, B 64\n"
      "small:   2 layers, 4 heads, d_model 128, d_ff 512, T 256, B 16\n"
      "nanogpt: nanoGPT's CPU Shakespeare shape, 4 layers, 4 heads, d_model 128, T 64, B 12, V 65\n"
      "(all causal). Model FLOPs: 6N + attention per token (nanoGPT's count) x tokens/s of the\n"
      "faster path. Utilisation against two peaks measured now at the same thread count:\n"
      "%%FMA, the cores' FMA peak (a register-only FMA loop, attnlab/fma_peak.hpp), and MFU, the\n"
      "sgemm peak (each thread its own 1024^3 sgemm; nanoGPT's and llm.c's denominator).\n");
  // The best of two measurements of 5 rounds each: a vCPU taken away for a moment by the host
  // would otherwise lower a peak (and raise the utilisation) of a whole run.
  std::map<int, double> peak, fma;
  std::map<int, std::string> fma_vector;
  for (int threads : {1, 2}) {
    peak[threads] = std::max(measure_gemm_peak_gflops<float>(threads, 1024, 5),
                             measure_gemm_peak_gflops<float>(threads, 1024, 5));
    const FmaPeak a = measure_fma_peak(threads, 0.05, 5), b = measure_fma_peak(threads, 0.05, 5);
    fma[threads] = std::max(a.gflops, b.gflops);
    fma_vector[threads] = a.gflops >= b.gflops ? a.vector : b.vector;
  }
  std::printf("FMA peak: %.1f GFLOP/s at 1 thread (%s), %.1f at 2 (%s)\n", fma[1],
              fma_vector[1].c_str(), fma[2], fma_vector[2].c_str());
  std::printf(
      "sgemm peak: %.1f GFLOP/s at 1 thread, %.1f at 2 (core %s) = %.0f%% and %.0f%% of the "
      "FMA peak\n",
      peak[1], peak[2], blas_info().core.c_str(), 100 * peak[1] / fma[1], 100 * peak[2] / fma[2]);
  std::printf("%-8s %3s | %10s %10s %9s | %8s %7s %5s %5s | %13s | %s\n", "model", "thr",
              "ref tok/s", "fused tok/s", "fused/ref", "MFLOP/tk", "GFLOP/s", "%FMA", "MFU",
              "thr 2 / thr 1", torch.empty() ? "" : "torch ms  attnlab ms  torch/attnlab");
  for (const TrainModel& m : kTrainModels) {
    const double flops = transformer_flops_per_token(train_config(m), m.T);
    for (int threads : {1, 2}) {
      const auto it = seconds.find(train_name(m, threads));
      if (it == seconds.end()) continue;
      const double tokens = static_cast<double>(m.B * m.T);
      const double ref = it->second.at("ref"), fused = it->second.at("fused");
      const double best = std::min(ref, fused);
      const double gflops = flops * tokens / best / 1e9;
      std::printf("%-8s %3d | %10.0f %10.0f %9.2f | %8.2f %7.1f %4.0f%% %4.0f%% |", m.name, threads,
                  tokens / ref, tokens / fused, ref / fused, flops / 1e6, gflops,
                  100 * gflops / fma[threads], 100 * gflops / peak[threads]);
      const auto one = seconds.find(train_name(m, 1));
      if (threads == 2 && one != seconds.end()) {
        std::printf(" ref %4.2f fused %4.2f |", one->second.at("ref") / ref,
                    one->second.at("fused") / fused);
      } else {
        std::printf("%15s|", "");
      }
      const auto t = torch.find(train_name(m, threads));
      if (t != torch.end())
        std::printf(" %8.2f %11.2f %14.2f", 1e3 * t->second, 1e3 * best, t->second / best);
      std::printf("\n");
    }
  }
}

}  // namespace attnlab::bench
