// Softcapping, forward and backward: y = c · tanh(x / c), a smooth bound |y| < c that is the
// identity near 0 (slope 1). Gemma 2 caps the attention scores at 50 and the output logits at 30;
// nanochat and modded-nanogpt cap the output logits at 15. Reference: c * torch.tanh(x / c).
//
//   y = c · tanh(x / c),   dx = dy · (1 − (y / c)²)   (tanh' from the output, as torch's tanh)
//
// The same arithmetic on every backend (attnlab/kernel_math.hpp, softcap_element and
// softcap_slope); DeviceOps::softcap_forward / softcap_backward run it on a backend's buffers.
#pragma once

#include <cstddef>
#include <string_view>

#include "attnlab/tensor.hpp"

namespace attnlab {

template <class T, std::size_t N>
struct SoftcapCache {
  Tensor<T, N> y;  // the forward's output, which the backward reads
  double cap = 0;
};

// Throws std::invalid_argument "<op>: <name> expected a finite cap > 0, got <cap>".
void check_softcap(std::string_view op, std::string_view name, double cap);

// x: any shape; cap c finite and > 0. Returns y = c · tanh(x / c) and fills `cache`.
template <class T, std::size_t N>
Tensor<T, N> softcap_forward(SoftcapCache<T, N>& cache, const Tensor<T, N>& x, double cap);

// dy: the shape of x. Returns dx = dy · (1 − (y / c)²) (assigns). Throws std::logic_error on an
// empty cache, ShapeError on a shape mismatch.
template <class T, std::size_t N>
Tensor<T, N> softcap_backward(const Tensor<T, N>& dy, const SoftcapCache<T, N>& cache);

}  // namespace attnlab
