// Scaled dot-product attention (SDPA), forward and backward, written by hand.
// References: Vaswani et al. 2017, "Attention Is All You Need", eq. 1;
// torch.nn.functional.scaled_dot_product_attention (same layout, scale= and is_causal semantics).
//
//   S = s · Q Kᵀ                      (B,H,Tq,D) x (B,H,D,Tk) -> (B,H,Tq,Tk)
//   P = softmax(S) over the keys, hidden positions excluded
//   O = P V                           (B,H,Tq,Tk) x (B,H,Tk,Dv) -> (B,H,Tq,Dv)
//
// s is 1 (`none`), 1/√D (`sqrt_dk`, the default) or 1/D (`dk`); an explicit scale overrides the
// mode. Masking: `causal` lets query i see key j iff j ≤ i (top-left aligned, as PyTorch's
// is_causal); the key mask (B, Tk) has true = may attend. A query row that sees no key gets P = 0,
// O = 0 and zero gradients: never NaN.
#pragma once

#include <optional>
#include <string_view>
#include <vector>

#include <xtensor/xarray.hpp>

#include "attnlab/tensor.hpp"

namespace attnlab {

enum class Scaling { none, sqrt_dk, dk };

// "none" | "sqrt_dk" | "dk"; parse throws std::invalid_argument naming the value it got.
std::string_view to_string(Scaling mode);
Scaling parse_scaling(std::string_view text);

// The scale of a mode for head dim d: 1, 1/√d or 1/d.
double scaling_factor(Scaling mode, std::size_t d);

struct SdpaOptions {
  Scaling scaling = Scaling::sqrt_dk;
  std::optional<double> scale;  // explicit scale, overrides `scaling`; must be finite and > 0
  std::vector<double>
      head_scale;  // optional (H,): one scale per head, overrides both (learnable scale)
  bool causal = false;
};

// The scale applied to every head for head dim d (ignores head_scale). Throws std::invalid_argument
// for a non-finite or non-positive explicit scale.
double resolve_scale(const SdpaOptions& options, std::size_t d);

// What the backward needs besides q, k and v.
template <class T>
struct SdpaCache {
  std::size_t B = 0, H = 0, Tq = 0, Tk = 0, D = 0, Dv = 0;
  std::vector<T> scale;  // (H,) the scale used by each head
  bool causal = false;
  bool has_key_mask = false;
  KeyMask key_mask;  // (B, Tk), true = may attend; empty when has_key_mask is false
  // (B,H,Tq,Tk) attention weights of the last forward: 0 at hidden positions and in rows that see
  // no key. Readable by callers for inspection and metrics.
  Tensor4<T> p;
};

// q: (B,H,Tq,D), k: (B,H,Tk,D), v: (B,H,Tk,Dv); key_mask: (B,Tk) or nullptr.
// Returns O (B,H,Tq,Dv) and fills `cache`. Throws ShapeError on any shape mismatch, naming both
// shapes.
template <class T>
Tensor4<T> sdpa_forward(SdpaCache<T>& cache, const Tensor4<T>& q, const Tensor4<T>& k,
                        const Tensor4<T>& v, const SdpaOptions& options = {},
                        const KeyMask* key_mask = nullptr);

// Dynamic-rank entry point: the same, for callers holding xt::xarray; wrong ranks throw ShapeError.
template <class T>
Tensor4<T> sdpa_forward(SdpaCache<T>& cache, const xt::xarray<T>& q, const xt::xarray<T>& k,
                        const xt::xarray<T>& v, const SdpaOptions& options = {},
                        const KeyMask* key_mask = nullptr);

// S = s · Q Kᵀ (B,H,Tq,Tk), the logits the softmax sees, with hidden positions set to -inf.
// For metrics (max |scaled logit|) and the saturation study. q: (B,H,Tq,D), k: (B,H,Tk,D).
template <class T>
Tensor4<T> sdpa_scores(const Tensor4<T>& q, const Tensor4<T>& k, const SdpaOptions& options = {},
                       const KeyMask* key_mask = nullptr);

template <class T>
struct SdpaGrads {
  Tensor4<T> dq;      // (B,H,Tq,D)
  Tensor4<T> dk;      // (B,H,Tk,D)
  Tensor4<T> dv;      // (B,H,Tk,Dv)
  Tensor1<T> dscale;  // (H,) dL/ds_h = Σ over batch, rows and keys of dS ⊙ (Q Kᵀ)
};

// dout: (B,H,Tq,Dv), the gradient of the loss with respect to O. q, k, v: the forward's inputs.
// Returns fresh gradients (assigns; nothing is accumulated). Throws ShapeError on mismatch.
//   dV = Pᵀ dO,  dP = dO Vᵀ,  dS = P ⊙ (dP − rowsum(dP ⊙ P)),  dQ = s · dS K,  dK = s · dSᵀ Q.
template <class T>
SdpaGrads<T> sdpa_backward(const Tensor4<T>& dout, const SdpaCache<T>& cache, const Tensor4<T>& q,
                           const Tensor4<T>& k, const Tensor4<T>& v);

}  // namespace attnlab
