// Root-mean-square normalisation over the last axis, forward and backward.
// Reference: Zhang & Sennrich 2019, "Root Mean Square Layer Normalization";
// torch.nn.functional.rms_norm.
//
//   rstd = 1 / √(mean(x²) + eps),  x̂ = x · rstd,  y = γ ⊙ x̂        (no centring, no bias)
#pragma once

#include <cstddef>
#include <vector>

#include "attnlab/tensor.hpp"

namespace attnlab {

// Same epsilon as LayerNorm, so that switching the norm changes one thing only.
inline constexpr double kRmsNormEps = 1e-5;

template <class T, std::size_t N>
struct RmsNormCache {
  Tensor<T, N> x;       // (..., C) the input (x̂ = x · rstd is recomputed in the backward)
  std::vector<T> rstd;  // (rows,)
};

template <class T, std::size_t N>
struct RmsNormGrads {
  Tensor<T, N> dx;    // (..., C)
  Tensor1<T> dgamma;  // (C,)
};

// x: (..., C), gamma: (C,). Returns y (..., C) and fills `cache`.
template <class T, std::size_t N>
Tensor<T, N> rmsnorm_forward(RmsNormCache<T, N>& cache, const Tensor<T, N>& x,
                             const Tensor1<T>& gamma, double eps = kRmsNormEps);

// dy: (..., C). Returns fresh gradients (assigns). With g = dy ⊙ γ:
//   dx = rstd · (g − x̂ ⊙ mean(g ⊙ x̂)),  dγ = Σ_rows dy ⊙ x̂.
template <class T, std::size_t N>
RmsNormGrads<T, N> rmsnorm_backward(const Tensor<T, N>& dy, const RmsNormCache<T, N>& cache,
                                    const Tensor1<T>& gamma);

}  // namespace attnlab
