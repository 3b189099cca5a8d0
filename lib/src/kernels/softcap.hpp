// Private to the library (lib/src, and lib/backends/cpu, which calls the same cores): the
// raw-pointer cores of softcapping (ops/softcap.cpp), called by the xtensor op pair and by the CPU
// device backend. Elementwise over n values, cut across threads as
// ../parallel_rows.hpp says (the same bits for any cut); the element arithmetic is
// kernel_math::softcap_element and softcap_slope, the CUDA kernels' too.
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
