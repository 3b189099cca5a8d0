// Per-element and per-row arithmetic shared by every backend's kernels (the CUDA ones, the emulated
// device's, the CPU backend's) and the tests. Every function is __host__ __device__ under nvcc and
// plain inline C++ otherwise, so the CPU suite exercises exactly the arithmetic the kernels run. No
// CUDA header, no xtensor. Which keys a query sees is the attention score rule's
// (attnlab/attention/score_rule.hpp), not this file's.
//
// References: Milakov & Gimelshein 2018, "Online normalizer calculation for softmax" (the running
// max/sum merge); Dao 2023, "FlashAttention-2", Algorithms 1 and 2 (log-sum-exp, D = rowsum(dO ⊙
// O)).
//
// Conventions: a hidden score is -inf. A row whose scores are all hidden has max -inf and sum 0;
// it yields weights 0, log-sum-exp -inf and output 0, never NaN.
#pragma once

#include <cmath>
#include <cstddef>
#include <limits>

#if defined(__CUDACC__)
#define ATTNLAB_HD __host__ __device__
#else
#define ATTNLAB_HD
#endif

namespace attnlab::kernel_math {

template <class T>
ATTNLAB_HD constexpr T negative_infinity() {
  return -std::numeric_limits<T>::infinity();
}

ATTNLAB_HD inline float exp_of(float x) {
#if defined(__CUDA_ARCH__)
  return expf(x);
#else
  return std::exp(x);
#endif
}
ATTNLAB_HD inline double exp_of(double x) {
#if defined(__CUDA_ARCH__)
  return ::exp(x);
#else
  return std::exp(x);
#endif
}
ATTNLAB_HD inline float log_of(float x) {
#if defined(__CUDA_ARCH__)
  return logf(x);
#else
  return std::log(x);
#endif
}
ATTNLAB_HD inline double log_of(double x) {
#if defined(__CUDA_ARCH__)
  return ::log(x);
#else
  return std::log(x);
#endif
}

ATTNLAB_HD inline float sqrt_of(float x) {
#if defined(__CUDA_ARCH__)
  return sqrtf(x);
#else
  return std::sqrt(x);
#endif
}
ATTNLAB_HD inline double sqrt_of(double x) {
#if defined(__CUDA_ARCH__)
  return ::sqrt(x);
#else
  return std::sqrt(x);
#endif
}
ATTNLAB_HD inline float tanh_of(float x) {
#if defined(__CUDA_ARCH__)
  return tanhf(x);
#else
  return std::tanh(x);
#endif
}
ATTNLAB_HD inline double tanh_of(double x) {
#if defined(__CUDA_ARCH__)
  return ::tanh(x);
#else
  return std::tanh(x);
#endif
}
ATTNLAB_HD inline float erf_of(float x) {
#if defined(__CUDA_ARCH__)
  return erff(x);
#else
  return std::erf(x);
#endif
}
ATTNLAB_HD inline double erf_of(double x) {
#if defined(__CUDA_ARCH__)
  return ::erf(x);
#else
  return std::erf(x);
#endif
}

template <class T>
ATTNLAB_HD inline T max_of(T a, T b) {
  return a > b ? a : b;
}

// exp(x − m) for a score x against a running max m ≥ x, and 0 for a hidden score (x = -inf), which
// also covers m = -inf (then x = -inf too): never exp(-inf − -inf) = NaN.
template <class T>
ATTNLAB_HD inline T exp_shifted(T x, T m) {
  return x == negative_infinity<T>() ? T(0) : exp_of(x - m);
}

// The running state of one softmax row: the max of the scores seen so far and the sum of
// exp(score − max) over them. The empty state (-inf, 0) is the identity of merge().
template <class T>
struct OnlineSoftmax {
  T max = negative_infinity<T>();
  T sum = T(0);

  // The factor exp(old max − new max) by which sums (and outputs) accumulated under the old max are
  // rescaled when the max rises to new_max ≥ max. 0 when nothing was accumulated yet (max = -inf).
  ATTNLAB_HD T rescale_factor(T new_max) const { return exp_shifted(max, new_max); }

  // Folds in a block of scores whose max is block_max and whose Σ exp(score − block_max) is
  // block_sum. Associative and commutative up to rounding; either side may be empty.
  ATTNLAB_HD void merge(T block_max, T block_sum) {
    const T m = max_of(max, block_max);
    sum = sum * exp_shifted(max, m) + block_sum * exp_shifted(block_max, m);
    max = m;
  }

  // Folds in a single score x (-inf = hidden).
  ATTNLAB_HD void add(T x) { merge(x, x == negative_infinity<T>() ? T(0) : T(1)); }

  // log Σ exp(score) over the row: -inf for a row with no visible score.
  ATTNLAB_HD T log_sum_exp() const {
    return sum > T(0) ? max + log_of(sum) : negative_infinity<T>();
  }

  // 1 / Σ exp(score − max), or 0 for an empty row (so its weights and output are 0).
  ATTNLAB_HD T inverse_sum() const { return sum > T(0) ? T(1) / sum : T(0); }
};

// The softmax weight of score x recomputed from the row's log-sum-exp (flash backward): exp(x −
// lse), 0 for a hidden score and in an empty row (lse = -inf).
template <class T>
ATTNLAB_HD inline T weight_from_lse(T x, T lse) {
  return lse == negative_infinity<T>() ? T(0) : exp_shifted(x, lse);
}

// One element of the softmax backward, dS = P ⊙ (dP − rowsum(dP ⊙ P)): given p, dp and the row's
// dot = Σ_j dp_j p_j (for flash: D = rowsum(dO ⊙ O), the same number). Exactly 0 where p = 0, so a
// hidden position gives 0 even if dp is not finite.
template <class T>
ATTNLAB_HD inline T softmax_backward_element(T p, T dp, T row_dot) {
  return p == T(0) ? T(0) : p * (dp - row_dot);
}

// Number of tiles of `tile` rows covering n rows.
ATTNLAB_HD inline std::size_t tile_count(std::size_t n, std::size_t tile) {
  return (n + tile - 1) / tile;
}

// Index math of the contiguous (B, H, R, C) layouts: q (B,H,Tq,D), scores (B,H,Tq,Tk), ... with
// bh = b·H + h the flattened batch-head index.
ATTNLAB_HD inline std::size_t bhrc_offset(std::size_t bh, std::size_t r, std::size_t c,
                                          std::size_t R, std::size_t C) {
  return (bh * R + r) * C + c;
}
ATTNLAB_HD inline std::size_t batch_of(std::size_t bh, std::size_t H) {
  return bh / H;
}
ATTNLAB_HD inline std::size_t head_of(std::size_t bh, std::size_t H) {
  return bh % H;
}

// Offset of the mask entry (b, j) of a (B, Tk) key mask.
ATTNLAB_HD inline std::size_t key_mask_offset(std::size_t b, std::size_t j, std::size_t Tk) {
  return b * Tk + j;
}

// `n` rounded up to a multiple of `m` (shared-memory row widths).
ATTNLAB_HD inline std::size_t round_up(std::size_t n, std::size_t m) {
  return (n + m - 1) / m * m;
}

// ---- training-step elements (attnlab/device_ops.hpp) ---------------------------------------

// GELU, torch.nn.functional.gelu: tanh approximation y = ½ x (1 + tanh(c (x + 0.044715 x³))),
// c = √(2/π), or exact y = x Φ(x); and their derivatives dy/dx.
template <class T>
ATTNLAB_HD inline T gelu(T x, bool exact) {
  if (exact) return T(0.5) * x * (T(1) + erf_of(x * T(0.70710678118654752440)));
  // ½ (1 + tanh u) = σ(2u) = 1 / (1 + e^(−2u)): the CPU op's form (ops/gelu.cpp)
  const T c = T(0.79788456080286535588);
  const T u = c * (x + T(0.044715) * x * x * x);
  return x / (T(1) + exp_of(T(-2) * u));
}

template <class T>
ATTNLAB_HD inline T gelu_derivative(T x, bool exact) {
  if (exact) {  // Φ(x) + x φ(x)
    const T cdf = T(0.5) * (T(1) + erf_of(x * T(0.70710678118654752440)));
    const T pdf = exp_of(T(-0.5) * x * x) * T(0.39894228040143267794);
    return cdf + x * pdf;
  }
  // s + x s (1 − s) 2c (1 + 3·0.044715 x²), s = σ(2u) = 1 / (1 + e), e = e^(−2u),
  // u = c (x + 0.044715 x³); 1 − s = e s for u > 0 (the CPU op's form, ops/gelu.cpp)
  const T c = T(0.79788456080286535588);
  const T u = c * (x + T(0.044715) * x * x * x);
  const T e = exp_of(T(-2) * u);
  const T s = T(1) / (T(1) + e);
  const T one_minus_s = u > T(0) ? e * s : T(1) - s;
  return s + x * s * one_minus_s * T(2) * c * (T(1) + T(3 * 0.044715) * x * x);
}

// SiLU (swish) a · σ(a), σ(a) = 1 / (1 + e^(−a)), and its derivative σ(a) (1 + a (1 − σ(a))), with
// 1 − σ(a) = e^(−a) σ(a) for a > 0 (no cancellation in the upper tail): SwiGLU's gate
// (attnlab/ops/swiglu.hpp). Both are 0 (signed) far in the lower tail, never NaN.
template <class T>
ATTNLAB_HD inline T silu_element(T a) {
  return a / (T(1) + exp_of(-a));
}
template <class T>
ATTNLAB_HD inline T swiglu_gate_slope(T a) {
  const T e = exp_of(-a);
  const T s = T(1) / (T(1) + e);
  const T one_minus_s = a > T(0) ? e * s : T(1) - s;
  return s * (T(1) + a * one_minus_s);
}

// The normalisation backward of one element (LayerNorm and RMSNorm): with g = dy ⊙ γ,
//   dx = rstd · (g − mean_g − x̂ · mean_g_xhat)
// (RMSNorm passes mean_g = 0: no centring).
template <class T>
ATTNLAB_HD inline T norm_backward_element(T g, T xhat, T rstd, T mean_g, T mean_g_xhat) {
  return rstd * (g - mean_g - xhat * mean_g_xhat);
}

// Softcapping (attnlab/ops/softcap.hpp): y = c · tanh(x / c), and its slope from the output,
// dy/dx = 1 − (y / c)².
template <class T>
ATTNLAB_HD inline T softcap_element(T x, T cap) {
  return cap * tanh_of(x / cap);
}
template <class T>
ATTNLAB_HD inline T softcap_slope(T y, T cap) {
  const T t = y / cap;
  return T(1) - t * t;
}

// Rotary position embedding (attnlab/ops/rope.hpp) on `slices` blocks of Tn rows of D values
// (a (B, H, Tn, D) tensor has B·H slices): row t of a block is at position offset + t and reads
// row offset + t of the cos and sin tables ((positions, rot/2) each). The first rot dims of a row
// rotate in rot/2 pairs, pair i by the angle p · θ^(−2i/rot); the rest pass through. Pair i is
// (i, i + rot/2) (half-split: GPT-NeoX, Hugging Face LLaMA) or (2i, 2i + 1) (interleaved: Su et
// al. 2021, Meta's LLaMA). inverse rotates by −angle: the backward, as a rotation's inverse is
// its transpose.
struct RopeShape {
  std::size_t slices = 0, Tn = 0, D = 0, rot = 0, offset = 0;
  bool interleaved = false, inverse = false;
};

// Rotates pair i of `row` (rot/2 = half pairs) by the angle whose cosine and sine are c and s:
//   (a, b) <- (a c − b s, b c + a s).
template <class T>
ATTNLAB_HD inline void rope_rotate_pair(T* row, std::size_t i, std::size_t half, bool interleaved,
                                        T c, T s) {
  const std::size_t ia = interleaved ? 2 * i : i, ib = interleaved ? 2 * i + 1 : i + half;
  const T a = row[ia], b = row[ib];
  row[ia] = a * c - b * s;
  row[ib] = b * c + a * s;
}

// Pair `pair` (an index over slices · Tn · rot/2 pairs) of a RopeShape rotation, in place.
template <class T>
ATTNLAB_HD inline void rope_element(T* x, const T* cos, const T* sin, const RopeShape& shape,
                                    std::size_t pair) {
  const std::size_t half = shape.rot / 2;
  const std::size_t row = pair / half, i = pair % half, t = row % shape.Tn;
  const std::size_t at = (shape.offset + t) * half + i;
  rope_rotate_pair(x + row * shape.D, i, half, shape.interleaved, cos[at],
                   shape.inverse ? -sin[at] : sin[at]);
}

// The scalars of one AdamW step t (torch.optim.AdamW), formed in double on the host and used in T.
template <class T>
struct AdamWScalars {
  T decay;            // decay_factor: 1 − lr · wd, or 1 − (lr / base lr) · wd (independent)
  T one_minus_beta1;  // 1 − β1
  T beta2;            // β2
  T one_minus_beta2;  // 1 − β2
  T step_size;        // lr / (1 − β1^t)
  T bias_correction2_sqrt;  // √(1 − β2^t)
  T eps;
  bool decays;  // weight_decay != 0
};

// torch.lerp(a, b, w) = a + w (b − a), in the form that is exact at both ends (torch's kernel).
template <class T>
ATTNLAB_HD inline T lerp(T a, T b, T w) {
  return w < T(0.5) ? a + w * (b - a) : b - (b - a) * (T(1) - w);
}

// One element of Muon's momentum (Keller Jordan's muon_update): m ← lerp(m, g, 1 − β); the update
// is lerp(g, m, β) with Nesterov (g + β (m − g)), m itself without. 1 − β comes formed in double,
// as PyTorch forms it in Python.
template <class T>
ATTNLAB_HD inline T muon_momentum_element(T& m, T g, T beta, T one_minus_beta, bool nesterov) {
  m = lerp(m, g, one_minus_beta);
  return nesterov ? lerp(g, m, beta) : m;
}

// One element of AdamW, in torch's order: p ← p·decay; m ← lerp(m, g, 1−β1);
// v ← v·β2 + (1−β2) g²; p ← p − step_size · m / (√v / √(1−β2^t) + eps).
template <class T>
ATTNLAB_HD inline void adamw_element(T& p, T& m, T& v, T g, const AdamWScalars<T>& s) {
  if (s.decays) p = p * s.decay;
  m = lerp(m, g, s.one_minus_beta1);
  v = v * s.beta2 + s.one_minus_beta2 * g * g;
  const T denom = sqrt_of(v) / s.bias_correction2_sqrt + s.eps;
  p = p + (-s.step_size) * m / denom;
}

// One element of SGD (torch.optim.SGD, dampening 0, no Nesterov), in attnlab::SGD's order:
// d = g + wd·p (when wd != 0); with momentum (buf not null): buf = d on the first step, else
// buf·momentum + d, and d = buf; p = p + (−lr)·d.
template <class T>
ATTNLAB_HD inline void sgd_element(T& p, T* buf, T g, T lr, T momentum, T weight_decay,
                                   bool first_step) {
  T d = g;
  if (weight_decay != T(0)) d = d + weight_decay * p;
  if (buf) {
    *buf = first_step ? d : *buf * momentum + d;
    d = *buf;
  }
  p = p + (-lr) * d;
}

}  // namespace attnlab::kernel_math
