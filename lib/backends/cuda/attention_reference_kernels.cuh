// Kernels of the reference GPU attention (launch glue: kernel_device_ops.hpp): the two row kernels
// that sit between the cuBLAS GEMMs. Device code only: compiled by nvcc, and on the CPU under the
// emulator of tests/backends/test_cuda_emulated.cpp (device_compat.cuh).
#pragma once

#include <cstddef>

#include "attnlab/attention/dropout.hpp"
#include "attnlab/attention/params.hpp"
#include "attnlab/attention/score_rule.hpp"
#include "attnlab/kernel_math.hpp"
#include "device_compat.cuh"
#include "reduce.cuh"

namespace attnlab::cuda::reference {

namespace cm = kernel_math;
constexpr int kRowThreads = 256;

// One block per row (bh, i) of S (B,H,Tq,Tk), the unscaled dots Q Kᵀ: P = softmax of the score
// rule's S = s_h · Q Kᵀ over the visible keys, in place. Writes every element: 0 at hidden
// positions and in rows with no visible key.
template <class T>
__global__ void __launch_bounds__(kRowThreads)
    masked_softmax_rows(T* scores, AttentionParams<T> a) {
  ATTNLAB_STATIC_SHARED(T, max_scratch, 32);
  ATTNLAB_STATIC_SHARED(T, sum_scratch, 32);
  const std::size_t row = blockIdx.x, bh = row / a.Tq, i = row % a.Tq;
  const std::size_t b = cm::batch_of(bh, a.H), h = cm::head_of(bh, a.H);
  const T s = a.scale[h];
  T* x = scores + row * a.Tk;
  cm::OnlineSoftmax<T> state;
  for (std::size_t j = threadIdx.x; j < a.Tk; j += blockDim.x) {
    state.add(attention::score(a, b, h, i, j, s, x[j]));
  }
  state = detail::block_merge(state, max_scratch, sum_scratch);
  const T inverse_sum = state.inverse_sum();
  for (std::size_t j = threadIdx.x; j < a.Tk; j += blockDim.x) {
    // exp_shifted gives 0 for a hidden score (-inf)
    x[j] = cm::exp_shifted(attention::score(a, b, h, i, j, s, x[j]), state.max) * inverse_sum;
  }
}

// One block per row (bh, i) of x (B,H,Tq,Tk): y = x ⊙ M / (1 − p), the call's attention dropout
// (attnlab/attention/dropout.hpp). y may be x.
template <class T>
__global__ void __launch_bounds__(kRowThreads)
    dropout_rows(T* y, const T* x, AttentionParams<T> a) {
  const std::size_t row = blockIdx.x, bh = row / a.Tq, i = row % a.Tq;
  for (std::size_t j = threadIdx.x; j < a.Tk; j += blockDim.x) {
    y[row * a.Tk + j] = x[row * a.Tk + j] * attention::attention_dropout_factor<T>(a, bh, i, j);
  }
}

// One block per row: s_h · dS, with dS = P ⊙ (dP − rowsum(dP ⊙ P)), in place over dP; dS itself
// (the bias gradient) to dscores (B,H,Tq,Tk) too when it is not null. With a softcap (a.softcap >
// 0), dots (B,H,Tq,Tk) are the unscaled Q Kᵀ and the result is s_h · dS ⊙ (1 − tanh²(u/c)) at
// u = s_h · q·k (the score rule's capped_slope); dots is not read without one.
template <class T>
__global__ void __launch_bounds__(kRowThreads)
    softmax_backward_rows(T* dp, T* dscores, const T* p, const T* dots, AttentionParams<T> a) {
  ATTNLAB_STATIC_SHARED(T, scratch, 32);
  const std::size_t row = blockIdx.x, Tk = a.Tk;
  const T s = a.scale[cm::head_of(row / a.Tq, a.H)];
  T* g = dp + row * Tk;
  const T* w = p + row * Tk;
  T dot = 0;
  for (std::size_t j = threadIdx.x; j < Tk; j += blockDim.x) dot += g[j] * w[j];
  dot = detail::block_sum(dot, scratch);
  T* d = dscores == nullptr ? nullptr : dscores + row * Tk;
  for (std::size_t j = threadIdx.x; j < Tk; j += blockDim.x) {
    const T ds = cm::softmax_backward_element(w[j], g[j], dot);
    if (d != nullptr) d[j] = ds;
    g[j] = a.softcap == 0
               ? s * ds
               : s * ds * attention::capped_slope(a, attention::capped(a, s * dots[row * Tk + j]));
  }
}

}  // namespace attnlab::cuda::reference
