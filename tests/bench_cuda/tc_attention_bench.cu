// The tensor-core fused attention (lib/backends/cuda/attention_tc_kernels.cuh) on a GPU: first a
// check on small shapes against attention in double on the CPU (the same bf16-rounded inputs;
// the largest error relative to the largest |reference| of each output must stay under 2e-2, and
// the backward must be bit for bit the same on a second run), then the forward and backward
// throughput at B = 4, H = 16, T ∈ {1024, 4096}, D ∈ {64, 128}, causal or not. A Markdown table on
// stdout; exit status 1 if a check fails. Built and run by tc_attention_bench.sh.
//
// FLOPs counted as FlashAttention does: forward 4·BH·T²·D (halved when causal), backward 2.5× that.
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <vector>

#include "attention_tc_kernels.cuh"

namespace {

namespace tc = attnlab::cuda::tc;

void check_cuda(cudaError_t e, const char* what) {
  if (e != cudaSuccess) {
    std::fprintf(stderr, "%s: %s\n", what, cudaGetErrorString(e));
    std::exit(2);
  }
}

struct CudaLaunch {
  template <class... Params, class... Args>
  void launch(void (*kernel)(Params...), dim3 grid, dim3 block, std::size_t shared_bytes,
              Args... args) {
    if (shared_bytes > 0) {
      check_cuda(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                      static_cast<int>(shared_bytes)),
                 "cudaFuncSetAttribute");
    }
    kernel<<<grid, block, shared_bytes>>>(args...);
    check_cuda(cudaGetLastError(), "launch");
  }
};

template <class T>
T* device(std::size_t n) {
  void* p = nullptr;
  check_cuda(cudaMalloc(&p, n * sizeof(T) + 16), "cudaMalloc");
  return static_cast<T*>(p);
}

struct Problem {
  std::size_t B, H, Hkv, T, D;
  bool causal;
};

// Device buffers of one problem, inputs random N(0, 1) in bf16.
struct Buffers {
  Problem pr;
  std::vector<float> qf, kf, vf, dof;  // the bf16 values, for the CPU reference
  attnlab_bf16 *q, *k, *v, *dout;
  float *out, *lse, *dq, *dk, *dv, *row_dot, *scale;
  attnlab::AttentionParams<float> a;

  explicit Buffers(const Problem& p) : pr(p) {
    std::mt19937 rng(7);
    std::normal_distribution<float> normal;
    const std::size_t nq = p.B * p.H * p.T * p.D, nk = p.B * p.Hkv * p.T * p.D;
    const auto fill = [&](std::vector<float>& values, std::size_t n, attnlab_bf16*& dev) {
      std::vector<attnlab_bf16> bits(n);
      values.resize(n);
      for (std::size_t e = 0; e < n; ++e) {
        bits[e] = __float2bfloat16_rn(normal(rng));
        values[e] = __bfloat162float(bits[e]);
      }
      dev = device<attnlab_bf16>(n);
      check_cuda(cudaMemcpy(dev, bits.data(), n * sizeof(attnlab_bf16), cudaMemcpyHostToDevice),
                 "upload");
    };
    fill(qf, nq, q);
    fill(kf, nk, k);
    fill(vf, nk, v);
    fill(dof, nq, dout);
    out = device<float>(nq), dq = device<float>(nq), dk = device<float>(nk);
    dv = device<float>(nk), lse = device<float>(p.B * p.H * p.T);
    row_dot = device<float>(p.B * p.H * p.T), scale = device<float>(p.H);
    const std::vector<float> s(p.H, 1.0f / std::sqrt(static_cast<float>(p.D)));
    check_cuda(cudaMemcpy(scale, s.data(), p.H * sizeof(float), cudaMemcpyHostToDevice), "upload");
    a.B = p.B, a.H = p.H, a.Hkv = p.Hkv, a.Tq = p.T, a.Tk = p.T, a.D = p.D, a.Dv = p.D;
    a.causal = p.causal;
    a.scale = scale;
  }
  ~Buffers() {
    for (void* p : {static_cast<void*>(q), static_cast<void*>(k), static_cast<void*>(v),
                    static_cast<void*>(dout), static_cast<void*>(out), static_cast<void*>(lse),
                    static_cast<void*>(dq), static_cast<void*>(dk), static_cast<void*>(dv),
                    static_cast<void*>(row_dot), static_cast<void*>(scale)}) {
      cudaFree(p);
    }
  }

  template <int HD>
  void forward() {
    CudaLaunch rt;
    tc::tc_attention_forward<HD>(rt, out, lse, q, k, v, a);
  }
  template <int HD>
  void backward() {
    CudaLaunch rt;
    tc::tc_attention_backward<HD>(rt, dq, dk, dv, row_dot, q, k, v, dout, out, lse, a);
  }
  std::vector<float> download(const float* p, std::size_t n) const {
    std::vector<float> x(n);
    check_cuda(cudaMemcpy(x.data(), p, n * sizeof(float), cudaMemcpyDeviceToHost), "download");
    return x;
  }
};

// Attention and its gradients in double, element by element.
void reference(const Buffers& bu, std::vector<double>& out, std::vector<double>& dq,
               std::vector<double>& dk, std::vector<double>& dv) {
  const Problem& p = bu.pr;
  const std::size_t G = p.H / p.Hkv, D = p.D, T = p.T;
  const double s = 1.0 / std::sqrt(static_cast<double>(D));
  out.assign(p.B * p.H * T * D, 0), dq.assign(out.size(), 0);
  dk.assign(p.B * p.Hkv * T * D, 0), dv.assign(dk.size(), 0);
  for (std::size_t bh = 0; bh < p.B * p.H; ++bh) {
    const std::size_t kv = bh / p.H * p.Hkv + bh % p.H / G;
    for (std::size_t i = 0; i < T; ++i) {
      const std::size_t n = p.causal ? i + 1 : T;
      std::vector<double> pr(n), dp(n, 0);
      double top = -INFINITY, sum = 0, row_dot = 0;
      for (std::size_t j = 0; j < n; ++j) {
        double dot = 0;
        for (std::size_t d = 0; d < D; ++d) {
          dot += double(bu.qf[(bh * T + i) * D + d]) * bu.kf[(kv * T + j) * D + d];
        }
        top = std::max(top, pr[j] = s * dot);
      }
      for (std::size_t j = 0; j < n; ++j) sum += pr[j] = std::exp(pr[j] - top);
      for (std::size_t j = 0; j < n; ++j) {
        pr[j] /= sum;
        for (std::size_t d = 0; d < D; ++d) {
          const double vjd = bu.vf[(kv * T + j) * D + d], g = bu.dof[(bh * T + i) * D + d];
          out[(bh * T + i) * D + d] += pr[j] * vjd;
          dp[j] += g * vjd;
          dv[(kv * T + j) * D + d] += pr[j] * g;
        }
        row_dot += pr[j] * dp[j];
      }
      for (std::size_t j = 0; j < n; ++j) {
        const double g = s * pr[j] * (dp[j] - row_dot);
        for (std::size_t d = 0; d < D; ++d) {
          dq[(bh * T + i) * D + d] += g * bu.kf[(kv * T + j) * D + d];
          dk[(kv * T + j) * D + d] += g * bu.qf[(bh * T + i) * D + d];
        }
      }
    }
  }
}

double relative_error(const std::vector<float>& x, const std::vector<double>& ref) {
  double err = 0, top = 0;
  for (std::size_t e = 0; e < x.size(); ++e) {
    const double d = std::fabs(double(x[e]) - ref[e]);
    if (!(d <= err)) err = d;
    top = std::max(top, std::fabs(ref[e]));
  }
  return top > 0 ? err / top : err;
}

template <int HD>
bool check(bool causal) {
  Buffers bu(Problem{1, 4, 2, 200, HD, causal});
  bu.forward<HD>();
  bu.backward<HD>();
  check_cuda(cudaDeviceSynchronize(), "check");
  const std::size_t nq = bu.qf.size(), nk = bu.kf.size();
  const auto dq1 = bu.download(bu.dq, nq), dk1 = bu.download(bu.dk, nk);
  const auto dv1 = bu.download(bu.dv, nk);
  bu.backward<HD>();
  const bool same = dq1 == bu.download(bu.dq, nq) && dk1 == bu.download(bu.dk, nk) &&
                    dv1 == bu.download(bu.dv, nk);
  std::vector<double> out, dq, dk, dv;
  reference(bu, out, dq, dk, dv);
  const double e[4] = {relative_error(bu.download(bu.out, nq), out), relative_error(dq1, dq),
                       relative_error(dk1, dk), relative_error(dv1, dv)};
  const bool ok = same && *std::max_element(e, e + 4) < 2e-2;
  std::printf("| check D=%d %s | O %.2e | dQ %.2e | dK %.2e | dV %.2e | %s | %s |\n", HD,
              causal ? "causal" : "full", e[0], e[1], e[2], e[3],
              same ? "deterministic" : "NOT DETERMINISTIC", ok ? "ok" : "FAIL");
  return ok;
}

template <int HD>
void time_case(std::size_t T, bool causal) {
  Buffers bu(Problem{4, 16, 16, T, HD, causal});
  cudaEvent_t start, stop;
  cudaEventCreate(&start), cudaEventCreate(&stop);
  const auto time_ms = [&](auto&& f) {
    f();  // warm-up
    cudaEventRecord(start);
    const int reps = 10;
    for (int r = 0; r < reps; ++r) f();
    cudaEventRecord(stop);
    check_cuda(cudaEventSynchronize(stop), "timing");
    float ms = 0;
    cudaEventElapsedTime(&ms, start, stop);
    return ms / reps;
  };
  const double fwd_ms = time_ms([&] { bu.forward<HD>(); });
  const double bwd_ms = time_ms([&] { bu.backward<HD>(); });
  const double flops = 4.0 * 4 * 16 * double(T) * double(T) * HD * (causal ? 0.5 : 1.0);
  std::printf(
      "| B=4 H=16 T=%zu D=%d %s | fwd %.3f ms | %.1f TFLOP/s | bwd %.3f ms | %.1f TFLOP/s |\n", T,
      HD, causal ? "causal" : "full", fwd_ms, flops / fwd_ms * 1e-9, bwd_ms,
      2.5 * flops / bwd_ms * 1e-9);
  cudaEventDestroy(start), cudaEventDestroy(stop);
}

}  // namespace

int main() {
  int devices = 0;
  if (cudaGetDeviceCount(&devices) != cudaSuccess || devices == 0) {
    std::printf("tc_attention_bench: no CUDA device\n");
    return 2;
  }
  cudaDeviceProp prop;
  cudaGetDeviceProperties(&prop, 0);
  std::printf("# tensor-core attention on %s (sm_%d%d)\n\n", prop.name, prop.major, prop.minor);
  std::printf("| check | O | dQ | dK | dV | backward | result |\n|---|---|---|---|---|---|---|\n");
  bool ok = check<64>(false) & check<64>(true) & check<128>(false) & check<128>(true);
  std::printf("\n| shape | forward | | backward | |\n|---|---|---|---|---|\n");
  for (std::size_t T : {1024, 4096}) {
    for (bool causal : {false, true}) {
      time_case<64>(T, causal);
      time_case<128>(T, causal);
    }
  }
  return ok ? 0 : 1;
}
