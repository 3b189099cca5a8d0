// One training step (forward, cross-entropy, backward, AdamW) of the same model and batch two ways:
//   module: the CPU Modules (Transformer) and attnlab::AdamW, as the trainer runs today;
//   device: DeviceTransformer + DeviceOptimizer on the CPU backend (attnlab/backends/cpu.hpp).
// Their ratio says what writing the Modules over DeviceOps would cost on the CPU (redesign issue
// 11, item 1). Float, the models of train_models.hpp, 1 and 2 threads; the two are interleaved per
// iteration and the minimum of each is reported.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <limits>

#include <benchmark/benchmark.h>

#include "attnlab/backends/cpu.hpp"
#include "attnlab/nn/device_transformer.hpp"
#include "attnlab/nn/transformer.hpp"
#include "attnlab/ops/cross_entropy.hpp"
#include "attnlab/optim/adamw.hpp"
#include "attnlab/random.hpp"
#include "attnlab/threads.hpp"
#include "bench_train.hpp"
#include "train_models.hpp"

extern "C" char* openblas_get_corename(void);

namespace attnlab::bench {

namespace {

double now() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

void bench_backend(benchmark::State& state, TrainModel m, int threads) {
  set_num_threads(threads);
  Rng rng(5);
  TokenIds tokens({m.B, m.T}), targets({m.B, m.T});
  for (std::size_t i = 0; i < tokens.size(); ++i) {
    tokens.data()[i] = static_cast<int>(rng.below(m.vocab));
    targets.data()[i] = static_cast<int>(rng.below(m.vocab));
  }
  const TransformerConfig config = train_config(m);
  const AdamWOptions options{1e-3, 0.9, 0.95, 1e-8, 0.01};
  Rng init(7);
  Transformer<float> model(config, init);
  const ParameterList<float> params = model.parameters();
  AdamW<float> opt(params, options);
  Rng init2(7);
  Transformer<float> host(config, init2);
  const auto ops = make_cpu_device_ops<float>();
  DeviceTransformer<float> dev(host, *ops);
  DeviceOptimizer<float> dopt(dev, options);

  double best_module = std::numeric_limits<double>::infinity(), best_device = best_module;
  for (auto _ : state) {
    double start = now();
    const Tensor3<float> logits = model.forward({tokens});
    const auto ce = softmax_cross_entropy<float, 3>(logits, targets);
    model.zero_grad();
    model.backward(ce.dlogits);
    opt.step();
    benchmark::DoNotOptimize(ce.loss);
    best_module = std::min(best_module, now() - start);

    start = now();
    dev.forward({tokens});
    benchmark::DoNotOptimize(dev.loss(targets));
    dev.backward();
    dopt.step();
    best_device = std::min(best_device, now() - start);
  }
  state.counters["module"] = best_module;
  state.counters["device"] = best_device;
}

std::string backend_name(const TrainModel& m, int threads) {
  return std::string("backend/") + m.name + "/thr:" + std::to_string(threads);
}

}  // namespace

void register_backend_benchmarks() {
  for (const TrainModel& m : kTrainModels) {
    for (int threads : {1, 2}) {
      benchmark::RegisterBenchmark(backend_name(m, threads).c_str(), bench_backend, m, threads)
          ->UseRealTime()
          ->Unit(benchmark::kMillisecond);
    }
  }
}

void print_backend_table(const std::map<std::string, std::map<std::string, double>>& seconds) {
  std::printf(
      "\nTraining step with AdamW, float, wall clock (min per step): CPU Modules vs\n"
      "DeviceTransformer on the CPU backend; OpenBLAS core %s\n",
      openblas_get_corename());
  std::printf("%-6s %3s | %11s %11s | %13s\n", "model", "thr", "module ms", "device ms",
              "device/module");
  for (const TrainModel& m : kTrainModels) {
    for (int threads : {1, 2}) {
      const auto it = seconds.find(backend_name(m, threads));
      if (it == seconds.end()) continue;
      const double mod = it->second.at("module"), dev = it->second.at("device");
      std::printf("%-6s %3d | %11.3f %11.3f | %13.3f\n", m.name, threads, mod * 1e3, dev * 1e3,
                  dev / mod);
    }
  }
}

}  // namespace attnlab::bench
