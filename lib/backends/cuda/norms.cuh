// Private to lib/backends/cuda: the LayerNorm and RMSNorm kernels (attnlab/ops/layernorm.hpp,
// rmsnorm.hpp), with the element math of their CPU cores (lib/src/kernels/norms.hpp). Launch glue:
// kernel_device_ops.hpp.
#pragma once

#include <cstddef>

#include "grid.cuh"
#include "kernels/norms.hpp"
#include "reduce.cuh"

namespace attnlab::cuda::kernels {

// ---- LayerNorm / RMSNorm: one block per row ---------------------------------------------------

template <class T>
__global__ void __launch_bounds__(kRowThreads)
    layernorm_forward_kernel(T* y, T* mean_out, T* rstd_out, const T* x, const T* gamma,
                             const T* beta, std::size_t C, T eps) {
  ATTNLAB_STATIC_SHARED(T, scratch, 32);
  const std::size_t r = blockIdx.x;
  const T* xr = x + r * C;
  T sum = 0;
  for (std::size_t c = threadIdx.x; c < C; c += blockDim.x) sum += xr[c];
  const T mean = detail::block_sum(sum, scratch) / T(C);
  T sq = 0;  // two passes: the biased variance of the centred values, as the CPU op
  for (std::size_t c = threadIdx.x; c < C; c += blockDim.x) sq += (xr[c] - mean) * (xr[c] - mean);
  const T rstd = T(1) / cm::sqrt_of(detail::block_sum(sq, scratch) / T(C) + eps);
  for (std::size_t c = threadIdx.x; c < C; c += blockDim.x) {
    y[r * C + c] = gamma[c] * ((xr[c] - mean) * rstd) + (beta ? beta[c] : T(0));
  }
  if (threadIdx.x == 0) {
    mean_out[r] = mean;
    rstd_out[r] = rstd;
  }
}

// dx of one row for LayerNorm (centred) or RMSNorm (mean = null: x̂ = x · rstd, no mean(g) term).
template <class T>
__global__ void __launch_bounds__(kRowThreads)
    norm_backward_rows_kernel(T* dx, const T* dy, const T* x, const T* mean, const T* rstd,
                              const T* gamma, std::size_t C) {
  ATTNLAB_STATIC_SHARED(T, scratch, 32);
  const std::size_t r = blockIdx.x;
  const T mu = mean ? mean[r] : T(0), s = rstd[r];
  T sum_g = 0, sum_gh = 0;
  for (std::size_t c = threadIdx.x; c < C; c += blockDim.x) {
    const T g = dy[r * C + c] * gamma[c];
    sum_g += g;
    sum_gh += g * ((x[r * C + c] - mu) * s);
  }
  const T mean_g = mean ? detail::block_sum(sum_g, scratch) / T(C) : T(0);
  const T mean_gh = detail::block_sum(sum_gh, scratch) / T(C);
  for (std::size_t c = threadIdx.x; c < C; c += blockDim.x) {
    const T g = dy[r * C + c] * gamma[c];
    dx[r * C + c] = cm::norm_backward_element(g, (x[r * C + c] - mu) * s, s, mean_g, mean_gh);
  }
}

// dγ[c] = Σ_r dy ⊙ x̂ and, when dbeta is not null, dβ[c] = Σ_r dy: one thread per column.
template <class T>
__global__ void __launch_bounds__(kElementThreads)
    norm_backward_columns_kernel(T* dgamma, T* dbeta, const T* dy, const T* x, const T* mean,
                                 const T* rstd, std::size_t rows, std::size_t C) {
  const std::size_t c = global_thread();
  if (c >= C) return;
  T dg = 0, db = 0;
  for (std::size_t r = 0; r < rows; ++r) {
    const T g = dy[r * C + c];
    dg += g * ((x[r * C + c] - (mean ? mean[r] : T(0))) * rstd[r]);
    db += g;
  }
  dgamma[c] = dg;
  if (dbeta) dbeta[c] = db;
}

template <class T>
__global__ void __launch_bounds__(kRowThreads)
    rmsnorm_forward_kernel(T* y, T* rstd_out, const T* x, const T* gamma, std::size_t C, T eps) {
  ATTNLAB_STATIC_SHARED(T, scratch, 32);
  const std::size_t r = blockIdx.x;
  const T* xr = x + r * C;
  T sq = 0;
  for (std::size_t c = threadIdx.x; c < C; c += blockDim.x) sq += xr[c] * xr[c];
  const T rstd = T(1) / cm::sqrt_of(detail::block_sum(sq, scratch) / T(C) + eps);
  for (std::size_t c = threadIdx.x; c < C; c += blockDim.x)
    y[r * C + c] = gamma[c] * (xr[c] * rstd);
  if (threadIdx.x == 0) rstd_out[r] = rstd;
}

}  // namespace attnlab::cuda::kernels
