// Softcapping (attnlab/ops/softcap.hpp): the raw-pointer cores that the op front
// (lib/src/ops/softcap.cpp, where they are defined) and the CPU backend (lib/backends/cpu) call.
// Elementwise over n values, cut across threads as lib/src/parallel_rows.hpp says (the same bits
// for any cut). The element arithmetic, kernel_math::softcap_element and softcap_slope, stays in
// the public attnlab/kernel_math.hpp because the attention score rule caps its scores with it; the
// CUDA kernels (lib/backends/cuda/elementwise.cuh) run it too. Seen by nvcc: no xtensor here.
#pragma once

#include <cstddef>

namespace attnlab::detail {

// y = cap · tanh(x / cap) (y may be x).
template <class T>
void softcap_forward_elements(T* y, const T* x, std::size_t n, T cap);

// dx = dy · (1 − (y / cap)²) from the forward's output y (dx may be dy).
template <class T>
void softcap_backward_elements(T* dx, const T* dy, const T* y, std::size_t n, T cap);

}  // namespace attnlab::detail
