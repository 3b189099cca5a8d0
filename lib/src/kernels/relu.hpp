// ReLU and ReLU² (attnlab/ops/relu.hpp; ReLU²: So et al. 2021, "Primer"): the element math, which
// the CUDA kernels run (lib/backends/cuda/elementwise.cuh), and the raw-pointer cores that the op
// front (lib/src/ops/relu.cpp, where they are defined) and the CPU backend (lib/backends/cpu) call.
// Elementwise over n values, cut across threads as lib/src/parallel_rows.hpp says (the same bits
// for any cut); every output is assigned. Seen by nvcc: no xtensor, no xsimd, no OpenMP here.
#pragma once

#include <cstddef>

#include "attnlab/kernel_math.hpp"

namespace attnlab::kernel_math {

// y = max(x, 0), and its gradient dx = dy where x > 0, else 0.
template <class T>
ATTNLAB_HD inline T relu_element(T x) {
  return x > T(0) ? x : T(0);
}
template <class T>
ATTNLAB_HD inline T relu_backward_element(T dy, T x) {
  return x > T(0) ? dy : T(0);
}

// ReLU²: y = x² where x > 0, else 0, and its gradient dx = (2x) · dy where x > 0, else 0.
template <class T>
ATTNLAB_HD inline T relu_squared_element(T x) {
  return x > T(0) ? x * x : T(0);
}
template <class T>
ATTNLAB_HD inline T relu_squared_backward_element(T dy, T x) {
  return x > T(0) ? (T(2) * x) * dy : T(0);
}

}  // namespace attnlab::kernel_math

namespace attnlab::detail {

// y = relu_element(x), or relu_squared_element(x) when `squared`.
template <class T>
void relu_forward_elements(T* y, const T* x, std::size_t n, bool squared);

// dx = relu_backward_element(dy, x), or relu_squared_backward_element(dy, x) when `squared`.
template <class T>
void relu_backward_elements(T* dx, const T* dy, const T* x, std::size_t n, bool squared);

}  // namespace attnlab::detail
