// Private to lib/backends/cuda: the optimizer steps (AdamW, SGD, Muon's momentum and
// normalisation), on the element math the CPU backend runs too (lib/src/kernels/optimizers.hpp),
// and the sum of squares in double that gradient clipping and Muon read. Launch glue:
// kernel_device_ops.hpp.
#pragma once

#include <cstddef>

#include "attnlab/kernel_math.hpp"
#include "grid.cuh"
#include "kernels/optimizers.hpp"
#include "reduce.cuh"

namespace attnlab::cuda::kernels {

// ---- optimizers --------------------------------------------------------------------------------

// One SGD step over n values; buf is null when momentum is 0.
template <class T>
__global__ void __launch_bounds__(kElementThreads)
    sgd_kernel(T* param, T* buf, const T* grad, std::size_t n, T lr, T momentum, T weight_decay,
               bool first_step) {
  for (std::size_t i = global_thread(); i < n; i += grid_threads()) {
    cm::sgd_element(param[i], buf ? buf + i : static_cast<T*>(nullptr), grad[i], lr, momentum,
                    weight_decay, first_step);
  }
}

template <class T>
__global__ void __launch_bounds__(kElementThreads)
    adamw_kernel(T* param, T* m, T* v, const T* grad, std::size_t n, cm::AdamWScalars<T> s) {
  for (std::size_t i = global_thread(); i < n; i += grid_threads()) {
    cm::adamw_element(param[i], m[i], v[i], grad[i], s);
  }
}

// ---- Muon ---------------------------------------------------------------------------------------

template <class T>
__global__ void __launch_bounds__(kElementThreads)
    muon_momentum_kernel(T* u, T* m, const T* g, std::size_t n, T beta, T one_minus_beta,
                         bool nesterov) {
  for (std::size_t i = global_thread(); i < n; i += grid_threads())
    u[i] = cm::muon_momentum_element(m[i], g[i], beta, one_minus_beta, nesterov);
}

// x /= (√s + eps), s the device double sum_of_squares wrote.
template <class T>
__global__ void __launch_bounds__(kElementThreads)
    divide_by_norm_kernel(T* x, const double* sum_of_squares, std::size_t n, T eps) {
  const T denom = static_cast<T>(cm::sqrt_of(*sum_of_squares)) + eps;
  for (std::size_t i = global_thread(); i < n; i += grid_threads()) x[i] = x[i] / denom;
}

template <class T>
__global__ void __launch_bounds__(kElementThreads)
    axpby_kernel(T* y, const T* x, std::size_t n, T a, T b) {
  for (std::size_t i = global_thread(); i < n; i += grid_threads()) y[i] = y[i] * a + b * x[i];
}

// ---- Σ x², in double ---------------------------------------------------------------------------

// partial[block] = Σ x² over the block's grid-stride share (kSumBlocks blocks).
template <class T>
__global__ void __launch_bounds__(kElementThreads)
    sum_of_squares_partial_kernel(double* partial, const T* x, std::size_t n) {
  ATTNLAB_STATIC_SHARED(double, scratch, 32);
  double acc = 0;
  for (std::size_t i = global_thread(); i < n; i += grid_threads()) {
    acc += static_cast<double>(x[i]) * static_cast<double>(x[i]);
  }
  acc = detail::block_sum(acc, scratch);
  if (threadIdx.x == 0) partial[blockIdx.x] = acc;
}

// out[0] = Σ partial, one block (a template only so that this header defines no plain function).
template <class T>
__global__ void __launch_bounds__(kElementThreads)
    sum_partials_kernel(T* out, const T* partial, std::size_t count) {
  ATTNLAB_STATIC_SHARED(T, scratch, 32);
  T acc = 0;
  for (std::size_t i = threadIdx.x; i < count; i += blockDim.x) acc += partial[i];
  acc = detail::block_sum(acc, scratch);
  if (threadIdx.x == 0) out[0] = acc;
}

}  // namespace attnlab::cuda::kernels
