// ReLU and ReLU² activations, forward and backward.
// Reference: torch.nn.functional.relu; ReLU² is torch.relu(x).square() (So et al. 2021, "Primer";
// the MLP of modded-nanogpt and nanochat). The derivative at exactly 0 is taken as 0, as in
// PyTorch.
//
//   relu: y = max(x, 0)        relu_squared: y = max(x, 0)²,  dy/dx = 2 max(x, 0)
#pragma once

#include <cstddef>

#include "attnlab/tensor.hpp"

namespace attnlab {

template <class T, std::size_t N>
struct ReluCache {
  Tensor<T, N> x;
};

// x: any shape. Returns y (same shape) and fills `cache`.
template <class T, std::size_t N>
Tensor<T, N> relu_forward(ReluCache<T, N>& cache, const Tensor<T, N>& x);

// dy: same shape as x. Returns dx = dy where x > 0, else 0 (assigns).
template <class T, std::size_t N>
Tensor<T, N> relu_backward(const Tensor<T, N>& dy, const ReluCache<T, N>& cache);

// ReLU²: x any shape; returns y = max(x, 0)² and fills `cache` (the same cache as ReLU's).
template <class T, std::size_t N>
Tensor<T, N> relu_squared_forward(ReluCache<T, N>& cache, const Tensor<T, N>& x);

// dy: same shape as x. Returns dx = 2x · dy where x > 0, else 0 (assigns).
template <class T, std::size_t N>
Tensor<T, N> relu_squared_backward(const Tensor<T, N>& dy, const ReluCache<T, N>& cache);

}  // namespace attnlab
