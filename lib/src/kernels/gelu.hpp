// GELU (attnlab/ops/gelu.hpp): its element math, which the CUDA kernels run
// (lib/backends/cuda/elementwise.cuh), and the raw-pointer core of gelu_forward / gelu_backward,
// which the op front (lib/src/ops/gelu.cpp, where it is defined) and the CPU backend
// (lib/backends/cpu) call. The core evaluates the same forms vectorised (xsimd), parallel over
// blocks of 64 values; each value takes the same path for any thread count. This header is seen by
// nvcc: no xtensor, no xsimd, no OpenMP here.
#pragma once

#include <cstddef>

#include "attnlab/kernel_math.hpp"

namespace attnlab::kernel_math {

// GELU, torch.nn.functional.gelu: tanh approximation y = ½ x (1 + tanh(c (x + 0.044715 x³))),
// c = √(2/π), or exact y = x Φ(x); and their derivatives dy/dx.
template <class T>
ATTNLAB_HD inline T gelu(T x, bool exact) {
  if (exact) return T(0.5) * x * (T(1) + erf_of(x * T(0.70710678118654752440)));
  // ½ (1 + tanh u) = σ(2u) = 1 / (1 + e^(−2u)): the CPU op's form (ops/gelu.cpp)
  const T c = T(0.79788456080286535588);
  const T u = c * (x + T(0.044715) * x * x * x);
  return x / (T(1) + exp_of(T(-2) * u));
}

template <class T>
ATTNLAB_HD inline T gelu_derivative(T x, bool exact) {
  if (exact) {  // Φ(x) + x φ(x)
    const T cdf = T(0.5) * (T(1) + erf_of(x * T(0.70710678118654752440)));
    const T pdf = exp_of(T(-0.5) * x * x) * T(0.39894228040143267794);
    return cdf + x * pdf;
  }
  // s + x s (1 − s) 2c (1 + 3·0.044715 x²), s = σ(2u) = 1 / (1 + e), e = e^(−2u),
  // u = c (x + 0.044715 x³); 1 − s = e s for u > 0 (the CPU op's form, ops/gelu.cpp)
  const T c = T(0.79788456080286535588);
  const T u = c * (x + T(0.044715) * x * x * x);
  const T e = exp_of(T(-2) * u);
  const T s = T(1) / (T(1) + e);
  const T one_minus_s = u > T(0) ? e * s : T(1) - s;
  return s + x * s * one_minus_s * T(2) * c * (T(1) + T(3 * 0.044715) * x * x);
}

}  // namespace attnlab::kernel_math

namespace attnlab::detail {

// y = gelu(x) over n values (dy null), or dx = dy ⊙ gelu'(x) (dy not null); out may alias x or dy.
template <class T>
void gelu_elements(T* out, const T* x, const T* dy, std::size_t n, bool exact);

}  // namespace attnlab::detail
