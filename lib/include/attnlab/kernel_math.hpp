// The per-element and per-row arithmetic that the public headers and every backend's kernels share
// (the CUDA ones, the emulated device's, the CPU backend's) and the tests: ATTNLAB_HD, the math
// functions of T, the online softmax of attention and cross-entropy, the index math of the (B, H,
// R, C) layouts, softcapping (the attention score rule's too) and the two structs DeviceOps takes
// (RopeShape, AdamWScalars). Every function is __host__ __device__ under nvcc and plain inline C++
// otherwise, so the CPU suite exercises exactly the arithmetic the kernels run. No CUDA header, no
// xtensor. Which keys a query sees is the attention score rule's
// (attnlab/attention/score_rule.hpp), not this file's. The element math of one op alone (GELU,
// SwiGLU, the norms, RoPE, the optimizers) lives with its CPU core in lib/src/kernels/<op>.hpp, in
// this namespace.
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

// ---- shared with the public headers (the score rule, attnlab/device_ops.hpp) ---------------

// Softcapping (attnlab/ops/softcap.hpp, and the attention score rule's cap on the scores):
// y = c · tanh(x / c), and its slope from the output, dy/dx = 1 − (y / c)².
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
// its transpose. The pair arithmetic is rope_element (lib/src/kernels/rope.hpp).
struct RopeShape {
  std::size_t slices = 0, Tn = 0, D = 0, rot = 0, offset = 0;
  bool interleaved = false, inverse = false;
};

// The scalars of one AdamW step t (torch.optim.AdamW), formed in double on the host and used in T
// by adamw_element (lib/src/kernels/optimizers.hpp).
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

}  // namespace attnlab::kernel_math
