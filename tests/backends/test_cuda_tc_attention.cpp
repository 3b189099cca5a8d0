// The tensor-core fused attention (lib/backends/cuda/attention_tc_kernels.cuh) on the CPU under the
// emulator of the CUDA thread model, whose mma, ldmatrix and cp.async hold per-lane fragments as on
// the hardware: a register in the wrong place gives a wrong product. Forward O and LSE and backward
// dQ, dK, dV against attention in double on the bf16-rounded inputs, with FlashAttention's
// criterion: the kernel's largest error is at most twice that of a plain bf16 implementation
// (plain_bf16 below) plus 1e-6. Ragged tile edges, causal with an offset, a key mask (with a batch
// that sees no key), a sliding window, grouped-query attention, a softcap, ALiBi, an additive bias
// with its gradient dscores (dS, by the same criterion) and dropout (the reference applies the mask
// of attention_dropout_factor); the backward is bit for bit the same on a second run.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "attnlab/attention/dropout.hpp"
#include "attnlab/attention/params.hpp"

// clang-format off
#include "attnlab/backends/cuda_emulator.hpp"
#include "attention_tc_kernels.cuh"
// clang-format on

using namespace attnlab;

namespace {

namespace tc = attnlab::cuda::tc;

// KernelDeviceOps's Runtime, as far as the launch glue needs it: the emulator's launch.
struct EmulatorLaunch {
  template <class... Params, class... Args>
  void launch(void (*kernel)(Params...), dim3 grid, dim3 block, std::size_t shared_bytes,
              Args... args) {
    emu::launch(kernel, grid, block, shared_bytes, args...);
  }
};

struct Case {
  std::string name;
  std::size_t B, H, Hkv, Tq, Tk, D;
  bool causal = false;
  std::size_t offset = 0, window = 0;
  bool masked = false;
  double softcap = 0;
  double scale_factor = 1;  // s_h = scale_factor / sqrt(D)
  bool alibi = false;
  bool bias = false;  // (1,H,Tq,Tk) broadcast over the batch, N(0, 1); dscores is written with it
  double dropout_p = 0;
};

float round_bf16(float x) {
  return emu::to_float(emu::to_bf16(x));
}

// Inputs drawn from N(0, 1) and rounded to bf16: the kernels' bits and the references' values.
struct Inputs {
  std::vector<attnlab_bf16> q, k, v, dout;
  std::vector<float> qf, kf, vf, doutf;
  std::vector<float> scale, slopes, bias;
  std::vector<unsigned char> mask;
};

void draw(std::mt19937& rng, std::size_t n, std::vector<attnlab_bf16>& bits,
          std::vector<float>& values) {
  std::normal_distribution<float> normal;
  bits.resize(n);
  values.resize(n);
  for (std::size_t e = 0; e < n; ++e) {
    bits[e] = emu::to_bf16(normal(rng));
    values[e] = emu::to_float(bits[e]);
  }
}

Inputs make_inputs(const Case& c, unsigned seed) {
  std::mt19937 rng(seed);
  Inputs in;
  draw(rng, c.B * c.H * c.Tq * c.D, in.q, in.qf);
  draw(rng, c.B * c.Hkv * c.Tk * c.D, in.k, in.kf);
  draw(rng, c.B * c.Hkv * c.Tk * c.D, in.v, in.vf);
  draw(rng, c.B * c.H * c.Tq * c.D, in.dout, in.doutf);
  for (std::size_t h = 0; h < c.H; ++h) {
    // Slightly different per head, so a kernel that reads the wrong head's scale is caught.
    in.scale.push_back(static_cast<float>(c.scale_factor * (1 + 0.125 * h) / std::sqrt(c.D)));
  }
  for (std::size_t h = 0; h < c.H; ++h) {
    in.slopes.push_back(std::exp2(-0.5f * static_cast<float>(h + 1)));  // ALiBi's m_h
  }
  if (c.bias) {
    std::normal_distribution<float> normal;
    in.bias.resize(c.H * c.Tq * c.Tk);
    for (float& x : in.bias) x = normal(rng);
  }
  // Batch 0 hides every third key (never key 0); batch 1 sees no key at all.
  in.mask.assign(c.B * c.Tk, 1);
  for (std::size_t j = 0; j < c.Tk; ++j) {
    if (j % 3 == 2) in.mask[j] = 0;
    if (c.B > 1) in.mask[c.Tk + j] = 0;
  }
  return in;
}

AttentionParams<float> params_of(const Case& c, const Inputs& in) {
  AttentionParams<float> a;
  a.B = c.B, a.H = c.H, a.Hkv = c.Hkv, a.Tq = c.Tq, a.Tk = c.Tk, a.D = c.D, a.Dv = c.D;
  a.causal = c.causal, a.query_offset = c.offset, a.window = c.window, a.softcap = c.softcap;
  a.scale = in.scale.data();
  a.key_mask = c.masked ? in.mask.data() : nullptr;
  a.alibi_slopes = c.alibi ? in.slopes.data() : nullptr;
  if (c.bias) {
    a.bias = in.bias.data();
    a.bias_batch_stride = 0, a.bias_head_stride = c.Tq * c.Tk;
  }
  a.dropout_p = c.dropout_p, a.dropout_seed = 0x5eed1234abcdull;
  return a;
}

struct Result {
  std::vector<double> out, lse, dq, dk, dv, ds;  // ds: dS = P ⊙ (dP − D), (B,H,Tq,Tk)
};

// Attention written out element by element. R = double: exact arithmetic on the rounded inputs.
// R = float with round_points: the plain bf16 implementation (PyTorch's bf16 math path without its
// rounding of the outputs): scores and softmax in fp32 from the bf16 inputs, the operands of every
// product after the softmax rounded to bf16 (P before P V and Pᵀ dO, s·dS before dS K and dSᵀ Q),
// fp32 sums. Dropout: P ⊙ M / (1 − p) in P V and Pᵀ dO, dP = (dO Vᵀ) ⊙ M / (1 − p), M from
// attention_dropout_factor, the row sum before dropout.
template <class R>
Result attention(const Case& c, const Inputs& in, bool round_points) {
  const auto rnd = [&](R x) { return round_points ? static_cast<R>(round_bf16(float(x))) : x; };
  const std::size_t G = c.H / c.Hkv, D = c.D;
  Result res;
  res.out.assign(c.B * c.H * c.Tq * D, 0);
  res.lse.assign(c.B * c.H * c.Tq, -std::numeric_limits<double>::infinity());
  res.dq.assign(c.B * c.H * c.Tq * D, 0);
  res.dk.assign(c.B * c.Hkv * c.Tk * D, 0);
  res.dv.assign(c.B * c.Hkv * c.Tk * D, 0);
  res.ds.assign(c.B * c.H * c.Tq * c.Tk, 0);
  const AttentionParams<float> spec = params_of(c, in);
  std::vector<R> dk(res.dk.size(), 0), dv(res.dv.size(), 0);
  for (std::size_t b = 0; b < c.B; ++b) {
    for (std::size_t h = 0; h < c.H; ++h) {
      const std::size_t bh = b * c.H + h, kv = b * c.Hkv + h / G;
      const R s = in.scale[h];
      for (std::size_t i = 0; i < c.Tq; ++i) {
        const float* q = &in.qf[(bh * c.Tq + i) * D];
        const float* dout = &in.doutf[(bh * c.Tq + i) * D];
        std::vector<R> score(c.Tk, -std::numeric_limits<R>::infinity()), slope(c.Tk, 1);
        R top = -std::numeric_limits<R>::infinity();
        for (std::size_t j = 0; j < c.Tk; ++j) {
          bool seen = !c.masked || in.mask[b * c.Tk + j] != 0;
          if (c.causal) {
            seen = seen && j <= i + c.offset && (c.window == 0 || j + c.window > i + c.offset);
          }
          if (!seen) continue;
          R dot = 0;
          for (std::size_t d = 0; d < D; ++d) dot += R(q[d]) * R(in.kf[(kv * c.Tk + j) * D + d]);
          R x = s * dot;
          if (c.softcap > 0) {
            const R cap = static_cast<R>(c.softcap);
            x = cap * std::tanh(x / cap);
            slope[j] = 1 - (x / cap) * (x / cap);
          }
          if (c.alibi) x += R(in.slopes[h]) * (R(j) - R(i + c.offset));
          if (c.bias) x += R(in.bias[(h * c.Tq + i) * c.Tk + j]);
          score[j] = x;
          top = std::max(top, x);
        }
        if (top == -std::numeric_limits<R>::infinity()) continue;  // no visible key: all 0
        R sum = 0;
        std::vector<R> p(c.Tk, 0);
        for (std::size_t j = 0; j < c.Tk; ++j) {
          if (score[j] != -std::numeric_limits<R>::infinity())
            sum += p[j] = std::exp(score[j] - top);
        }
        res.lse[bh * c.Tq + i] = static_cast<double>(top + std::log(sum));
        std::vector<R> o(D, 0), dp(c.Tk, 0);
        for (std::size_t j = 0; j < c.Tk; ++j) {
          p[j] /= sum;
          const R keep = attention::attention_dropout_factor<R>(spec, bh, i, j);
          const R pr = rnd(p[j] * keep);
          for (std::size_t d = 0; d < D; ++d) {
            const R vjd = in.vf[(kv * c.Tk + j) * D + d];
            o[d] += pr * vjd;
            dp[j] += R(dout[d]) * vjd;
            dv[(kv * c.Tk + j) * D + d] += pr * R(dout[d]);
          }
          dp[j] *= keep;
        }
        R row_dot = 0;
        if (round_points) {  // D = rowsum(dO ⊙ O), as the kernels
          for (std::size_t d = 0; d < D; ++d) row_dot += R(dout[d]) * o[d];
        } else {  // D = rowsum(dP ⊙ P), the same number in exact arithmetic
          for (std::size_t j = 0; j < c.Tk; ++j) row_dot += p[j] * dp[j];
        }
        for (std::size_t d = 0; d < D; ++d) res.out[(bh * c.Tq + i) * D + d] = double(o[d]);
        std::vector<R> dq(D, 0);
        for (std::size_t j = 0; j < c.Tk; ++j) {
          if (p[j] == 0) continue;
          const R ds = p[j] * (dp[j] - row_dot);
          res.ds[(bh * c.Tq + i) * c.Tk + j] = double(ds);
          const R g = rnd(s * ds * slope[j]);
          for (std::size_t d = 0; d < D; ++d) {
            dq[d] += g * R(in.kf[(kv * c.Tk + j) * D + d]);
            dk[(kv * c.Tk + j) * D + d] += g * R(q[d]);
          }
        }
        for (std::size_t d = 0; d < D; ++d) res.dq[(bh * c.Tq + i) * D + d] = double(dq[d]);
      }
    }
  }
  std::copy(dk.begin(), dk.end(), res.dk.begin());
  std::copy(dv.begin(), dv.end(), res.dv.begin());
  return res;
}

struct Kernel {
  std::vector<float> out, lse, dq, dk, dv, ds;  // ds: dscores, zeroed first (the contract)
};

template <int HD>
Kernel run_kernels(const Case& c, const Inputs& in) {
  const AttentionParams<float> a = params_of(c, in);
  const float nan = std::numeric_limits<float>::quiet_NaN();
  Kernel r{std::vector<float>(c.B * c.H * c.Tq * HD, nan),
           std::vector<float>(c.B * c.H * c.Tq, nan),
           std::vector<float>(c.B * c.H * c.Tq * HD, nan),
           std::vector<float>(c.B * c.Hkv * c.Tk * HD, nan),
           std::vector<float>(c.B * c.Hkv * c.Tk * HD, nan),
           std::vector<float>(c.bias ? c.B * c.H * c.Tq * c.Tk : 0, 0.0f)};
  std::vector<float> row_dot(c.B * c.H * c.Tq, nan);
  AttentionParams<float> backward = a;
  if (c.bias) backward.dscores = r.ds.data();
  EmulatorLaunch rt;
  tc::tc_attention_forward<HD>(rt, r.out.data(), r.lse.data(), in.q.data(), in.k.data(),
                               in.v.data(), a);
  tc::tc_attention_backward<HD>(rt, r.dq.data(), r.dk.data(), r.dv.data(), row_dot.data(),
                                in.q.data(), in.k.data(), in.v.data(), in.dout.data(), r.out.data(),
                                r.lse.data(), backward);
  return r;
}

// The largest |x − reference| (infinities must match exactly).
template <class T>
double max_error(const std::vector<T>& x, const std::vector<double>& reference) {
  REQUIRE(x.size() == reference.size());
  double worst = 0;
  for (std::size_t e = 0; e < x.size(); ++e) {
    const double xe = static_cast<double>(x[e]);
    if (std::isinf(reference[e]) || std::isinf(xe)) {
      if (xe != reference[e]) return std::numeric_limits<double>::infinity();
      continue;
    }
    const double err = std::fabs(xe - reference[e]);
    if (!(err <= worst)) worst = err;  // NaN stays
  }
  return worst;
}

void check_case(const Case& c, unsigned seed) {
  const Inputs in = make_inputs(c, seed);
  const Kernel k = c.D == 64 ? run_kernels<64>(c, in) : run_kernels<128>(c, in);
  const Result exact = attention<double>(c, in, false);
  const Result plain = attention<float>(c, in, true);
  const struct {
    const char* name;
    const std::vector<float>& kernel;
    const std::vector<double>& exact;
    const std::vector<double>& plain;
  } outputs[] = {{"O", k.out, exact.out, plain.out}, {"LSE", k.lse, exact.lse, plain.lse},
                 {"dQ", k.dq, exact.dq, plain.dq},   {"dK", k.dk, exact.dk, plain.dk},
                 {"dV", k.dv, exact.dv, plain.dv},   {"dS", k.ds, exact.ds, plain.ds}};
  std::string report = c.name + ":";
  for (const auto& o : outputs) {
    if (!c.bias && std::string(o.name) == "dS") continue;  // dscores only with a bias
    const double err = max_error(o.kernel, o.exact), plain_err = max_error(o.plain, o.exact);
    CAPTURE(c.name);
    const std::string output = o.name;
    CAPTURE(output);
    CAPTURE(err);
    CAPTURE(plain_err);
    CHECK(err <= 2 * plain_err + 1e-6);
    report += std::string(" ") + o.name + " " + std::to_string(err) + " (plain " +
              std::to_string(plain_err) + ", ratio " +
              std::to_string(plain_err > 0 ? err / plain_err : 0.0) + ")";
  }
  MESSAGE(report);
}

}  // namespace

TEST_CASE("cuda tensor-core attention (emulated): non-causal, ragged tiles, D = 64 and 128") {
  check_case({"plain D=64", 1, 2, 2, 100, 90, 64}, 1);
  check_case({"plain D=128", 1, 2, 2, 70, 130, 128}, 2);
}

TEST_CASE("cuda tensor-core attention (emulated): causal with a query offset") {
  Case c{"causal offset D=128", 1, 2, 2, 80, 150, 128};
  c.causal = true, c.offset = 70;  // bottom-right aligned: o = Tk - Tq
  check_case(c, 3);
  Case top{"causal D=64", 1, 2, 2, 130, 130, 64};
  top.causal = true;
  check_case(top, 4);
}

TEST_CASE("cuda tensor-core attention (emulated): key mask, a batch with no visible key") {
  Case c{"key mask D=64", 2, 2, 2, 96, 75, 64};
  c.masked = true;
  check_case(c, 5);
}

TEST_CASE("cuda tensor-core attention (emulated): grouped-query attention, sliding window") {
  Case c{"GQA causal D=64", 1, 4, 2, 100, 100, 64};
  c.causal = true;
  check_case(c, 6);
  Case w{"GQA window D=64", 1, 4, 2, 150, 150, 64};
  w.causal = true, w.window = 40;  // key tiles outside the band are skipped
  check_case(w, 7);
  // Three heads a group: a tile of 64 packed rows (query i·3 + m of head m) ends inside a query.
  Case t{"GQA 3 heads a group D=128", 2, 6, 2, 70, 90, 128};
  t.causal = true, t.offset = 20, t.masked = true, t.bias = true, t.dropout_p = 0.15;
  check_case(t, 18);
}

TEST_CASE("cuda tensor-core attention (emulated): softcap with a key mask and causal offset") {
  Case c{"softcap D=128", 1, 2, 1, 70, 100, 128};
  c.causal = true, c.offset = 30, c.masked = true, c.softcap = 3, c.scale_factor = 4;
  check_case(c, 8);
}

TEST_CASE("cuda tensor-core attention (emulated): ALiBi, D = 64 and 128") {
  Case c{"ALiBi causal offset D=64", 1, 3, 3, 90, 130, 64};
  c.causal = true, c.offset = 40, c.alibi = true;
  check_case(c, 10);
  Case n{"ALiBi GQA D=128", 1, 4, 2, 70, 100, 128};
  n.alibi = true, n.masked = true;
  check_case(n, 11);
}

TEST_CASE("cuda tensor-core attention (emulated): additive bias and its gradient dscores") {
  // The bias broadcasts over the batch; dS is (B,H,Tq,Tk), zeroed by the caller, and the tiles
  // that the window hides from a whole tile are left at 0.
  Case c{"bias key mask D=64", 2, 2, 2, 100, 90, 64};
  c.bias = true, c.masked = true;
  check_case(c, 12);
  Case w{"bias window ALiBi D=128", 1, 2, 1, 150, 150, 128};
  w.bias = true, w.alibi = true, w.causal = true, w.window = 40;
  check_case(w, 13);
}

TEST_CASE("cuda tensor-core attention (emulated): dropout, D = 64 and 128") {
  Case c{"dropout D=64", 1, 2, 2, 100, 90, 64};
  c.dropout_p = 0.2;
  check_case(c, 14);
  Case g{"dropout GQA causal D=128", 1, 4, 2, 80, 150, 128};
  g.dropout_p = 0.35, g.causal = true, g.offset = 70;
  check_case(g, 15);
  Case b{"dropout bias softcap D=64", 2, 2, 1, 70, 130, 64};
  b.dropout_p = 0.1, b.bias = true, b.softcap = 3, b.scale_factor = 4, b.masked = true;
  check_case(b, 16);
}

TEST_CASE("cuda tensor-core attention (emulated): the backward is bit for bit deterministic") {
  Case c{"determinism", 1, 4, 2, 100, 140, 64};
  c.causal = true, c.offset = 40, c.masked = true;
  const Inputs in = make_inputs(c, 9);
  const Kernel first = run_kernels<64>(c, in), second = run_kernels<64>(c, in);
  const auto same = [](const std::vector<float>& x, const std::vector<float>& y) {
    return x.size() == y.size() && std::memcmp(x.data(), y.data(), x.size() * sizeof(float)) == 0;
  };
  CHECK(same(first.out, second.out));
  CHECK(same(first.lse, second.lse));
  CHECK(same(first.dq, second.dq));
  CHECK(same(first.dk, second.dk));
  CHECK(same(first.dv, second.dv));
  Case d{"determinism with dropout and dscores", 1, 2, 1, 100, 140, 128};
  d.causal = true, d.offset = 40, d.dropout_p = 0.25, d.bias = true, d.alibi = true;
  const Inputs din = make_inputs(d, 17);
  const Kernel x = run_kernels<128>(d, din), y = run_kernels<128>(d, din);
  CHECK(same(x.out, y.out));
  CHECK(same(x.dq, y.dq));
  CHECK(same(x.dk, y.dk));
  CHECK(same(x.dv, y.dv));
  CHECK(same(x.ds, y.ds));
}
