// Affine map over the last axis, forward and backward.
// Reference: torch.nn.functional.linear(x, weight, bias) with weight = Wᵀ: attnlab stores W as
// (In, Out), so y = x W + b needs no transpose in the forward gemm.
//
//   y = x W + b      (rows, In) x (In, Out) -> (rows, Out)
//
// x has rank N = 2 (B, In) or 3 (B, T, In); its leading axes are flattened into rows.
#pragma once

#include <cstddef>

#include "attnlab/tensor.hpp"

namespace attnlab {

// The backward needs the forward's input.
template <class T, std::size_t N>
struct LinearCache {
  Tensor<T, N> x;  // (..., In)
};

template <class T, std::size_t N>
struct LinearGrads {
  Tensor<T, N> dx;  // (..., In)
  Tensor2<T> dw;    // (In, Out)
  Tensor1<T> db;    // (Out,); empty when the forward had no bias
};

// x: (..., In), w: (In, Out), b: (Out,) or nullptr. Returns y (..., Out) and fills `cache`.
// Throws ShapeError when x's last extent is not In or b is not (Out,).
template <class T, std::size_t N>
Tensor<T, N> linear_forward(LinearCache<T, N>& cache, const Tensor<T, N>& x, const Tensor2<T>& w,
                            const Tensor1<T>* b = nullptr);

// dy: (..., Out). Returns fresh gradients (assigns; nothing is accumulated):
//   dx = dy Wᵀ,  dW = xᵀ dy (rows flattened),  db = Σ_rows dy (only when with_bias).
// Throws std::logic_error on an empty cache, ShapeError on mismatch.
template <class T, std::size_t N>
LinearGrads<T, N> linear_backward(const Tensor<T, N>& dy, const LinearCache<T, N>& cache,
                                  const Tensor2<T>& w, bool with_bias);

}  // namespace attnlab
