// Private to the library (lib/src, and lib/backends/cpu, which calls the same cores): the
// raw-pointer cores of LayerNorm (ops/layernorm.cpp) and RMSNorm (ops/rmsnorm.cpp), called by the
// xtensor ops and by the CPU device backend alike, so the two cannot drift. Rows are cut as
// ../parallel_rows.hpp says (deterministic for a fixed thread count); the column sums dγ, dβ keep
// one partial per chunk in `scratch` (resized here, kept by the caller between calls) and add them
// in chunk order. Every output is assigned.
#pragma once

#include <cstddef>
#include <vector>

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
