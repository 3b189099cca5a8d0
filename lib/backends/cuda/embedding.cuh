// Private to lib/backends/cuda: the embedding lookup's kernels (attnlab/ops/embedding.hpp; the CPU
// core is lib/src/kernels/embedding.hpp). Launch glue: kernel_device_ops.hpp.
#pragma once

#include <cstddef>

#include "grid.cuh"

namespace attnlab::cuda::kernels {

// ---- embedding: one block per position (forward), one block per vocabulary row (backward) ----

template <class T>
__global__ void __launch_bounds__(kRowThreads)
    embedding_forward_kernel(T* y, const int* ids, const T* table, std::size_t C) {
  const std::size_t r = blockIdx.x;
  const int id = ids[r];
  for (std::size_t c = threadIdx.x; c < C; c += blockDim.x) {
    y[r * C + c] = id < 0 ? T(0) : table[static_cast<std::size_t>(id) * C + c];
  }
}

template <class T>
__global__ void __launch_bounds__(kRowThreads)
    embedding_backward_kernel(T* dtable, const T* dy, const int* ids, std::size_t rows,
                              std::size_t C) {
  const std::size_t v = blockIdx.x;
  for (std::size_t c = threadIdx.x; c < C; c += blockDim.x) {
    T acc = 0;
    for (std::size_t r = 0; r < rows; ++r) {
      if (ids[r] == static_cast<int>(v)) acc += dy[r * C + c];
    }
    dtable[v * C + c] = acc;
  }
}

}  // namespace attnlab::cuda::kernels
