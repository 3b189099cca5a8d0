// Private to lib/backends/cuda: the elementwise kernels of the training step (GELU, ReLU, ReLU²,
// SwiGLU, softcapping, dropout, bias, add, scale, exp, rounding to bf16), each on the element math
// of its op's CPU core (lib/src/kernels/<op>.hpp, attnlab/kernel_math.hpp), and the layout kernels
// of the attention layer (head split and merge, the per-head dot). Launch glue:
// kernel_device_ops.hpp.
#pragma once

#include <cstddef>
#include <cstdint>

#include "attnlab/attention/dropout.hpp"
#include "attnlab/kernel_math.hpp"
#include "grid.cuh"
#include "kernels/gelu.hpp"
#include "kernels/relu.hpp"
#include "kernels/swiglu.hpp"
#include "reduce.cuh"

namespace attnlab::cuda::kernels {

// ---- elementwise ------------------------------------------------------------------------------

template <class T>
__global__ void __launch_bounds__(kElementThreads)
    gelu_forward_kernel(T* y, const T* x, std::size_t n, bool exact) {
  for (std::size_t i = global_thread(); i < n; i += grid_threads()) y[i] = cm::gelu(x[i], exact);
}

template <class T>
__global__ void __launch_bounds__(kElementThreads)
    gelu_backward_kernel(T* dx, const T* dy, const T* x, std::size_t n, bool exact) {
  for (std::size_t i = global_thread(); i < n; i += grid_threads()) {
    dx[i] = dy[i] * cm::gelu_derivative(x[i], exact);
  }
}

// ReLU, or ReLU² when `squared`, with the CPU core's arithmetic (kernel_math::relu_element,
// relu_squared_element and their backward): the same bits.
template <class T>
__global__ void __launch_bounds__(kElementThreads)
    relu_forward_kernel(T* y, const T* x, std::size_t n, bool squared) {
  for (std::size_t i = global_thread(); i < n; i += grid_threads()) {
    y[i] = squared ? cm::relu_squared_element(x[i]) : cm::relu_element(x[i]);
  }
}

template <class T>
__global__ void __launch_bounds__(kElementThreads)
    relu_backward_kernel(T* dx, const T* dy, const T* x, std::size_t n, bool squared) {
  for (std::size_t i = global_thread(); i < n; i += grid_threads()) {
    dx[i] = squared ? cm::relu_squared_backward_element(dy[i], x[i])
                    : cm::relu_backward_element(dy[i], x[i]);
  }
}

// SwiGLU over n = rows · F outputs, element i = (row i / F, column i % F) of h (rows, 2F) = [a |
// b], with the CPU core's arithmetic (kernel_math::silu_element, swiglu_gate_slope): the same bits.
template <class T>
__global__ void __launch_bounds__(kElementThreads)
    swiglu_forward_kernel(T* y, const T* h, std::size_t n, std::size_t F) {
  for (std::size_t i = global_thread(); i < n; i += grid_threads()) {
    const std::size_t a = i / F * 2 * F + i % F;
    y[i] = cm::silu_element(h[a]) * h[a + F];
  }
}

template <class T>
__global__ void __launch_bounds__(kElementThreads)
    swiglu_backward_kernel(T* dh, const T* dy, const T* h, std::size_t n, std::size_t F) {
  for (std::size_t i = global_thread(); i < n; i += grid_threads()) {
    const std::size_t a = i / F * 2 * F + i % F;
    dh[a] = dy[i] * h[a + F] * cm::swiglu_gate_slope(h[a]);
    dh[a + F] = dy[i] * cm::silu_element(h[a]);
  }
}

// Softcapping, with the CPU core's arithmetic (kernel_math::softcap_element, softcap_slope).
template <class T>
__global__ void __launch_bounds__(kElementThreads)
    softcap_forward_kernel(T* y, const T* x, std::size_t n, T cap) {
  for (std::size_t i = global_thread(); i < n; i += grid_threads())
    y[i] = cm::softcap_element(x[i], cap);
}

template <class T>
__global__ void __launch_bounds__(kElementThreads)
    softcap_backward_kernel(T* dx, const T* dy, const T* y, std::size_t n, T cap) {
  for (std::size_t i = global_thread(); i < n; i += grid_threads())
    dx[i] = dy[i] * cm::softcap_slope(y[i], cap);
}

// y = x ⊙ M / (1 − p), M from (key, stream): attention::element_dropout_factor per element.
template <class T>
__global__ void __launch_bounds__(kElementThreads)
    dropout_kernel(T* y, const T* x, std::size_t n, double p, std::uint64_t key,
                   std::uint32_t stream) {
  for (std::size_t i = global_thread(); i < n; i += grid_threads()) {
    y[i] = x[i] * attention::element_dropout_factor<T>(key, p, stream, i);
  }
}

// y[r, c] += b[c] over rows × C values.
template <class T>
__global__ void __launch_bounds__(kElementThreads)
    add_bias_kernel(T* y, const T* b, std::size_t rows, std::size_t C) {
  for (std::size_t i = global_thread(); i < rows * C; i += grid_threads()) y[i] += b[i % C];
}

// db[c] = Σ_r dy[r, c], one thread per column.
template <class T>
__global__ void __launch_bounds__(kElementThreads)
    column_sum_kernel(T* db, const T* dy, std::size_t rows, std::size_t C) {
  const std::size_t c = global_thread();
  if (c >= C) return;
  T acc = 0;
  for (std::size_t r = 0; r < rows; ++r) acc += dy[r * C + c];
  db[c] = acc;
}

// y = a + b over n values (y may alias a or b).
template <class T>
__global__ void __launch_bounds__(kElementThreads)
    add_kernel(T* y, const T* a, const T* b, std::size_t n) {
  for (std::size_t i = global_thread(); i < n; i += grid_threads()) y[i] = a[i] + b[i];
}

// y = x rounded to bfloat16 (to nearest, ties to even) over n values: the operands of bf16 GEMMs
// and of the tensor-core attention.
template <class T>
__global__ void __launch_bounds__(kElementThreads)
    to_bf16_kernel(attnlab_bf16* y, const T* x, std::size_t n) {
  for (std::size_t i = global_thread(); i < n; i += grid_threads()) {
    y[i] = attnlab_float_to_bf16(static_cast<float>(x[i]));
  }
}

// x *= factor over n values (the factor passed by value, from the host).
template <class T>
__global__ void __launch_bounds__(kElementThreads)
    scale_by_value_kernel(T* x, T factor, std::size_t n) {
  for (std::size_t i = global_thread(); i < n; i += grid_threads()) x[i] *= factor;
}

// y = exp(x) over n values.
template <class T>
__global__ void __launch_bounds__(kElementThreads) exp_kernel(T* y, const T* x, std::size_t n) {
  for (std::size_t i = global_thread(); i < n; i += grid_threads()) y[i] = cm::exp_of(x[i]);
}

// ---- heads: (B, T, H·D) <-> (B, H, T, D), one thread per element of the output ----------------

// out (B,H,T,D) from x (B,T,H·D); `to_heads` false is the inverse, out (B,T,H·D) from x (B,H,T,D).
template <class T>
__global__ void __launch_bounds__(kElementThreads)
    permute_heads_kernel(T* out, const T* x, std::size_t B, std::size_t Tn, std::size_t H,
                         std::size_t D, bool to_heads) {
  const std::size_t n = B * Tn * H * D;
  for (std::size_t i = global_thread(); i < n; i += grid_threads()) {
    // i as (b, t, h, d) of the (B,T,H·D) layout
    const std::size_t d = i % D, h = (i / D) % H, t = (i / (D * H)) % Tn, b = i / (D * H * Tn);
    const std::size_t heads = cm::bhrc_offset(b * H + h, t, d, Tn, D);  // (b, h, t, d)
    if (to_heads) {
      out[heads] = x[i];
    } else {
      out[i] = x[heads];
    }
  }
}

// out[h] = Σ_b Σ_i a[b, h, i] · c[b, h, i] for a, c (B, H, n): one block per head; each thread
// sums its strided share of every b in order, then one block reduction.
template <class T>
__global__ void __launch_bounds__(kRowThreads)
    head_dot_kernel(T* out, const T* a, const T* c, std::size_t B, std::size_t H, std::size_t n) {
  ATTNLAB_STATIC_SHARED(T, scratch, 32);
  const std::size_t h = blockIdx.x;
  T acc = 0;
  for (std::size_t b = 0; b < B; ++b) {
    const std::size_t base = (b * H + h) * n;
    for (std::size_t i = threadIdx.x; i < n; i += blockDim.x) acc += a[base + i] * c[base + i];
  }
  acc = detail::block_sum(acc, scratch);
  if (threadIdx.x == 0) out[h] = acc;
}

}  // namespace attnlab::cuda::kernels
