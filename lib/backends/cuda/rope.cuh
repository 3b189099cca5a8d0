// Private to lib/backends/cuda: the rotary-position kernel (attnlab/ops/rope.hpp), on the pair
// arithmetic of its CPU core (lib/src/kernels/rope.hpp). Launch glue: kernel_device_ops.hpp.
#pragma once

#include <cstddef>

#include "grid.cuh"
#include "kernels/rope.hpp"

namespace attnlab::cuda::kernels {

// Rotary positions in place, one pair per thread (kernel_math::rope_element, the CPU core's).
template <class T>
__global__ void __launch_bounds__(kElementThreads)
    rope_kernel(T* x, const T* cos, const T* sin, cm::RopeShape shape, std::size_t pairs) {
  for (std::size_t i = global_thread(); i < pairs; i += grid_threads())
    cm::rope_element(x, cos, sin, shape, i);
}

}  // namespace attnlab::cuda::kernels
