// Layer normalisation over the last axis, forward and backward.
// Reference: Ba et al. 2016, "Layer Normalization"; torch.nn.functional.layer_norm (biased
// variance, eps inside the square root).
//
//   μ = mean(x),  σ² = mean((x − μ)²),  x̂ = (x − μ) / √(σ² + eps),  y = γ ⊙ x̂ + β
//
// Rows are the contiguous last-axis slices of x (..., C), N in 2..4 (rank 4 serves QK-norm on
// (B,H,T,D) heads).
#pragma once

#include <cstddef>
#include <vector>

#include "attnlab/tensor.hpp"

namespace attnlab {

// PyTorch's default epsilon for nn.LayerNorm.
inline constexpr double kLayerNormEps = 1e-5;

template <class T, std::size_t N>
struct LayerNormCache {
  Tensor<T, N> x;       // (..., C) the input (x̂ is recomputed from it in the backward)
  std::vector<T> mean;  // (rows,) μ
  std::vector<T> rstd;  // (rows,) 1 / √(σ² + eps)
};

template <class T, std::size_t N>
struct LayerNormGrads {
  Tensor<T, N> dx;    // (..., C)
  Tensor1<T> dgamma;  // (C,)
  Tensor1<T> dbeta;   // (C,)
};

// x: (..., C), gamma and beta: (C,). Returns y (..., C) and fills `cache`.
template <class T, std::size_t N>
Tensor<T, N> layernorm_forward(LayerNormCache<T, N>& cache, const Tensor<T, N>& x,
                               const Tensor1<T>& gamma, const Tensor1<T>& beta,
                               double eps = kLayerNormEps);

// dy: (..., C). Returns fresh gradients (assigns). With g = dy ⊙ γ:
//   dx = rstd · (g − mean(g) − x̂ ⊙ mean(g ⊙ x̂)),  dγ = Σ_rows dy ⊙ x̂,  dβ = Σ_rows dy.
template <class T, std::size_t N>
LayerNormGrads<T, N> layernorm_backward(const Tensor<T, N>& dy, const LayerNormCache<T, N>& cache,
                                        const Tensor1<T>& gamma);

}  // namespace attnlab
