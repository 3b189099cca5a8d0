// SwiGLU (attnlab/ops/swiglu.hpp): its element math (silu_element, swiglu_gate_slope), which the
// CUDA kernels run (lib/backends/cuda/elementwise.cuh), and the raw-pointer cores that the op front
// (lib/src/ops/swiglu.cpp, where they are defined) and the CPU backend (lib/backends/cpu) call, so
// every backend computes the same bits. Over rows of the fused projection h (rows, 2F) = [a | b],
// cut across threads as lib/src/parallel_rows.hpp says (the same bits for any cut). Seen by nvcc:
// no xtensor, no xsimd, no OpenMP here.
#pragma once

#include <cstddef>

#include "attnlab/kernel_math.hpp"

namespace attnlab::kernel_math {

// SiLU (swish) a · σ(a), σ(a) = 1 / (1 + e^(−a)), and its derivative σ(a) (1 + a (1 − σ(a))), with
// 1 − σ(a) = e^(−a) σ(a) for a > 0 (no cancellation in the upper tail): SwiGLU's gate
// (attnlab/ops/swiglu.hpp). Both are 0 (signed) far in the lower tail, never NaN.
template <class T>
ATTNLAB_HD inline T silu_element(T a) {
  return a / (T(1) + exp_of(-a));
}
template <class T>
ATTNLAB_HD inline T swiglu_gate_slope(T a) {
  const T e = exp_of(-a);
  const T s = T(1) / (T(1) + e);
  const T one_minus_s = a > T(0) ? e * s : T(1) - s;
  return s * (T(1) + a * one_minus_s);
}

}  // namespace attnlab::kernel_math

namespace attnlab::detail {

// y (rows, F) = silu(a) ⊙ b.
template <class T>
void swiglu_forward_rows(T* y, const T* h, std::size_t rows, std::size_t F);

// dh (rows, 2F) = [dy ⊙ b ⊙ silu'(a) | dy ⊙ silu(a)] from dy (rows, F) and the forward's h.
template <class T>
void swiglu_backward_rows(T* dh, const T* dy, const T* h, std::size_t rows, std::size_t F);

}  // namespace attnlab::detail
