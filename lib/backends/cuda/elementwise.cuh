// Kernels of the training step (launch glue: kernel_device_ops.hpp; contracts:
// attnlab/device_ops.hpp). Device code only: compiled by nvcc, and on the CPU under the emulator of
// tests/backends/test_cuda_emulated.cpp.
//
// Row kernels use one block of kRowThreads per row and deterministic block reductions; column
// reductions (dγ, dβ, db, the embedding backward) use one thread per output element looping over
// rows in order; elementwise kernels use a grid-stride loop.
#pragma once

#include <cstddef>

#include "attnlab/attention/dropout.hpp"
#include "attnlab/kernel_math.hpp"
#include "device_compat.cuh"
#include "kernels/gelu.hpp"
#include "kernels/norms.hpp"
#include "kernels/optimizers.hpp"
#include "kernels/relu.hpp"
#include "kernels/rope.hpp"
#include "kernels/swiglu.hpp"
#include "reduce.cuh"

namespace attnlab::cuda::train {

namespace cm = kernel_math;

constexpr int kRowThreads = 256;
constexpr int kElementThreads = 256;
constexpr unsigned kMaxElementBlocks = 1024;
constexpr unsigned kSumBlocks = 256;  // partial sums of sum_of_squares on the GPU

// Blocks of an elementwise (grid-stride) launch over n values: one per kElementThreads values, at
// most max_blocks (the runtime's kMaxStrideBlocks).
inline unsigned element_blocks(std::size_t n, unsigned max_blocks = kMaxElementBlocks) {
  const std::size_t blocks = cm::tile_count(n, kElementThreads);
  return static_cast<unsigned>(blocks < max_blocks ? (blocks > 0 ? blocks : 1) : max_blocks);
}

__device__ inline std::size_t global_thread() {
  return static_cast<std::size_t>(blockIdx.x) * blockDim.x + threadIdx.x;
}
__device__ inline std::size_t grid_threads() {
  return static_cast<std::size_t>(gridDim.x) * blockDim.x;
}

// ---- embedding: one block per position (forward), one block per vocabulary row (backward) ----

template <class T>
__global__ void __launch_bounds__(kRowThreads)
    embedding_forward_kernel(T* y, const int* ids, const T* table, std::size_t C) {
  const std::size_t r = blockIdx.x;
  const int id = ids[r];
  for (std::size_t c = threadIdx.x; c < C; c += blockDim.x) {
    y[r * C + c] = id < 0 ? T(0) : table[static_cast<std::size_t>(id) * C + c];
  }
}

template <class T>
__global__ void __launch_bounds__(kRowThreads)
    embedding_backward_kernel(T* dtable, const T* dy, const int* ids, std::size_t rows,
                              std::size_t C) {
  const std::size_t v = blockIdx.x;
  for (std::size_t c = threadIdx.x; c < C; c += blockDim.x) {
    T acc = 0;
    for (std::size_t r = 0; r < rows; ++r) {
      if (ids[r] == static_cast<int>(v)) acc += dy[r * C + c];
    }
    dtable[v * C + c] = acc;
  }
}

// ---- LayerNorm / RMSNorm: one block per row ---------------------------------------------------

template <class T>
__global__ void __launch_bounds__(kRowThreads)
    layernorm_forward_kernel(T* y, T* mean_out, T* rstd_out, const T* x, const T* gamma,
                             const T* beta, std::size_t C, T eps) {
  ATTNLAB_STATIC_SHARED(T, scratch, 32);
  const std::size_t r = blockIdx.x;
  const T* xr = x + r * C;
  T sum = 0;
  for (std::size_t c = threadIdx.x; c < C; c += blockDim.x) sum += xr[c];
  const T mean = detail::block_sum(sum, scratch) / T(C);
  T sq = 0;  // two passes: the biased variance of the centred values, as the CPU op
  for (std::size_t c = threadIdx.x; c < C; c += blockDim.x) sq += (xr[c] - mean) * (xr[c] - mean);
  const T rstd = T(1) / cm::sqrt_of(detail::block_sum(sq, scratch) / T(C) + eps);
  for (std::size_t c = threadIdx.x; c < C; c += blockDim.x) {
    y[r * C + c] = gamma[c] * ((xr[c] - mean) * rstd) + (beta ? beta[c] : T(0));
  }
  if (threadIdx.x == 0) {
    mean_out[r] = mean;
    rstd_out[r] = rstd;
  }
}

// dx of one row for LayerNorm (centred) or RMSNorm (mean = null: x̂ = x · rstd, no mean(g) term).
template <class T>
__global__ void __launch_bounds__(kRowThreads)
    norm_backward_rows_kernel(T* dx, const T* dy, const T* x, const T* mean, const T* rstd,
                              const T* gamma, std::size_t C) {
  ATTNLAB_STATIC_SHARED(T, scratch, 32);
  const std::size_t r = blockIdx.x;
  const T mu = mean ? mean[r] : T(0), s = rstd[r];
  T sum_g = 0, sum_gh = 0;
  for (std::size_t c = threadIdx.x; c < C; c += blockDim.x) {
    const T g = dy[r * C + c] * gamma[c];
    sum_g += g;
    sum_gh += g * ((x[r * C + c] - mu) * s);
  }
  const T mean_g = mean ? detail::block_sum(sum_g, scratch) / T(C) : T(0);
  const T mean_gh = detail::block_sum(sum_gh, scratch) / T(C);
  for (std::size_t c = threadIdx.x; c < C; c += blockDim.x) {
    const T g = dy[r * C + c] * gamma[c];
    dx[r * C + c] = cm::norm_backward_element(g, (x[r * C + c] - mu) * s, s, mean_g, mean_gh);
  }
}

// dγ[c] = Σ_r dy ⊙ x̂ and, when dbeta is not null, dβ[c] = Σ_r dy: one thread per column.
template <class T>
__global__ void __launch_bounds__(kElementThreads)
    norm_backward_columns_kernel(T* dgamma, T* dbeta, const T* dy, const T* x, const T* mean,
                                 const T* rstd, std::size_t rows, std::size_t C) {
  const std::size_t c = global_thread();
  if (c >= C) return;
  T dg = 0, db = 0;
  for (std::size_t r = 0; r < rows; ++r) {
    const T g = dy[r * C + c];
    dg += g * ((x[r * C + c] - (mean ? mean[r] : T(0))) * rstd[r]);
    db += g;
  }
  dgamma[c] = dg;
  if (dbeta) dbeta[c] = db;
}

template <class T>
__global__ void __launch_bounds__(kRowThreads)
    rmsnorm_forward_kernel(T* y, T* rstd_out, const T* x, const T* gamma, std::size_t C, T eps) {
  ATTNLAB_STATIC_SHARED(T, scratch, 32);
  const std::size_t r = blockIdx.x;
  const T* xr = x + r * C;
  T sq = 0;
  for (std::size_t c = threadIdx.x; c < C; c += blockDim.x) sq += xr[c] * xr[c];
  const T rstd = T(1) / cm::sqrt_of(detail::block_sum(sq, scratch) / T(C) + eps);
  for (std::size_t c = threadIdx.x; c < C; c += blockDim.x)
    y[r * C + c] = gamma[c] * (xr[c] * rstd);
  if (threadIdx.x == 0) rstd_out[r] = rstd;
}

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

template <class T>
__global__ void __launch_bounds__(kElementThreads)
    relu_forward_kernel(T* y, const T* x, std::size_t n) {
  for (std::size_t i = global_thread(); i < n; i += grid_threads()) y[i] = cm::relu_element(x[i]);
}

template <class T>
__global__ void __launch_bounds__(kElementThreads)
    relu_backward_kernel(T* dx, const T* dy, const T* x, std::size_t n) {
  for (std::size_t i = global_thread(); i < n; i += grid_threads())
    dx[i] = cm::relu_backward_element(dy[i], x[i]);
}

// ReLU², with the CPU core's arithmetic (kernel_math::relu_squared_element): the same bits.
template <class T>
__global__ void __launch_bounds__(kElementThreads)
    relu_squared_forward_kernel(T* y, const T* x, std::size_t n) {
  for (std::size_t i = global_thread(); i < n; i += grid_threads())
    y[i] = cm::relu_squared_element(x[i]);
}

template <class T>
__global__ void __launch_bounds__(kElementThreads)
    relu_squared_backward_kernel(T* dx, const T* dy, const T* x, std::size_t n) {
  for (std::size_t i = global_thread(); i < n; i += grid_threads())
    dx[i] = cm::relu_squared_backward_element(dy[i], x[i]);
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

// Rotary positions in place, one pair per thread (kernel_math::rope_element, the CPU core's).
template <class T>
__global__ void __launch_bounds__(kElementThreads)
    rope_kernel(T* x, const T* cos, const T* sin, cm::RopeShape shape, std::size_t pairs) {
  for (std::size_t i = global_thread(); i < pairs; i += grid_threads())
    cm::rope_element(x, cos, sin, shape, i);
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

// ---- optimizers --------------------------------------------------------------------------------

// One SGD step over n values; buf is null when momentum is 0.
template <class T>
__global__ void __launch_bounds__(kElementThreads)
    sgd_kernel(T* param, T* buf, const T* grad, std::size_t n, T lr, T momentum, T weight_decay,
               bool first_step) {
  for (std::size_t i = global_thread(); i < n; i += grid_threads()) {
    cm::sgd_element(param[i], buf ? buf + i : static_cast<T*>(nullptr), grad[i], lr, momentum,
                    weight_decay, first_step);
  }
}

template <class T>
__global__ void __launch_bounds__(kElementThreads)
    adamw_kernel(T* param, T* m, T* v, const T* grad, std::size_t n, cm::AdamWScalars<T> s) {
  for (std::size_t i = global_thread(); i < n; i += grid_threads()) {
    cm::adamw_element(param[i], m[i], v[i], grad[i], s);
  }
}

// ---- Muon ---------------------------------------------------------------------------------------

template <class T>
__global__ void __launch_bounds__(kElementThreads)
    muon_momentum_kernel(T* u, T* m, const T* g, std::size_t n, T beta, T one_minus_beta,
                         bool nesterov) {
  for (std::size_t i = global_thread(); i < n; i += grid_threads())
    u[i] = cm::muon_momentum_element(m[i], g[i], beta, one_minus_beta, nesterov);
}

// x /= (√s + eps), s the device double sum_of_squares wrote.
template <class T>
__global__ void __launch_bounds__(kElementThreads)
    divide_by_norm_kernel(T* x, const double* sum_of_squares, std::size_t n, T eps) {
  const T denom = static_cast<T>(cm::sqrt_of(*sum_of_squares)) + eps;
  for (std::size_t i = global_thread(); i < n; i += grid_threads()) x[i] = x[i] / denom;
}

template <class T>
__global__ void __launch_bounds__(kElementThreads)
    axpby_kernel(T* y, const T* x, std::size_t n, T a, T b) {
  for (std::size_t i = global_thread(); i < n; i += grid_threads()) y[i] = y[i] * a + b * x[i];
}

// ---- softmax cross-entropy ----------------------------------------------------------------------

// One block per row: row_loss[r] = −log softmax(x)[target], row_loss[rows + r] = z · log Z² (log Z
// = logsumexp(x)) and dlogits = softmax · (1 + 2 z log Z) − onehot on labelled rows (0, 0 and 0
// elsewhere); the 1/n scaling follows in scale_kernel.
template <class T>
__global__ void __launch_bounds__(kRowThreads)
    cross_entropy_rows_kernel(T* row_loss, T* dlogits, const T* logits, const int* targets,
                              std::size_t rows, std::size_t V, int ignore_index, T z_loss) {
  ATTNLAB_STATIC_SHARED(T, max_scratch, 32);
  ATTNLAB_STATIC_SHARED(T, sum_scratch, 32);
  const std::size_t r = blockIdx.x;
  const int target = targets[r];
  const bool labelled =
      target != ignore_index && target >= 0 && static_cast<std::size_t>(target) < V;
  const T* x = logits + r * V;
  T* g = dlogits + r * V;
  if (!labelled) {  // uniform across the block: every thread takes this branch or none does
    for (std::size_t j = threadIdx.x; j < V; j += blockDim.x) g[j] = T(0);
    if (threadIdx.x == 0) {
      row_loss[r] = T(0);
      row_loss[rows + r] = T(0);
    }
    return;
  }
  cm::OnlineSoftmax<T> state;
  for (std::size_t j = threadIdx.x; j < V; j += blockDim.x) state.add(x[j]);
  state = detail::block_merge(state, max_scratch, sum_scratch);
  const T log_sum = cm::log_of(state.sum);  // log Σ exp(x − max)
  const T log_z = state.max + log_sum;
  const T p_scale = T(1) + T(2) * z_loss * log_z;  // d(z log Z²)/dx = 2 z log Z · p; 1 when z = 0
  for (std::size_t j = threadIdx.x; j < V; j += blockDim.x) {
    const T p = cm::exp_of(x[j] - state.max - log_sum);
    g[j] = p * p_scale - (j == static_cast<std::size_t>(target) ? T(1) : T(0));
  }
  // −log p[target] = −((x_t − max) − log Σ)
  if (threadIdx.x == 0) {
    row_loss[r] = -((x[target] - state.max) - log_sum);
    row_loss[rows + r] = z_loss * log_z * log_z;
  }
}

// One block: n = #labelled rows; loss[0] = Σ row_loss[r] / n, loss[1] = Σ row_loss[rows + r] / n
// and inv_n[0] = 1 / n (all 0 when n = 0).
template <class T>
__global__ void __launch_bounds__(kRowThreads)
    cross_entropy_mean_kernel(T* loss, T* inv_n, const T* row_loss, const int* targets,
                              std::size_t rows, std::size_t V, int ignore_index) {
  ATTNLAB_STATIC_SHARED(T, scratch, 32);
  T sum = 0, sum_z = 0, count = 0;
  for (std::size_t r = threadIdx.x; r < rows; r += blockDim.x) {
    const int t = targets[r];
    if (t != ignore_index && t >= 0 && static_cast<std::size_t>(t) < V) {
      sum += row_loss[r];
      sum_z += row_loss[rows + r];
      count += T(1);
    }
  }
  sum = detail::block_sum(sum, scratch);
  sum_z = detail::block_sum(sum_z, scratch);
  count = detail::block_sum(count, scratch);
  if (threadIdx.x == 0) {
    loss[0] = count > T(0) ? sum / count : T(0);
    loss[1] = count > T(0) ? sum_z / count : T(0);
    inv_n[0] = count > T(0) ? T(1) / count : T(0);
  }
}

// x[i] *= factor[0] over n values.
template <class T>
__global__ void __launch_bounds__(kElementThreads)
    scale_kernel(T* x, const T* factor, std::size_t n) {
  const T f = factor[0];
  for (std::size_t i = global_thread(); i < n; i += grid_threads()) x[i] *= f;
}

// ---- Σ x², in double ---------------------------------------------------------------------------

// partial[block] = Σ x² over the block's grid-stride share (kSumBlocks blocks).
template <class T>
__global__ void __launch_bounds__(kElementThreads)
    sum_of_squares_partial_kernel(double* partial, const T* x, std::size_t n) {
  ATTNLAB_STATIC_SHARED(double, scratch, 32);
  double acc = 0;
  for (std::size_t i = global_thread(); i < n; i += grid_threads()) {
    acc += static_cast<double>(x[i]) * static_cast<double>(x[i]);
  }
  acc = detail::block_sum(acc, scratch);
  if (threadIdx.x == 0) partial[blockIdx.x] = acc;
}

// out[0] = Σ partial, one block (a template only so that this header defines no plain function).
template <class T>
__global__ void __launch_bounds__(kElementThreads)
    sum_partials_kernel(T* out, const T* partial, std::size_t count) {
  ATTNLAB_STATIC_SHARED(T, scratch, 32);
  T acc = 0;
  for (std::size_t i = threadIdx.x; i < count; i += blockDim.x) acc += partial[i];
  acc = detail::block_sum(acc, scratch);
  if (threadIdx.x == 0) out[0] = acc;
}

}  // namespace attnlab::cuda::train
