// GELU activation, forward and backward.
// Reference: Hendrycks & Gimpel 2016; torch.nn.functional.gelu(x, approximate='tanh' | 'none').
//
//   tanh (default): y = ½ x (1 + tanh(c (x + 0.044715 x³))),  c = √(2/π)
//   exact:          y = ½ x (1 + erf(x / √2)) = x Φ(x)
// The tanh form is computed as x σ(2u), u = c (x + 0.044715 x³) (the same function, one exp); in
// float the exact form uses a rational erf within 3.4e-7 of erf (ops/gelu.cpp).
#pragma once

#include <cstddef>
#include <string_view>

#include "attnlab/tensor.hpp"

namespace attnlab {

enum class GeluApproximation { tanh, exact };

template <class T, std::size_t N>
struct GeluCache {
  Tensor<T, N> x;
  GeluApproximation approximation = GeluApproximation::tanh;
};

// x: any shape. Returns y (same shape) and fills `cache`.
template <class T, std::size_t N>
Tensor<T, N> gelu_forward(GeluCache<T, N>& cache, const Tensor<T, N>& x,
                          GeluApproximation approximation = GeluApproximation::tanh);

// dy: same shape as x. Returns dx = dy ⊙ gelu'(x) (assigns).
template <class T, std::size_t N>
Tensor<T, N> gelu_backward(const Tensor<T, N>& dy, const GeluCache<T, N>& cache);

}  // namespace attnlab
