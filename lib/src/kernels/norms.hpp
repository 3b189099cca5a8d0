// LayerNorm (attnlab/ops/layernorm.hpp) and RMSNorm (attnlab/ops/rmsnorm.hpp): the element math of
// their backward, which the CUDA kernels run (lib/backends/cuda/norms.cuh), and the raw-pointer
// cores that the op fronts (lib/src/ops/layernorm.cpp, rmsnorm.cpp, where they are defined) and the
// CPU backend (lib/backends/cpu) call, so the two cannot drift. Rows are cut as
// lib/src/parallel_rows.hpp says (deterministic for a fixed thread count); the column sums dγ, dβ
// keep one partial per chunk in `scratch` (resized here, kept by the caller between calls) and add
// them in chunk order. Every output is assigned. Seen by nvcc: no xtensor, no xsimd, no OpenMP
// here.
#pragma once

#include <cstddef>
#include <vector>

#include "attnlab/kernel_math.hpp"

namespace attnlab::kernel_math {

// The normalisation backward of one element (LayerNorm and RMSNorm): with g = dy ⊙ γ,
//   dx = rstd · (g − mean_g − x̂ · mean_g_xhat)
// (RMSNorm passes mean_g = 0: no centring).
template <class T>
ATTNLAB_HD inline T norm_backward_element(T g, T xhat, T rstd, T mean_g, T mean_g_xhat) {
  return rstd * (g - mean_g - xhat * mean_g_xhat);
}

}  // namespace attnlab::kernel_math

namespace attnlab::detail {

// y (rows, C) = γ ⊙ (x − μ) · rstd + β; saves mean and rstd (rows,).
template <class T>
void layernorm_forward_rows(T* y, T* mean, T* rstd, const T* x, const T* gamma, const T* beta,
                            std::size_t rows, std::size_t C, T eps);

// dx (rows, C); dgamma (C,) = Σ_rows dy ⊙ x̂ and dbeta (C,) = Σ_rows dy, each skipped when null.
template <class T>
void layernorm_backward_rows(T* dx, T* dgamma, T* dbeta, const T* dy, const T* x, const T* mean,
                             const T* rstd, const T* gamma, std::size_t rows, std::size_t C,
                             std::vector<T>& scratch);

// y (rows, C) = γ ⊙ x · rstd, rstd = 1/√(mean(x²) + eps); saves rstd (rows,).
template <class T>
void rmsnorm_forward_rows(T* y, T* rstd, const T* x, const T* gamma, std::size_t rows,
                          std::size_t C, T eps);

// dx (rows, C), dgamma (C,) = Σ_rows dy ⊙ x̂.
template <class T>
void rmsnorm_backward_rows(T* dx, T* dgamma, const T* dy, const T* x, const T* rstd, const T* gamma,
                           std::size_t rows, std::size_t C, std::vector<T>& scratch);

}  // namespace attnlab::detail
