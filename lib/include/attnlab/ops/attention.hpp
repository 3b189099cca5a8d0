// Scaled dot-product attention (SDPA), forward and backward, written by hand.
// References: Vaswani et al. 2017, "Attention Is All You Need", eq. 1;
// torch.nn.functional.scaled_dot_product_attention (same layout, scale= and is_causal semantics).
//
//   S = s · Q Kᵀ                      (B,H,Tq,D) x (B,H,D,Tk) -> (B,H,Tq,Tk)
//   P = softmax(S) over the keys, hidden positions excluded
//   O = P V                           (B,H,Tq,Tk) x (B,H,Tk,Dv) -> (B,H,Tq,Dv)
//
// s is 1 (`none`), 1/√D (`sqrt_dk`, the default) or 1/D (`dk`); an explicit scale overrides the
// mode. Masking: `causal` lets query i see key j iff j ≤ i + o, with the query offset o = 0 by
// default (top-left aligned, as PyTorch's is_causal) and o = Tk − Tq for bottom-right alignment
// (PyTorch's causal_lower_right: Tq new queries against Tk cached keys); the key mask (B, Tk) has
// true = may attend. A query row that sees no key gets P = 0, O = 0 and zero gradients: never NaN.
//
// Grouped-query attention (Ainslie et al. 2023; multi-query attention: Hkv = 1, Shazeer 2019):
// k and v have Hkv heads, Hkv dividing H, and query head h reads K/V head h / (H / Hkv), as
// PyTorch's scaled_dot_product_attention(..., enable_gqa=True). The backward sums dK and dV over
// the H / Hkv query heads of each group; dk and dv are (B,Hkv,Tk,·).
//
// Additive bias (relative-position and learned biases; PyTorch's float attn_mask): the scores
// become S = s · Q Kᵀ + bias, with the bias of shape (1|B, 1|H, Tq, Tk) broadcast over the axes of
// extent 1. Its gradient dBias is dS = dL/dS summed over those axes, and every path gives it
// (SdpaGrads::dbias). A bias entry of -inf hides that key, as the mask does.
// SdpaOptions is the convenient front: each entry point checks it once and resolves it into the
// one parameter struct of every path, AttentionParams (attnlab/attention/params.hpp), whose score
// rule is attnlab/attention/score_rule.hpp. The CUDA paths (attnlab/ops/attention_cuda.hpp) take
// the same options and cache.
//
// Two CPU paths honour this contract (SdpaOptions::path):
//  - reference: the readable definition below; materialises P (B,H,Tq,Tk) in the cache.
//  - fused: flash-style (Dao et al. 2022, "FlashAttention", alg. 1 and 2, and FlashAttention-2),
//    lib/src/ops/attention_fused.cpp. Online softmax over key blocks; the cache keeps only O and
//    the per-row log-sum-exp, and the backward recomputes P block by block, so the extra memory is
//    O(Tk) per row block instead of O(Tq·Tk). cache.p stays empty (has_weights() is false): callers
//    that need the weights use the reference path or sdpa_weights().
//  - auto (the default): fused when Tk >= kSdpaFusedMinKeys (kSdpaFusedMinKeysCausal if causal),
//    reference otherwise.
#pragma once

#include <array>
#include <optional>
#include <string_view>
#include <vector>

#include <xtensor/xarray.hpp>

#include "attnlab/attention/params.hpp"
#include "attnlab/tensor.hpp"

namespace attnlab {

enum class Scaling { none, sqrt_dk, dk };

// Which CPU implementation runs: see the file comment. `automatic` is spelled "auto" in text.
enum class SdpaPath { reference, fused, automatic };

// `automatic` picks the fused path from this many keys on, or from kSdpaFusedMinKeysCausal keys on
// when causal (it skips the masked tiles). Measured with tests/bench on a 2-core AVX-512 Xeon
// (README, Performance): forward+backward / GEMM floor at B·H = 64, D = 64 was, reference vs fused,
// 1.27 vs 1.49 at T = 256, 1.68 vs 1.58 at T = 512, 1.56 vs 1.48 at T = 1024; causal 1.33 vs 1.15
// at T = 256. Below the threshold the reference path is as fast or faster, and gives the weights.
inline constexpr std::size_t kSdpaFusedMinKeys = 1024;
inline constexpr std::size_t kSdpaFusedMinKeysCausal = 256;

// "none" | "sqrt_dk" | "dk"; parse throws std::invalid_argument naming the value it got.
std::string_view to_string(Scaling mode);
Scaling parse_scaling(std::string_view text);

// "reference" | "fused" | "auto"; parse throws std::invalid_argument naming the value it got.
std::string_view to_string(SdpaPath path);
SdpaPath parse_sdpa_path(std::string_view text);

// The scale of a mode for head dim d: 1, 1/√d or 1/d.
double scaling_factor(Scaling mode, std::size_t d);

struct SdpaOptions {
  Scaling scaling = Scaling::sqrt_dk;
  std::optional<double> scale;  // explicit scale, overrides `scaling`; must be finite and > 0
  std::vector<double>
      head_scale;  // optional (H,): one scale per head, overrides both (learnable scale)
  bool causal = false;
  // Causal only: query i sees keys j ≤ i + query_offset (Tk − Tq aligns the queries with the last
  // keys). Must be ≥ 0, and 0 without causal; std::invalid_argument otherwise.
  std::ptrdiff_t query_offset = 0;
  // Causal only: a sliding window of w keys, query i sees keys j with i + o - w < j <= i + o (its w
  // latest, itself included; Beltagy et al. 2020, Mistral). 0 = no window. The fused paths skip
  // the key tiles outside the band.
  std::size_t window = 0;
  // ALiBi (Press et al. 2022): one slope m_h per head, and the score of a visible key gets
  // -m_h · (i + o - j) (i + o the query's absolute position), computed on the fly on every path.
  // Empty: no ALiBi. alibi_slopes(H) gives the paper's slopes.
  std::vector<double> alibi_slopes;
  // With an additive bias: whether the backward computes dBias (SdpaGrads::dbias). false for a
  // constant bias saves the (B,H,Tq,Tk) gradient of the scores that the sum over its broadcast
  // axes needs.
  bool bias_requires_grad = true;
  SdpaPath path = SdpaPath::automatic;
  // Fused path tiles: query rows x keys per tile; 0 = the tuned default (128 x 512). Results agree
  // to rounding for any tile size; tests use small tiles to cross tile edges on small inputs.
  std::size_t tile_rows = 0;
  std::size_t tile_keys = 0;
};

// ALiBi's slopes for H heads, the geometric sequence of Press et al. 2022: m_h = 2^(-8(h+1)/H)
// (1/2, 1/4, ..., 1/256 for H = 8). Throws std::invalid_argument for H = 0.
std::vector<double> alibi_slopes(std::size_t heads);

// The path that runs for Tk keys: `reference` or `fused`, never `automatic`.
SdpaPath resolve_sdpa_path(SdpaPath path, std::size_t Tk, bool causal);

// The scale applied to every head for head dim d (ignores head_scale). Throws std::invalid_argument
// for a non-finite or non-positive explicit scale.
double resolve_scale(const SdpaOptions& options, std::size_t d);

// The spec of a call with `options` over the sizes in `sizes` (B, H, Hkv, Tq, Tk, D, Dv): checks
// the options that do not need the tensors (scale, head_scale, query_offset) and the spec
// (check_attention_spec), and fills causal and query_offset. Throws std::invalid_argument naming
// `op`. The entry points call it after checking the shapes; device models call it with their sizes.
AttentionSpec make_attention_spec(std::string_view op, const SdpaOptions& options,
                                  AttentionSpec sizes);

// What the backward needs besides q, k and v. The CPU and the CUDA entry points fill the same cache
// type; its saved tensors (P, or O and the log-sum-exp) mean the same on both.
template <class T>
struct SdpaCache {
  AttentionSpec spec;    // sizes, causal and query offset of the last forward
  std::vector<T> scale;  // (H,) the scale used by each head
  std::vector<T> alibi;  // (H,) ALiBi's slopes, or empty
  bool has_key_mask = false;
  KeyMask key_mask;  // (B, Tk), true = may attend; empty when has_key_mask is false
  // A copy of the additive bias (1|B, 1|H, Tq, Tk), or empty; bias_grad: the backward gives dBias.
  Tensor4<T> bias;
  bool bias_grad = false;
  SdpaPath path = SdpaPath::reference;  // the path the last forward ran (never `automatic`)
  // Reference path only: (B,H,Tq,Tk) attention weights of the last forward, 0 at hidden positions
  // and in rows that see no key. Readable by callers for inspection and metrics. Empty after a
  // fused forward: use has_weights(), and sdpa_weights() to recompute them.
  Tensor4<T> p;
  // Fused path only (empty after a reference forward):
  Tensor4<T> out;  // (B,H,Tq,Dv) O, for D_i = rowsum(dO ⊙ O) in the backward
  Tensor3<T> lse;  // (B,H,Tq) log Σ_j exp(S_ij) over visible keys; -inf for a row with none
  // The CPU fused path's tiles (SdpaOptions::tile_rows, tile_keys); 0 = the tuned default.
  std::size_t tile_rows = 0, tile_keys = 0;

  bool has_weights() const { return p.size() != 0; }
  bool has_bias() const { return bias.size() != 0; }

  // The parameters of this cache's call over q, k, v: the spec, and pointers into q, k, v and into
  // this cache's scales and mask (valid while the cache and the tensors are unchanged).
  AttentionParams<T> params(const T* q, const T* k, const T* v) const {
    static_assert(sizeof(bool) == 1, "the key mask is read as bytes");
    AttentionParams<T> a;
    static_cast<AttentionSpec&>(a) = spec;
    a.q = q, a.k = k, a.v = v, a.scale = scale.data();
    a.alibi_slopes = alibi.empty() ? nullptr : alibi.data();
    a.key_mask = has_key_mask ? reinterpret_cast<const unsigned char*>(key_mask.data()) : nullptr;
    if (has_bias()) {
      const std::size_t heads = bias.shape()[1], slice = spec.Tq * spec.Tk;
      a.bias = bias.data();
      a.bias_batch_stride = bias.shape()[0] == 1 ? 0 : heads * slice;
      a.bias_head_stride = heads == 1 ? 0 : slice;
    }
    return a;
  }
};

// q: (B,H,Tq,D), k: (B,Hkv,Tk,D), v: (B,Hkv,Tk,Dv) with Hkv dividing H; key_mask: (B,Tk) or
// nullptr; bias: (1|B, 1|H, Tq, Tk) added to the scaled scores, or nullptr (the cache keeps a
// copy). Returns O (B,H,Tq,Dv) and fills `cache`. Throws ShapeError on any shape mismatch, naming
// both shapes, and std::invalid_argument for a bad option (scale, head_scale, query_offset).
template <class T>
Tensor4<T> sdpa_forward(SdpaCache<T>& cache, const Tensor4<T>& q, const Tensor4<T>& k,
                        const Tensor4<T>& v, const SdpaOptions& options = {},
                        const KeyMask* key_mask = nullptr, const Tensor4<T>* bias = nullptr);

// Dynamic-rank entry point: the same, for callers holding xt::xarray; wrong ranks throw ShapeError.
template <class T>
Tensor4<T> sdpa_forward(SdpaCache<T>& cache, const xt::xarray<T>& q, const xt::xarray<T>& k,
                        const xt::xarray<T>& v, const SdpaOptions& options = {},
                        const KeyMask* key_mask = nullptr, const Tensor4<T>* bias = nullptr);

// S = s · Q Kᵀ (B,H,Tq,Tk), the logits the softmax sees (ALiBi and the bias included), with hidden
// positions set to -inf. For metrics (max |scaled logit|) and the saturation study.
// q: (B,H,Tq,D), k: (B,Hkv,Tk,D).
template <class T>
Tensor4<T> sdpa_scores(const Tensor4<T>& q, const Tensor4<T>& k, const SdpaOptions& options = {},
                       const KeyMask* key_mask = nullptr, const Tensor4<T>* bias = nullptr);

// P = softmax(S) (B,H,Tq,Tk), recomputed as the reference path does (hidden positions and empty
// rows are 0). For metrics after a fused forward. q: (B,H,Tq,D), k: (B,Hkv,Tk,D).
template <class T>
Tensor4<T> sdpa_weights(const Tensor4<T>& q, const Tensor4<T>& k, const SdpaOptions& options = {},
                        const KeyMask* key_mask = nullptr, const Tensor4<T>* bias = nullptr);

template <class T>
struct SdpaGrads {
  Tensor4<T> dq;      // (B,H,Tq,D)
  Tensor4<T> dk;      // (B,Hkv,Tk,D), summed over each group
  Tensor4<T> dv;      // (B,Hkv,Tk,Dv), summed over each group
  Tensor1<T> dscale;  // (H,) dL/ds_h = Σ over batch, rows and keys of dS ⊙ (Q Kᵀ)
  Tensor4<T> dbias;   // the bias's shape: dS summed over its broadcast axes; empty without a bias
                      // or with SdpaOptions::bias_requires_grad false
};

// dBias from dS = dL/dS (B,H,Tq,Tk): the sum over the axes that a bias of shape `bias_shape`
// (1|B, 1|H, Tq, Tk) broadcasts over, in a fixed order (deterministic). For callers of the raw
// launchers (attnlab/cuda_attention.hpp) that set AttentionParams::dscores. Throws ShapeError when
// bias_shape does not broadcast to dS.
template <class T>
Tensor4<T> sum_to_bias_shape(const Tensor4<T>& dscores,
                             const std::array<std::size_t, 4>& bias_shape);

// dout: (B,H,Tq,Dv), the gradient of the loss with respect to O. q, k, v: the forward's inputs.
// Returns fresh gradients (assigns; nothing is accumulated), dbias too when the forward had a bias
// that requires a gradient. Throws ShapeError on mismatch and
// std::logic_error when the cache holds no forward. Runs the path the forward ran.
//   dV = Pᵀ dO,  dP = dO Vᵀ,  dS = P ⊙ (dP − rowsum(dP ⊙ P)),  dQ = s · dS K,  dK = s · dSᵀ Q.
template <class T>
SdpaGrads<T> sdpa_backward(const Tensor4<T>& dout, const SdpaCache<T>& cache, const Tensor4<T>& q,
                           const Tensor4<T>& k, const Tensor4<T>& v);

}  // namespace attnlab
