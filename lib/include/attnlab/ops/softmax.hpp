// Softmax over the last axis, forward and backward.
// Reference: torch.nn.functional.softmax(x, dim=-1) and its autograd backward.
//
// The softmax keeps no cache beyond its own output: the backward needs only P.
#pragma once

#include <cstddef>

#include "attnlab/tensor.hpp"

namespace attnlab {

// ---- Row kernels on contiguous memory (used by attention and cross-entropy) --------------------

// p[r, :] = softmax(s[r, :]) for `rows` rows of `cols` entries; assigns p (p may alias s).
// Stable: the row max is subtracted before exp. Entries equal to -inf are excluded (weight 0); a
// row whose entries are all -inf gets p = 0 everywhere rather than NaN.
template <class T>
void softmax_rows_forward(T* p, const T* s, std::size_t rows, std::size_t cols);

// ds[r, :] = p ⊙ (dp − rowsum(dp ⊙ p)): the row Jacobian diag(p) − p pᵀ applied to dp.
// Assigns ds (ds may alias dp). A row with p = 0 everywhere gets ds = 0.
template <class T>
void softmax_rows_backward(T* ds, const T* dp, const T* p, std::size_t rows, std::size_t cols);

// Sum of exp(x[i] − shift) over i, writing exp(x[i] − shift) back into x (vectorised with xsimd).
template <class T>
T exp_shifted_inplace(T* x, std::size_t n, T shift);

// ---- Tensor API ---------------------------------------------------------------------------------

// s: (..., K) -> p: (..., K), softmax over the last axis. Returns a new tensor. N in 1..4.
template <class T, std::size_t N>
Tensor<T, N> softmax_forward(const Tensor<T, N>& s);

// dp: (..., K) upstream gradient, p: (..., K) the forward's output. Returns ds (..., K).
// Throws ShapeError if the shapes differ.
template <class T, std::size_t N>
Tensor<T, N> softmax_backward(const Tensor<T, N>& dp, const Tensor<T, N>& p);

// The explicit Jacobian of one row, J = diag(p) − p pᵀ (K, K), for tests and teaching.
template <class T>
Tensor2<T> softmax_jacobian(const Tensor1<T>& p);

}  // namespace attnlab
