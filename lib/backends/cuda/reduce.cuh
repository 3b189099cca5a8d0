// Private to lib/backends/cuda: deterministic warp and block reductions (fixed shuffle order).
#pragma once

#include <algorithm>
#include <cstddef>

#include "attnlab/kernel_math.hpp"

namespace attnlab::cuda::detail {

constexpr int kWarpSize = 32;

template <class T>
__device__ inline T warp_sum(T x) {
  for (int offset = kWarpSize / 2; offset > 0; offset /= 2) {
    x += __shfl_xor_sync(0xffffffffu, x, offset);
  }
  return x;
}

template <class T>
__device__ inline T warp_max(T x) {
  for (int offset = kWarpSize / 2; offset > 0; offset /= 2) {
    x = kernel_math::max_of(x, __shfl_xor_sync(0xffffffffu, x, offset));
  }
  return x;
}

// Merges the (max, sum) online-softmax states of a warp; every lane gets the result.
template <class T>
__device__ inline kernel_math::OnlineSoftmax<T> warp_merge(kernel_math::OnlineSoftmax<T> state) {
  for (int offset = kWarpSize / 2; offset > 0; offset /= 2) {
    const T other_max = __shfl_xor_sync(0xffffffffu, state.max, offset);
    const T other_sum = __shfl_xor_sync(0xffffffffu, state.sum, offset);
    state.merge(other_max, other_sum);
  }
  return state;
}

// The threads of a block that reduces a row of `width` values (one block per row, each thread
// taking the values at its index and every blockDim.x after it): `most` (a multiple of 32, at most
// 1024), or for a narrower row the fewest whole warps that give each value a thread of its own. A
// narrow row, such as a small model's layer norm, then costs one warp instead of eight. The result
// is the same bits as with `most` threads: each value stays with the same thread, and the warps
// left out held no value, so their partial sums and online-softmax states were the empty ones that
// block_sum and block_merge give the lanes past the last warp anyway.
inline unsigned row_threads(std::size_t width, unsigned most) {
  const std::size_t whole_warps = kernel_math::round_up(width > 0 ? width : 1, kWarpSize);
  return static_cast<unsigned>(std::min<std::size_t>(most, whole_warps));
}

// Block-wide sum for blockDim.x a multiple of 32 (≤ 1024); `scratch` holds 32 values. Every thread
// gets the result. Contains __syncthreads: call from all threads.
template <class T>
__device__ inline T block_sum(T x, T* scratch) {
  const int lane = threadIdx.x % kWarpSize, warp = threadIdx.x / kWarpSize;
  const int warps = blockDim.x / kWarpSize;
  x = warp_sum(x);
  __syncthreads();  // scratch may still be read by a previous reduction
  if (lane == 0) scratch[warp] = x;
  __syncthreads();
  x = lane < warps ? scratch[lane] : T(0);
  return warp_sum(x);
}

// Block-wide online-softmax merge; `max_scratch` and `sum_scratch` hold 32 values each.
template <class T>
__device__ inline kernel_math::OnlineSoftmax<T> block_merge(kernel_math::OnlineSoftmax<T> state,
                                                            T* max_scratch, T* sum_scratch) {
  const int lane = threadIdx.x % kWarpSize, warp = threadIdx.x / kWarpSize;
  const int warps = blockDim.x / kWarpSize;
  state = warp_merge(state);
  __syncthreads();
  if (lane == 0) {
    max_scratch[warp] = state.max;
    sum_scratch[warp] = state.sum;
  }
  __syncthreads();
  kernel_math::OnlineSoftmax<T> total;
  if (lane < warps) {
    total.max = max_scratch[lane];
    total.sum = sum_scratch[lane];
  }
  return warp_merge(total);
}

}  // namespace attnlab::cuda::detail
