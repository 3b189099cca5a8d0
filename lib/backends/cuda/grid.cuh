// Private to lib/backends/cuda: the launch shapes that every family of kernels shares (the block
// sizes of row and elementwise kernels, the grid of the grid-stride loops) and the thread index of
// a grid-stride loop. The families: elementwise.cuh, norms.cuh, embedding.cuh, cross_entropy.cuh,
// optimizers.cuh, rope.cuh, and the attention paths (attention_*_kernels.cuh). Device code only:
// compiled by nvcc, and on the CPU under the emulator (attnlab/backends/cuda_emulator.hpp); the
// launch glue is kernel_device_ops.hpp, the contracts attnlab/device_ops.hpp.
//
// Row kernels use one block per row, of at most kRowThreads (detail::row_threads, reduce.cuh), and
// deterministic block reductions (reduce.cuh);
// column reductions (dγ, dβ, db, the embedding backward) use one thread per output element looping
// over rows in order; elementwise kernels use a grid-stride loop.
#pragma once

#include <cstddef>

#include "attnlab/kernel_math.hpp"
#include "device_compat.cuh"

namespace attnlab::cuda::kernels {

namespace cm = kernel_math;

constexpr int kRowThreads = 256;
constexpr int kElementThreads = 256;
constexpr unsigned kMaxElementBlocks = 1024;
constexpr unsigned kSumBlocks = 256;  // partial sums of sum_of_squares on the GPU

// Blocks of an elementwise (grid-stride) launch over n values: one per kElementThreads values, at
// most max_blocks (the runtime's kMaxStrideBlocks).
inline unsigned element_blocks(std::size_t n, unsigned max_blocks = kMaxElementBlocks) {
  const std::size_t blocks = cm::tile_count(n, kElementThreads);
  return static_cast<unsigned>(blocks < max_blocks ? (blocks > 0 ? blocks : 1) : max_blocks);
}

__device__ inline std::size_t global_thread() {
  return static_cast<std::size_t>(blockIdx.x) * blockDim.x + threadIdx.x;
}
__device__ inline std::size_t grid_threads() {
  return static_cast<std::size_t>(gridDim.x) * blockDim.x;
}

}  // namespace attnlab::cuda::kernels
