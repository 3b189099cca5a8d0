// Linear (attnlab/ops/linear.hpp): the raw-pointer cores of linear_forward / linear_backward that
// the op front (lib/src/ops/linear.cpp, where they are defined) and the CPU backend
// (lib/backends/cpu) call. Rows are cut into contiguous chunks, one per thread (the cut depends
// only on rows and num_threads()), one blas::gemm per chunk; sums over rows (dW, db) are added in
// chunk / row order, so results are deterministic for a fixed thread count. Every output is
// assigned, except dw when the caller asks for it to be added to. (A device backend runs its own
// GEMMs: the CUDA one cuBLAS.)
#pragma once

#include <cstddef>

#include "attnlab/operand_keep.hpp"

namespace attnlab::detail {

// y (rows,Out) = x (rows,In) · w (In,Out) + b (Out,); b may be null. With w_transposed, w is
// stored (Out,In) and y = x · wᵀ + b (a tied head reading the embedding table (V, C)).
// Under bf16, x and W are rounded once per call, or taken from `keep` (attnlab/operand_keep.hpp)
// when it holds them, and kept there for the calls that follow; the bits are the same either way.
template <class T>
void linear_forward_rows(T* y, const T* x, const T* w, const T* b, std::size_t rows, std::size_t in,
                         std::size_t out, bool w_transposed = false, OperandKeep* keep = nullptr);

// dx = dy wᵀ (skipped when dx is null), dw = xᵀ dy, db = Σ_rows dy (skipped when db is null).
// With w_transposed, w and dw are stored (Out,In): dx = dy w, dw = dyᵀ x. With accumulate_dw,
// dw += xᵀ dy: the first chunk's GEMM runs with β = 1 and the partials are added after it, so on a
// zeroed dw the bits equal the assigning call's.
// partial_dw holds (linear_chunks(rows) − 1) · in · out values (may be null when that is 0).
// Under bf16, x and W come from `keep` as in the forward; dy is rounded once per call.
template <class T>
void linear_backward_rows(T* dx, T* dw, T* db, const T* dy, const T* x, const T* w,
                          std::size_t rows, std::size_t in, std::size_t out, T* partial_dw,
                          bool w_transposed = false, bool accumulate_dw = false,
                          OperandKeep* keep = nullptr);

// The number of row chunks (threads) the linear kernels use for `rows` rows.
std::size_t linear_chunks(std::size_t rows);

}  // namespace attnlab::detail
