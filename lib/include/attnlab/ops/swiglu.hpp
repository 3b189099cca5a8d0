// SwiGLU, the gated MLP activation of LLaMA (Shazeer 2020, "GLU Variants Improve Transformer"),
// forward and backward, on the fused projection h = x [W_gate | W_up] (rows, 2F):
//
//   y = silu(a) ⊙ b                     a = h[:, :F] (the gate), b = h[:, F:] (the up projection)
//   silu(a) = a · σ(a),  σ(a) = 1 / (1 + e^(−a))
//   da = dy ⊙ b ⊙ σ(a) (1 + a (1 − σ(a))),   db = dy ⊙ silu(a)
//
// Reference: torch.nn.functional.silu(a) * b with (a, b) = h.chunk(2, dim=-1). One GEMM computes
// both projections (the layout of Hugging Face's fused gate_up_proj); the same arithmetic on every
// backend (kernel_math::silu_element and swiglu_gate_slope); DeviceOps::swiglu_forward /
// swiglu_backward run it on a backend's buffers.
#pragma once

#include <cstddef>

#include "attnlab/tensor.hpp"

namespace attnlab {

template <class T, std::size_t N>
struct SwigluCache {
  Tensor<T, N> h;  // the forward's input (..., 2F), which the backward reads
};

// h: (..., 2F) with an even last extent (ShapeError otherwise). Returns y (..., F) = silu(a) ⊙ b
// and fills `cache`.
template <class T, std::size_t N>
Tensor<T, N> swiglu_forward(SwigluCache<T, N>& cache, const Tensor<T, N>& h);

// dy: (..., F). Returns dh (..., 2F) = [da | db] (assigns). Throws std::logic_error on an empty
// cache, ShapeError on a shape mismatch.
template <class T, std::size_t N>
Tensor<T, N> swiglu_backward(const Tensor<T, N>& dy, const SwigluCache<T, N>& cache);

}  // namespace attnlab
