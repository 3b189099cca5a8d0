// SDPA benchmarks: the reference and fused paths, forward and forward+backward, in float, against
// the GEMM floor (the gemm calls the attention needs, on the same shapes, and nothing else).
#include "bench_common.hpp"

#include <omp.h>

#include <cstdio>
#include <vector>

#include "alloc_count.hpp"
#include "attnlab/blas.hpp"
#include "attnlab/ops/attention.hpp"
#include "attnlab/random.hpp"
#include "attnlab/threads.hpp"

namespace attnlab::bench {

namespace {

struct Inputs {
  Tensor4<float> q, k, v, dout;  // (B,H,T,D) each, D = Dv
};

Inputs make_inputs(const Shape& s) {
  Rng rng(1);
  const std::size_t B = s.bh / kHeads, T = s.T, D = s.D;
  return {randn<float, 4>({B, kHeads, T, D}, rng), randn<float, 4>({B, kHeads, T, D}, rng),
          randn<float, 4>({B, kHeads, T, D}, rng), randn<float, 4>({B, kHeads, T, D}, rng)};
}

// The GEMM floor: per (b, h) slice, the forward's 2 gemms (S = s·Q Kᵀ, O = P V) and, with
// backward, its 4 (dV = Pᵀ dO, dP = dO Vᵀ, dQ = s·dS K, dK = s·dSᵀ Q), on full T x T operands,
// parallel over slices exactly as the attention is. No softmax, no masking: causal shapes use the
// same floor.
void gemm_floor(const Inputs& x, std::vector<float>& out, std::vector<float>& grads, bool backward,
                std::size_t bh_count, std::size_t T, std::size_t D) {
  const int t = static_cast<int>(T), d = static_cast<int>(D);
  const auto count = static_cast<std::ptrdiff_t>(bh_count);
#pragma omp parallel num_threads(num_threads())
  {
    std::vector<float> p(T * T), ds(backward ? T * T : 0);  // (T,T) per-thread scratch
#pragma omp for schedule(static)
    for (std::ptrdiff_t bh = 0; bh < count; ++bh) {
      const float* q = x.q.data() + bh * T * D;
      const float* k = x.k.data() + bh * T * D;
      const float* v = x.v.data() + bh * T * D;
      float* o = out.data() + bh * T * D;
      blas::gemm<float>(false, true, t, t, d, 0.125f, q, d, k, d, 0.f, p.data(), t);
      blas::gemm<float>(false, false, t, d, t, 1.f, p.data(), t, v, d, 0.f, o, d);
      if (!backward) continue;
      const float* dout = x.dout.data() + bh * T * D;
      float* dq = grads.data() + (3 * bh) * T * D;
      float* dk = dq + T * D;
      float* dv = dk + T * D;
      blas::gemm<float>(true, false, t, d, t, 1.f, p.data(), t, dout, d, 0.f, dv, d);
      blas::gemm<float>(false, true, t, t, d, 1.f, dout, d, v, d, 0.f, ds.data(), t);
      blas::gemm<float>(false, false, t, d, t, 0.125f, ds.data(), t, k, d, 0.f, dq, d);
      blas::gemm<float>(true, false, t, d, t, 0.125f, ds.data(), t, q, d, 0.f, dk, d);
    }
  }
}

void run_attention(const Inputs& x, SdpaPath path, bool causal, bool backward) {
  SdpaOptions options;
  options.causal = causal;
  options.path = path;
  SdpaCache<float> cache;
  const auto out = sdpa_forward(cache, x.q, x.k, x.v, options);
  benchmark::DoNotOptimize(out.data());
  if (backward) {
    const auto g = sdpa_backward(x.dout, cache, x.q, x.k, x.v);
    benchmark::DoNotOptimize(g.dq.data());
  }
}

}  // namespace

void bench_attention(benchmark::State& state, Shape s) {
  set_num_threads(s.threads);
  const Inputs x = make_inputs(s);
  const bool backward = s.op == Op::forward_backward;
  if (s.variant == Variant::floor) {
    std::vector<float> out(s.bh * s.T * s.D), grads(backward ? 3 * s.bh * s.T * s.D : 0);
    for (auto _ : state) gemm_floor(x, out, grads, backward, s.bh, s.T, s.D);
  } else {
    const SdpaPath path = s.variant == Variant::reference ? SdpaPath::reference : SdpaPath::fused;
    for (auto _ : state) run_attention(x, path, s.causal, backward);
  }
}

std::ptrdiff_t attention_peak_bytes(const Shape& s, SdpaPath path) {
  set_num_threads(s.threads);
  const Inputs x = make_inputs(s);
  reset_peak();
  run_attention(x, path, s.causal, true);
  return peak_bytes();
}

}  // namespace attnlab::bench
