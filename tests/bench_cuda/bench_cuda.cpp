// Attention on the GPU: forward and forward+backward throughput of the reference path (cuBLAS +
// softmax kernels) and the fused path (tiled online softmax), float, B·H = 96 (B = 8, H = 12),
// D = Dv = 64, T ∈ {256, 1024, 4096}, no mask. The floor is cuBLAS SGEMM alone running the same
// GEMMs (the same FLOPs) in this binary: 2 GEMMs forward, 6 forward+backward.
//
// FLOPs counted: forward 4·BH·T²·D (Q Kᵀ and P V); forward+backward 3× that (the four backward
// GEMMs added), for every path. Exp, softmax and the fused backward's recomputation of Q Kᵀ are
// not counted, as is usual.
//
// Then the training step (forward, fused cross-entropy, backward, AdamW) of two models, on the CPU
// (attnlab::Transformer, all cores) and on the GPU (the same Transformer moved there), float,
// causal, from the same weights on the same random tokens (the models of tests/bench/
// train_models.hpp); the first step's losses are printed side by side as a check that both
// computed the same thing.
//
// Usage: attnlab_bench_cuda [--quick]  (--quick: T ∈ {256, 1024} only)
// Without a device it prints why and exits 0; with ATTNLAB_REQUIRE_GPU=1 it exits 1.
#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "../bench/train_models.hpp"
#include "attnlab/cuda.hpp"
#include "attnlab/device_ops.hpp"
#include "attnlab/nn/cross_entropy.hpp"
#include "attnlab/nn/transformer.hpp"
#include "attnlab/ops/cross_entropy.hpp"
#include "attnlab/optim/adamw.hpp"
#include "attnlab/random.hpp"
#include "attnlab/threads.hpp"

using namespace attnlab;

namespace {

// Mean seconds per call: one warm-up call, then repeats until 0.3 s or 20 calls.
double time_call(const std::function<void()>& call) {
  call();
  cuda::synchronize();
  int reps = 0;
  const auto start = std::chrono::steady_clock::now();
  double elapsed = 0;
  while (reps < 20 && (reps < 3 || elapsed < 0.3)) {
    call();
    cuda::synchronize();
    ++reps;
    elapsed = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  }
  return elapsed / reps;
}

std::vector<float> random_values(std::size_t n, std::uint64_t seed) {
  std::vector<float> x(n);
  for (auto& v : x) {  // xorshift64, uniform in [-1, 1)
    seed ^= seed << 13;
    seed ^= seed >> 7;
    seed ^= seed << 17;
    v = static_cast<float>(seed >> 40) / static_cast<float>(1 << 23) - 1.0f;
  }
  return x;
}

void row(const char* path, std::size_t T, double flops_fwd, double t_fwd, double t_all) {
  std::printf("| %5zu | %-22s | %9.3f | %7.2f | %9.3f | %7.2f |\n", T, path, t_fwd * 1e3,
              flops_fwd / t_fwd * 1e-12, t_all * 1e3, 3 * flops_fwd / t_all * 1e-12);
}

// Median seconds of `reps` calls after two warm-up calls.
double median_seconds(const std::function<void()>& call, int reps) {
  call();
  call();
  std::vector<double> t;
  for (int i = 0; i < reps; ++i) {
    const auto start = std::chrono::steady_clock::now();
    call();
    t.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
  }
  std::sort(t.begin(), t.end());
  return t[t.size() / 2];
}

void train_step_table() {
  std::printf(
      "\ntraining step (forward, cross-entropy, backward, AdamW), float, CPU on %d threads\n\n",
      num_threads());
  std::printf(
      "| model | tokens/step | CPU ms  | GPU ms  | GPU speed-up | step-1 loss CPU / GPU |\n");
  std::printf(
      "|-------|-------------|---------|---------|--------------|-----------------------|\n");
  for (const auto& m : bench::kTrainModels) {
    const TransformerConfig c = bench::train_config(m);
    Rng rng(5);
    TokenIds tokens({m.B, m.T}), targets({m.B, m.T});
    for (std::size_t i = 0; i < tokens.size(); ++i) {
      tokens.data()[i] = static_cast<int>(rng.below(m.vocab));
      targets.data()[i] = static_cast<int>(rng.below(m.vocab));
    }
    const auto ops = make_cuda_device_ops<float>();  // outlives the model moved to it
    Rng same = rng;
    Transformer<float> cpu(c, rng);
    Transformer<float> dev(c, same);  // the same weights, moved to the GPU: one model code
    dev.to(*ops);
    const AdamWOptions adam{1e-3, 0.9, 0.95, 1e-8, 0.0};
    AdamW<float> opt(cpu.parameters(), adam);
    AdamW<float> dopt(dev.parameters(), adam);
    CrossEntropyLoss<float> loss_fn;
    double cpu_loss = 0, gpu_loss = 0;
    const auto cpu_step = [&] {
      const auto ce = softmax_cross_entropy<float, 3>(cpu.forward({tokens}), targets);
      cpu.zero_grad();
      cpu.backward(ce.dlogits);
      opt.step();
      if (cpu_loss == 0) cpu_loss = ce.loss;
    };
    const auto gpu_step = [&] {
      const double loss = loss_fn.forward(*ops, dev.forward(dev.upload_fields({tokens})), targets);
      dev.zero_grad();
      dev.backward(loss_fn.dlogits());
      dopt.step();
      cuda::synchronize();
      if (gpu_loss == 0) gpu_loss = loss;
    };
    const double t_gpu = median_seconds(gpu_step, 20);
    const double t_cpu = median_seconds(cpu_step, m.T > 64 ? 3 : 10);
    std::printf("| %-5s | %11zu | %7.2f | %7.3f | %11.1fx | %.5f / %.5f |\n", m.name, m.B * m.T,
                t_cpu * 1e3, t_gpu * 1e3, t_cpu / t_gpu, cpu_loss, gpu_loss);
  }
}

}  // namespace

int main(int argc, char** argv) {
  const bool quick = argc > 1 && std::string(argv[1]) == "--quick";
  if (!cuda_available()) {
    const char* require = std::getenv("ATTNLAB_REQUIRE_GPU");
    std::printf("attnlab_bench_cuda: no CUDA device (%s): nothing to measure\n",
                cuda_built() ? "no driver or no GPU" : "built without CUDA");
    return require && std::string(require) == "1" ? 1 : 0;
  }
  std::printf("device: %s\n\n", cuda_device_name().c_str());
  std::printf("| T     | path                   | fwd ms    | TFLOP/s | fwd+bwd ms | TFLOP/s |\n");
  std::printf("|-------|------------------------|-----------|---------|-----------|---------|\n");
  const std::unique_ptr<DeviceOps<float>> gpu = make_cuda_device_ops<float>();
  const std::size_t B = 8, H = 12, D = 64;
  const std::vector<std::size_t> lengths =
      quick ? std::vector<std::size_t>{256, 1024} : std::vector<std::size_t>{256, 1024, 4096};
  for (std::size_t T : lengths) {
    const std::size_t BH = B * H, n = BH * T * D, nn = BH * T * T;
    const auto host = random_values(n, 12345);
    cuda::DeviceArray<float> q(host.data(), n), k(host.data(), n), v(host.data(), n),
        dout(host.data(), n);
    std::vector<float> scale_host(H, 0.125f);
    cuda::DeviceArray<float> scale(scale_host.data(), H);
    cuda::DeviceArray<float> out(n), dq(n), dk(n), dv(n), lse(BH * T), row_dot(BH * T);
    cuda::DeviceArray<float> p(nn), ds(nn);  // (B,H,T,T): the reference path's weights and dS
    AttentionParams<float> a;
    a.B = B, a.H = H, a.Hkv = H, a.Tq = T, a.Tk = T, a.D = D, a.Dv = D;
    a.q = q.data(), a.k = k.data(), a.v = v.data(), a.scale = scale.data();
    const double flops = 4.0 * static_cast<double>(BH) * T * T * D;

    const auto ref_fwd = [&] { gpu->sdpa_reference_forward(out.data(), p.data(), a); };
    const auto ref_all = [&] {
      ref_fwd();
      gpu->sdpa_reference_backward(dq.data(), dk.data(), dv.data(), ds.data(), dout.data(),
                                   p.data(), a);
    };
    row("reference (cuBLAS)", T, flops, time_call(ref_fwd), time_call(ref_all));

    const auto fused_fwd = [&] { gpu->sdpa_fused_forward(out.data(), lse.data(), a); };
    const auto fused_all = [&] {
      fused_fwd();
      gpu->sdpa_fused_backward(dq.data(), dk.data(), dv.data(), row_dot.data(), dout.data(),
                               out.data(), lse.data(), a);
    };
    row("fused", T, flops, time_call(fused_fwd), time_call(fused_all));

    // The same six GEMMs as the reference path, without the softmax kernels.
    const int t = static_cast<int>(T), d = static_cast<int>(D), bh = static_cast<int>(BH);
    const long long sqk = static_cast<long long>(T * D), sp = static_cast<long long>(T * T);
    const auto gemm_fwd = [&] {
      cuda::gemm_strided_batched<float>(false, true, t, t, d, 1.f, q.data(), d, sqk, k.data(), d,
                                        sqk, 0.f, p.data(), t, sp, bh);
      cuda::gemm_strided_batched<float>(false, false, t, d, t, 1.f, p.data(), t, sp, v.data(), d,
                                        sqk, 0.f, out.data(), d, sqk, bh);
    };
    const auto gemm_all = [&] {
      gemm_fwd();
      cuda::gemm_strided_batched<float>(true, false, t, d, t, 1.f, p.data(), t, sp, dout.data(), d,
                                        sqk, 0.f, dv.data(), d, sqk, bh);
      cuda::gemm_strided_batched<float>(false, true, t, t, d, 1.f, dout.data(), d, sqk, v.data(), d,
                                        sqk, 0.f, ds.data(), t, sp, bh);
      cuda::gemm_strided_batched<float>(false, false, t, d, t, 1.f, ds.data(), t, sp, k.data(), d,
                                        sqk, 0.f, dq.data(), d, sqk, bh);
      cuda::gemm_strided_batched<float>(true, false, t, d, t, 1.f, ds.data(), t, sp, q.data(), d,
                                        sqk, 0.f, dk.data(), d, sqk, bh);
    };
    row("cuBLAS SGEMM floor", T, flops, time_call(gemm_fwd), time_call(gemm_all));
    cuda::set_allow_tf32(true);
    row("cuBLAS SGEMM TF32", T, flops, time_call(gemm_fwd), time_call(gemm_all));
    cuda::set_allow_tf32(false);
  }
  train_step_table();
  return 0;
}
