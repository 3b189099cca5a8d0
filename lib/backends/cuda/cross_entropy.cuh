// Private to lib/backends/cuda: the fused softmax cross-entropy kernels
// (attnlab/ops/cross_entropy.hpp; the CPU core is lib/src/kernels/cross_entropy.hpp), on the online
// softmax of attnlab/kernel_math.hpp. Launch glue: kernel_device_ops.hpp.
#pragma once

#include <cstddef>

#include "attnlab/kernel_math.hpp"
#include "grid.cuh"
#include "reduce.cuh"

namespace attnlab::cuda::kernels {

// ---- softmax cross-entropy ----------------------------------------------------------------------

// One block per row: row_loss[r] = −log softmax(x)[target], row_loss[rows + r] = z · log Z² (log Z
// = logsumexp(x)) and dlogits = softmax · (1 + 2 z log Z) − onehot on labelled rows (0, 0 and 0
// elsewhere); the 1/n scaling follows in scale_kernel.
template <class T>
__global__ void __launch_bounds__(kRowThreads)
    cross_entropy_rows_kernel(T* row_loss, T* dlogits, const T* logits, const int* targets,
                              std::size_t rows, std::size_t V, int ignore_index, T z_loss) {
  ATTNLAB_STATIC_SHARED(T, max_scratch, 32);
  ATTNLAB_STATIC_SHARED(T, sum_scratch, 32);
  const std::size_t r = blockIdx.x;
  const int target = targets[r];
  const bool labelled =
      target != ignore_index && target >= 0 && static_cast<std::size_t>(target) < V;
  const T* x = logits + r * V;
  T* g = dlogits + r * V;
  if (!labelled) {  // uniform across the block: every thread takes this branch or none does
    for (std::size_t j = threadIdx.x; j < V; j += blockDim.x) g[j] = T(0);
    if (threadIdx.x == 0) {
      row_loss[r] = T(0);
      row_loss[rows + r] = T(0);
    }
    return;
  }
  cm::OnlineSoftmax<T> state;
  for (std::size_t j = threadIdx.x; j < V; j += blockDim.x) state.add(x[j]);
  state = detail::block_merge(state, max_scratch, sum_scratch);
  const T log_sum = cm::log_of(state.sum);  // log Σ exp(x − max)
  const T log_z = state.max + log_sum;
  const T p_scale = T(1) + T(2) * z_loss * log_z;  // d(z log Z²)/dx = 2 z log Z · p; 1 when z = 0
  for (std::size_t j = threadIdx.x; j < V; j += blockDim.x) {
    const T p = cm::exp_of(x[j] - state.max - log_sum);
    g[j] = p * p_scale - (j == static_cast<std::size_t>(target) ? T(1) : T(0));
  }
  // −log p[target] = −((x_t − max) − log Σ)
  if (threadIdx.x == 0) {
    row_loss[r] = -((x[target] - state.max) - log_sum);
    row_loss[rows + r] = z_loss * log_z * log_z;
  }
}

// One block: n = #labelled rows; loss[0] = Σ row_loss[r] / n, loss[1] = Σ row_loss[rows + r] / n
// and inv_n[0] = 1 / n (all 0 when n = 0).
template <class T>
__global__ void __launch_bounds__(kRowThreads)
    cross_entropy_mean_kernel(T* loss, T* inv_n, const T* row_loss, const int* targets,
                              std::size_t rows, std::size_t V, int ignore_index) {
  ATTNLAB_STATIC_SHARED(T, scratch, 32);
  T sum = 0, sum_z = 0, count = 0;
  for (std::size_t r = threadIdx.x; r < rows; r += blockDim.x) {
    const int t = targets[r];
    if (t != ignore_index && t >= 0 && static_cast<std::size_t>(t) < V) {
      sum += row_loss[r];
      sum_z += row_loss[rows + r];
      count += T(1);
    }
  }
  sum = detail::block_sum(sum, scratch);
  sum_z = detail::block_sum(sum_z, scratch);
  count = detail::block_sum(count, scratch);
  if (threadIdx.x == 0) {
    loss[0] = count > T(0) ? sum / count : T(0);
    loss[1] = count > T(0) ? sum_z / count : T(0);
    inv_n[0] = count > T(0) ? T(1) / count : T(0);
  }
}

// x[i] *= factor[0] over n values.
template <class T>
__global__ void __launch_bounds__(kElementThreads)
    scale_kernel(T* x, const T* factor, std::size_t n) {
  const T f = factor[0];
  for (std::size_t i = global_thread(); i < n; i += grid_threads()) x[i] *= f;
}

}  // namespace attnlab::cuda::kernels
