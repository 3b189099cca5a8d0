// Private to the library (lib/src, and lib/backends/cpu, which calls the same cores): the
// raw-pointer cores of SwiGLU (ops/swiglu.cpp), called by the xtensor op pair and by the CPU device
// backend. Over rows of the fused projection h (rows, 2F) = [a | b], cut across threads as
// ../parallel_rows.hpp says (the same bits for any cut); the element arithmetic is
// kernel_math::silu_element and swiglu_gate_slope, the CUDA kernels' too.
#pragma once

#include <cstddef>

namespace attnlab::detail {

// y (rows, F) = silu(a) ⊙ b.
template <class T>
void swiglu_forward_rows(T* y, const T* h, std::size_t rows, std::size_t F);

// dh (rows, 2F) = [dy ⊙ b ⊙ silu'(a) | dy ⊙ silu(a)] from dy (rows, F) and the forward's h.
template <class T>
void swiglu_backward_rows(T* dh, const T* dy, const T* h, std::size_t rows, std::size_t F);

}  // namespace attnlab::detail
