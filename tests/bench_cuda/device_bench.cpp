// The device benchmark: what a GPU's first minutes go to. One program over DeviceOps<float>, so the
// same code runs on a GPU (the CUDA backend) and, with --emulated, on the emulated device (the
// CUDA kernel sources on the CPU) on small shapes, where it is a functional run whose times
// measure the emulator, not a GPU. It prints Markdown and writes it to --out DIR:
//   device_bench.md  everything printed;  check.md, attention.md, training.md  the tables.
//
// 1. Check: the fused attention's output and gradients in the measured precision (--precision,
//    default bf16: the tensor-core kernels where D = Dv ∈ {64, 128}) against the fp32 fused
//    kernel on the same inputs; max |error| / max |fp32 value| must stay within 2e-2 for the
//    output, 5e-2 for dQ, dK, dV. A failure makes the exit status 1, so a fast but wrong run fails.
// 2. Attention throughput: fused forward and forward+backward in that precision, D ∈ {64, 128},
//    causal and not, T ∈ {1024, 2048, 4096, 8192, 16384} (--quick: 1024, 4096) with B·H·T = 256Ki
//    tokens (H = 16, B = 16384 / T; T = 16384: B·H = 16); beside it the GEMM floor, the same
//    GEMMs (Q Kᵀ and P V forward; dV, dP, dQ, dK backward) in that precision, and the fp32 fused
//    kernel. Fused FLOPs as FlashAttention counts them: forward 4·B·H·T²·D, halved when causal,
//    backward 2.5× the forward (the recomputed Q Kᵀ included). The floor's FLOPs are the GEMMs it
//    runs: 4·B·H·T²·D forward, 12·B·H·T²·D forward+backward, never halved. "fused / floor" is the
//    ratio of the two rates: the fraction of the backend's own GEMM rate the fused kernel reaches.
// 3. Training step (forward, cross-entropy, backward, AdamW) of a GPT-2-small-shaped Transformer
//    (12 layers, d_model 768, 12 heads, T 1024, vocab 50304, tied head, causal, fused attention;
//    batch 8, --train-batch) in that precision and in fp32: tokens/s and MFU, with FLOPs per token
//    by transformer_flops_per_token (6N + 12·L·H·d_head·T, N the matmul weights) over the dense
//    bf16 peak of the GPU by name (--peak overrides). Emulated: 2 layers, d_model 64, 4 heads,
//    T 64, vocab 256, batch 2, 2 steps.
//
// Usage: attnlab_device_bench [--emulated] [--out DIR] [--precision bf16|tf32|fp32] [--quick]
//                             [--train-batch N] [--peak TFLOPS] [--no-attention] [--no-train]
// Without a device (and without --emulated) it prints why and exits 0; with ATTNLAB_REQUIRE_GPU=1
// it exits 1. Exit status 1 also when a check fails, 2 on a bad argument.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "attnlab/buffer.hpp"
#include "attnlab/cuda.hpp"
#include "attnlab/device_ops.hpp"
#include "attnlab/nn/cross_entropy.hpp"
#include "attnlab/nn/transformer.hpp"
#include "attnlab/optim/adamw.hpp"
#include "attnlab/random.hpp"
#include "device_bench.hpp"
#ifdef ATTNLAB_DEVICE_BENCH_EMULATED
#include "attnlab/backends/emulated.hpp"
#endif

using namespace attnlab;
using namespace attnlab::device_bench;

namespace {

constexpr double kOutBound = 2e-2, kGradBound = 5e-2;

struct Shape {
  std::size_t B, H, T, D;
  bool causal;
  std::size_t bh() const { return B * H; }
};

// The tensors of one attention shape on the device, filled with uniform [-1, 1) values; with the
// bf16_operands floor, bf16 copies of q, k, v, dout and bf16 values for P and dP.
struct AttentionData {
  Buffer<float> q, k, v, dout, scale, out, lse, dq, dk, dv, row_dot, p, ds;
  Buffer<std::uint16_t> qb, kb, vb, doutb, pb, dsb;
  std::size_t chunk;  // heads per batch of the GEMM floor (p and ds hold chunk · T² values)
  AttentionParams<float> a;

  AttentionData(DeviceOps<float>& ops, const Shape& s, FloorEngine engine) {
    const std::size_t n = s.bh() * s.T * s.D, tt = s.T * s.T;
    const std::vector<std::size_t> shape{s.B, s.H, s.T, s.D}, rows{s.B, s.H, s.T};
    const bool bf16 = engine == FloorEngine::bf16_operands;
    const auto filled = [&](std::uint64_t seed, Buffer<std::uint16_t>& bits) {
      const auto host = random_values(n, seed);
      if (bf16) {
        std::vector<std::uint16_t> b(n);
        std::transform(host.begin(), host.end(), b.begin(), bf16_bits);
        bits = Buffer<std::uint16_t>::from_host(ops, b.data(), shape);
      }
      return Buffer<float>::from_host(ops, host.data(), shape);
    };
    q = filled(1, qb), k = filled(2, kb), v = filled(3, vb), dout = filled(4, doutb);
    const std::vector<float> scales(s.H, static_cast<float>(1 / std::sqrt(double(s.D))));
    scale = Buffer<float>::from_host(ops, scales.data(), {s.H});
    out = Buffer<float>(ops, shape), dq = Buffer<float>(ops, shape);
    dk = Buffer<float>(ops, shape), dv = Buffer<float>(ops, shape);
    lse = Buffer<float>(ops, rows), row_dot = Buffer<float>(ops, rows);
    chunk = std::clamp<std::size_t>((std::size_t{1} << 28) / tt, 1, s.bh());
    p = Buffer<float>(ops, {chunk * tt}), ds = Buffer<float>(ops, {chunk * tt});
    if (bf16) {  // P and dP: one block of random bf16 values, repeated
      std::vector<std::uint16_t> block(std::min<std::size_t>(chunk * tt, std::size_t{1} << 22));
      const auto values = random_values(block.size(), 5);
      std::transform(values.begin(), values.end(), block.begin(), bf16_bits);
      pb = Buffer<std::uint16_t>(ops, {chunk * tt}), dsb = Buffer<std::uint16_t>(ops, {chunk * tt});
      for (std::size_t i = 0; i < chunk * tt; i += block.size()) {
        const std::size_t m = std::min(block.size(), chunk * tt - i) * sizeof(std::uint16_t);
        ops.upload(pb.data() + i, block.data(), m);
        ops.upload(dsb.data() + i, block.data(), m);
      }
    }
    a.B = s.B, a.H = s.H, a.Hkv = s.H, a.Tq = s.T, a.Tk = s.T, a.D = s.D, a.Dv = s.D;
    a.causal = s.causal;
    a.q = q.data(), a.k = k.data(), a.v = v.data(), a.scale = scale.data();
  }
};

void fused_forward(DeviceOps<float>& ops, AttentionData& d) {
  ops.sdpa_fused_forward(d.out.data(), d.lse.data(), d.a);
}
void fused_all(DeviceOps<float>& ops, AttentionData& d) {
  fused_forward(ops, d);
  ops.sdpa_fused_backward(d.dq.data(), d.dk.data(), d.dv.data(), d.row_dot.data(), d.dout.data(),
                          d.out.data(), d.lse.data(), d.a);
}

// The GEMMs of attention without its softmax, for n heads (strides sx = T·D, sp = T·T): S = Q Kᵀ,
// O = P V; backward dV = Pᵀ dO, dP = dO Vᵀ, dQ = dP K, dK = dPᵀ Q. P and dP are read from p and ds
// (for float operands the very outputs s and dp). gemm(ta, tb, m, n, k, A, lda, sa, B, ldb, sb, C,
// ldc, sc, batch) computes C = op(A) op(B).
template <class E, class Gemm>
void six_gemms(const Gemm& gemm, bool backward, int t, int dd, int n, long long sx, long long sp,
               const E* q, const E* k, const E* v, const E* dout, const E* p, const E* ds, float* s,
               float* out, float* dp, float* dq, float* dk, float* dv) {
  gemm(false, true, t, t, dd, q, dd, sx, k, dd, sx, s, t, sp, n);
  gemm(false, false, t, dd, t, p, t, sp, v, dd, sx, out, dd, sx, n);
  if (!backward) return;
  gemm(true, false, t, dd, t, p, t, sp, dout, dd, sx, dv, dd, sx, n);
  gemm(false, true, t, t, dd, dout, dd, sx, v, dd, sx, dp, t, sp, n);
  gemm(false, false, t, dd, t, ds, t, sp, k, dd, sx, dq, dd, sx, n);
  gemm(true, false, t, dd, t, ds, t, sp, q, dd, sx, dk, dd, sx, n);
}

// The GEMM floor of one shape: every head's six_gemms through `engine` (FloorEngine), heads
// batched by d.chunk (ops_gemm: one head a call).
void gemm_floor(DeviceOps<float>& ops, const Shape& s, AttentionData& d, bool backward,
                FloorEngine engine) {
  const std::size_t td = s.T * s.D;
  const int t = int(s.T), dd = int(s.D);
  const long long sx = static_cast<long long>(td), sp = static_cast<long long>(s.T * s.T);
  for (std::size_t h0 = 0; h0 < s.bh(); h0 += d.chunk) {
    const std::size_t c = std::min(d.chunk, s.bh() - h0), o = h0 * td;
    const int n = int(c);
    float *p = d.p.data(), *ds = d.ds.data(), *out = d.out.data() + o, *dq = d.dq.data() + o,
          *dk = d.dk.data() + o, *dv = d.dv.data() + o;
    const float *q = d.q.data() + o, *k = d.k.data() + o, *v = d.v.data() + o,
                *dout = d.dout.data() + o;
    const auto run = [&](const auto& gemm) {
      six_gemms(gemm, backward, t, dd, n, sx, sp, q, k, v, dout, p, ds, p, out, ds, dq, dk, dv);
    };
    switch (engine) {
      case FloorEngine::ops_gemm:
        for (std::size_t i = 0; i < c; ++i) {
          const std::size_t h = i * td;
          six_gemms([&](bool ta, bool tb, int m, int nn, int kk, const float* a, int lda, long long,
                        const float* b, int ldb, long long, float* cc, int ldc, long long,
                        int) { ops.gemm(ta, tb, m, nn, kk, 1.f, a, lda, b, ldb, 0.f, cc, ldc); },
                    backward, t, dd, 1, sx, sp, q + h, k + h, v + h, dout + h, p, ds, p, out + h,
                    ds, dq + h, dk + h, dv + h);
        }
        break;
      case FloorEngine::cublas_fp32:
        run([](bool ta, bool tb, int m, int nn, int kk, const float* a, int lda, long long sa,
               const float* b, int ldb, long long sb, float* cc, int ldc, long long sc, int bt) {
          cuda::gemm_strided_batched<float>(ta, tb, m, nn, kk, 1.f, a, lda, sa, b, ldb, sb, 0.f, cc,
                                            ldc, sc, bt);
        });
        break;
      case FloorEngine::tf32_gemm:
        run([](bool ta, bool tb, int m, int nn, int kk, const float* a, int lda, long long sa,
               const float* b, int ldb, long long sb, float* cc, int ldc, long long sc, int bt) {
          cuda::gemm_strided_batched_tf32(ta, tb, m, nn, kk, 1.f, a, lda, sa, b, ldb, sb, 0.f, cc,
                                          ldc, sc, bt);
        });
        break;
      case FloorEngine::bf16_operands:
        six_gemms(
            [](bool ta, bool tb, int m, int nn, int kk, const std::uint16_t* a, int lda,
               long long sa, const std::uint16_t* b, int ldb, long long sb, float* cc, int ldc,
               long long sc, int bt) {
              cuda::gemm_strided_batched_bf16(ta, tb, m, nn, kk, 1.f, a, lda, sa, b, ldb, sb, 0.f,
                                              cc, ldc, sc, bt);
            },
            backward, t, dd, n, sx, sp, d.qb.data() + o, d.kb.data() + o, d.vb.data() + o,
            d.doutb.data() + o, d.pb.data(), d.dsb.data(), p, out, ds, dq, dk, dv);
        break;
    }
  }
}

std::vector<float> host(const Buffer<float>& b) {
  std::vector<float> h(b.size());
  b.copy_to_host(h.data());
  return h;
}

// The check of one (D, causal): the fused forward and backward in `fast` against fp32. Returns
// whether every error is within its bound.
bool check_shape(DeviceOps<float>& ops, const Shape& s, GemmPrecision fast, Report& r) {
  AttentionData d(ops, s, FloorEngine::ops_gemm);
  ops.set_precision(GemmPrecision::fp32);
  fused_all(ops, d);
  const auto out = host(d.out), dq = host(d.dq), dk = host(d.dk), dv = host(d.dv);
  ops.set_precision(fast);
  fused_all(ops, d);
  const double e_out = relative_max_error(host(d.out), out);
  const double e_dq = relative_max_error(host(d.dq), dq);
  const double e_dk = relative_max_error(host(d.dk), dk);
  const double e_dv = relative_max_error(host(d.dv), dv);
  const bool ok = e_out <= kOutBound && std::max({e_dq, e_dk, e_dv}) <= kGradBound;
  r.print("| %3zu | %-6s | %5zu | %4zu | %9.2e | %9.2e | %9.2e | %9.2e | %-4s |\n", s.D,
          s.causal ? "yes" : "no", s.T, s.bh(), e_out, e_dq, e_dk, e_dv, ok ? "ok" : "FAIL");
  return ok;
}

bool attention_tables(DeviceOps<float>& ops, const Options& opt, Report& r) {
  const char* fast = to_string(opt.precision);
  const std::vector<std::size_t> lengths =
      opt.emulated ? std::vector<std::size_t>{64, 128}
      : opt.quick  ? std::vector<std::size_t>{1024, 4096}
                   : std::vector<std::size_t>{1024, 2048, 4096, 8192, 16384};
  const std::size_t tokens = opt.emulated ? 256 : std::size_t{1} << 18;  // B·H·T
  const std::size_t H = opt.emulated ? 2 : 16;
  const auto shape = [&](std::size_t T, std::size_t D, bool causal) {
    const std::size_t bh = std::max<std::size_t>(tokens / T, 1);
    const std::size_t h = std::min(H, bh);
    return Shape{bh / h, h, T, D, causal};
  };
  const Timing timing = opt.emulated ? Timing{1, 1, 1, 0.0} : Timing{1, 3, 10, 0.1};
  const FloorEngine engine = floor_engine(opt.emulated, opt.precision);

  r.print("\n## Check: fused attention in %s against fp32\n\n", fast);
  r.print("max |error| / max |fp32 value|; bounds %.0e for O, %.0e for dQ, dK, dV.\n\n", kOutBound,
          kGradBound);
  r.begin_table("check");
  r.print(
      "| D   | causal | T     | B·H  | O         | dQ        | dK        | dV        |      |\n");
  r.print(
      "|-----|--------|-------|------|-----------|-----------|-----------|-----------|------|\n");
  bool ok = true;
  for (std::size_t D : {64, 128}) {
    for (bool causal : {false, true})
      ok = check_shape(ops, shape(lengths[0], D, causal), opt.precision, r) && ok;
  }
  r.end_table();

  r.print("\n## Attention throughput, %s (B·H·T = %zu, H = %zu)\n\n", fast, tokens, H);
  r.print(
      "Fused FLOPs: FlashAttention's count (forward 4·B·H·T²·D, halved when causal; backward "
      "2.5x). Floor: the 6 GEMMs in %s through %s, their FLOPs as run. fused/floor: ratio of "
      "the rates.\n\n",
      fast, describe(engine));
  r.begin_table("attention");
  r.print(
      "| D   | causal | T     | B·H | fwd ms    | fwd TFLOP/s | floor fwd | fused/floor | "
      "f+b ms    | f+b TFLOP/s | floor f+b | fused/floor | fp32 fwd | fp32 f+b |\n");
  r.print(
      "|-----|--------|-------|-----|-----------|-------------|-----------|-------------|"
      "-----------|-------------|-----------|-------------|----------|----------|\n");
  for (std::size_t D : {64, 128}) {
    for (bool causal : {false, true}) {
      for (std::size_t T : lengths) {
        const Shape s = shape(T, D, causal);
        AttentionData d(ops, s, engine);
        const double gemm = 4.0 * double(s.bh()) * double(T) * double(T) * double(D);
        const double fa_fwd = causal ? gemm / 2 : gemm, fa_all = 3.5 * fa_fwd;
        ops.set_precision(opt.precision);
        const double t_fwd = time_call(ops, timing, [&] { fused_forward(ops, d); });
        const double t_all = time_call(ops, timing, [&] { fused_all(ops, d); });
        const double f_fwd = time_call(ops, timing, [&] { gemm_floor(ops, s, d, false, engine); });
        const double f_all = time_call(ops, timing, [&] { gemm_floor(ops, s, d, true, engine); });
        ops.set_precision(GemmPrecision::fp32);
        const double r_fwd = time_call(ops, timing, [&] { fused_forward(ops, d); });
        const double r_all = time_call(ops, timing, [&] { fused_all(ops, d); });
        const auto tf = [](double flops, double seconds) { return flops / seconds * 1e-12; };
        r.print(
            "| %3zu | %-6s | %5zu | %3zu | %9.3f | %11.4g | %9.4g | %11.3f | %9.3f | %11.4g | "
            "%9.4g | %11.3f | %8.4g | %8.4g |\n",
            D, causal ? "yes" : "no", T, s.bh(), t_fwd * 1e3, tf(fa_fwd, t_fwd), tf(gemm, f_fwd),
            tf(fa_fwd, t_fwd) / tf(gemm, f_fwd), t_all * 1e3, tf(fa_all, t_all),
            tf(3 * gemm, f_all), tf(fa_all, t_all) / tf(3 * gemm, f_all), tf(fa_fwd, r_fwd),
            tf(fa_all, r_all));
      }
    }
  }
  r.end_table();
  ops.set_precision(opt.precision);
  return ok;
}

// The GPT-2-small-shaped model (or the emulated run's small one).
TransformerConfig train_model(bool emulated) {
  TransformerConfig c;
  const std::size_t vocab = emulated ? 256 : 50304;
  c.vocab_sizes = {vocab};
  c.out_vocab = vocab;
  c.max_len = emulated ? 64 : 1024;
  c.layers = emulated ? 2 : 12;
  c.block.attention.d_model = emulated ? 64 : 768;
  c.block.attention.heads = emulated ? 4 : 12;
  c.block.d_ff = 4 * c.block.attention.d_model;
  c.block.attention.sdpa.causal = true;
  c.block.attention.sdpa.path = SdpaPath::fused;
  c.tie_embeddings = true;
  return c;
}

bool training_table(DeviceOps<float>& ops, const Options& opt, const Peak& peak, Report& r) {
  const TransformerConfig c = train_model(opt.emulated);
  const std::size_t B = opt.train_batch ? opt.train_batch : (opt.emulated ? 2 : 8), T = c.max_len;
  const double flops_per_token = transformer_flops_per_token(c, T);
  const int warmup = opt.emulated ? 0 : 2, steps = opt.emulated ? 2 : 5;
  const double heads = double(c.block.attention.heads), d_head = double(c.d_model()) / heads;
  const double matmul_params =
      (flops_per_token - 12.0 * double(c.layers) * heads * d_head * double(T)) / 6;
  r.print("\n## Training step\n\n");
  r.print(
      "Transformer: %zu layers, d_model %zu, %zu heads, T %zu, vocab %zu, tied head, causal, "
      "fused attention; batch %zu; %.1fM parameters (%.1fM in matmuls counted by the FLOPs); "
      "%.3g FLOPs per token (6N + 12·L·H·d_head·T); %d warm-up steps, mean of %d.\n",
      c.layers, c.d_model(), c.block.attention.heads, T, c.out_vocab, B,
      transformer_parameter_count(c) * 1e-6, matmul_params * 1e-6, flops_per_token, warmup, steps);
  if (peak.tflops > 0) {
    r.print("MFU: model FLOPs per second over the peak of %s.\n\n", peak.which.c_str());
  } else {
    r.print("MFU: none (peak unknown).\n\n");
  }
  Rng rng(7);
  Transformer<float> model(c, rng);
  model.to(ops);
  AdamW<float> adam(model.parameters(), AdamWOptions{6e-4, 0.9, 0.95, 1e-8, 0.1});
  CrossEntropyLoss<float> loss_fn;
  TokenIds tokens({B, T}), targets({B, T});
  for (std::size_t i = 0; i < tokens.size(); ++i) {
    tokens.data()[i] = static_cast<int>(rng.below(c.out_vocab));
    targets.data()[i] = static_cast<int>(rng.below(c.out_vocab));
  }
  r.begin_table("training");
  r.print(
      "| precision | batch | tokens/step | step ms    | tokens/s   | TFLOP/s   | MFU     | "
      "loss first / last |\n");
  r.print(
      "|-----------|-------|-------------|------------|------------|-----------|---------|"
      "-------------------|\n");
  bool ok = true;
  std::vector<GemmPrecision> precisions{opt.precision};
  if (opt.precision != GemmPrecision::fp32) precisions.push_back(GemmPrecision::fp32);
  for (GemmPrecision p : precisions) {
    ops.set_precision(p);
    double first = 0, last = 0;
    const auto step = [&] {
      last = loss_fn.forward(ops, model.forward(model.upload_fields({tokens})), targets);
      if (first == 0) first = last;
      model.zero_grad();
      model.backward(loss_fn.dlogits());
      adam.step();
      ops.synchronize();
    };
    for (int i = 0; i < warmup; ++i) step();
    const auto start = std::chrono::steady_clock::now();
    for (int i = 0; i < steps; ++i) step();
    const double t =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count() / steps;
    const double tokens_per_s = double(B * T) / t, tflops = flops_per_token * tokens_per_s * 1e-12;
    char mfu[32] = "n/a";  // both rows against the bf16 peak
    if (peak.tflops > 0) std::snprintf(mfu, sizeof mfu, "%6.2f%%", 100 * tflops / peak.tflops);
    const bool finite = std::isfinite(first) && std::isfinite(last);
    ok = ok && finite;
    r.print("| %-9s | %5zu | %11zu | %10.2f | %10.0f | %9.3g | %-7s | %7.4f / %7.4f%s |\n",
            to_string(p), B, B * T, t * 1e3, tokens_per_s, tflops, mfu, first, last,
            finite ? "" : " FAIL");
  }
  r.end_table();
  ops.set_precision(opt.precision);
  return ok;
}

std::unique_ptr<DeviceOps<float>> make_ops(const Options& opt) {
  if (opt.emulated) {
#ifdef ATTNLAB_DEVICE_BENCH_EMULATED
    return emulated::make_device_ops<float>();
#else
    throw std::invalid_argument("--emulated: this build has no emulated device (tests off)");
#endif
  }
  return make_cuda_device_ops<float>();
}

}  // namespace

int main(int argc, char** argv) try {
  Options opt;
  try {
    opt = parse_options(argc, argv);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "attnlab_device_bench: error: %s\n%s", e.what(), kUsage);
    return 2;
  }
  if (!opt.emulated && !cuda_available()) {
    const char* require = std::getenv("ATTNLAB_REQUIRE_GPU");
    std::printf(
        "attnlab_device_bench: no CUDA device (%s): nothing to measure (--emulated runs "
        "the kernels on the CPU)\n",
        cuda_built() ? "no driver or no GPU" : "built without CUDA");
    return require && std::string(require) == "1" ? 1 : 0;
  }
  Report r(opt.out);
  const auto ops = make_ops(opt);
  Peak peak;
  if (opt.peak_tflops > 0) {
    peak = {opt.peak_tflops, "--peak " + std::to_string(opt.peak_tflops) + " TFLOP/s"};
  } else if (!opt.emulated) {
    peak = dense_bf16_peak(cuda_device_name());
  }
  r.print("# attnlab device benchmark\n\ndevice: %s\n", ops->name().c_str());
  if (opt.emulated) {
    r.print(
        "emulated device: a functional run on small shapes; its times and TFLOP/s measure the "
        "CPU emulator, not a GPU, and mean nothing.\n");
  }
  r.print("peak: %s\n", peak.tflops > 0 ? peak.which.c_str() : "peak unknown (no MFU)");
  r.print(
      "cuDNN SDPA anchor: not built (only cuDNN's backend API, cudnn.h and cudnn_graph.h, is "
      "installed, without cudnn_frontend; writing its SDPA graph is out of scope here).\n");
  try {
    ops->set_precision(opt.precision);
  } catch (const std::exception& e) {
    r.print("\nFAILED: precision %s is not available on this backend: %s\n",
            to_string(opt.precision), e.what());
    return 1;
  }
  bool ok = true;
  const auto start = std::chrono::steady_clock::now();
  const auto seconds = [&] {
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  };
  if (opt.attention) ok = attention_tables(*ops, opt, r) && ok;
  const double t_attention = seconds();
  if (opt.train) ok = training_table(*ops, opt, peak, r) && ok;
  r.print("\nresult: %s (attention %.1f s, training %.1f s)\n",
          ok ? "all checks passed" : "FAILED (see the tables)", t_attention,
          seconds() - t_attention);
  if (!r.dir().empty()) std::printf("results in %s\n", r.dir().c_str());
  return ok ? 0 : 1;
} catch (const std::exception& e) {
  std::fprintf(stderr, "attnlab_device_bench: error: %s\n", e.what());
  return 1;
}
