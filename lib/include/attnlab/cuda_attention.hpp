// Scaled dot-product attention on the GPU, on raw device pointers: the launchers behind
// attnlab/ops/attention_cuda.hpp, public for benchmarks and for device-resident models. No CUDA
// type appears here; without the CUDA backend every function throws CudaError.
//
// The contract is the CPU op's (attnlab/ops/attention.hpp): S = s_h · Q Kᵀ, P = softmax(S) over the
// visible keys, O = P V. Every launcher takes the one parameter struct of all attention paths,
// AttentionParams (attnlab/attention/params.hpp: sizes, q, k, v, per-head scales, causal with a
// query offset, the key mask with nonzero = may attend), checks it with check_attention_params
// (std::invalid_argument for a variant not supported yet), and applies its score rule
// (attnlab/attention/score_rule.hpp). A row with no visible key gives P = 0, O = 0 and zero
// gradients. Every output element is assigned (masked regions included), so outputs may start as
// uninitialised memory; with AttentionParams::dscores set, the backward also writes dS there (the
// bias gradient; zero it first: the fused path skips hidden tiles). All pointers are device
// pointers to contiguous row-major tensors. Launches are asynchronous on the default stream; T =
// float or double.
#pragma once

#include <cstddef>

#include "attnlab/attention/params.hpp"

namespace attnlab::cuda {

// ---- Reference path: cuBLAS strided-batched GEMMs around row kernels -------------------------

// Assigns out (B,H,Tq,Dv) and p (B,H,Tq,Tk), the attention weights (0 at hidden positions).
//   S = Q Kᵀ (GEMM) -> P = softmax(s_h · S, masked) in place -> O = P V (GEMM)
template <class T>
void sdpa_reference_forward(T* out, T* p, const AttentionParams<T>& args);

// Assigns dq (B,H,Tq,D), dk (B,H,Tk,D), dv (B,H,Tk,Dv); ds (B,H,Tq,Tk) is scratch.
// dout (B,H,Tq,Dv) is dL/dO; p the forward's weights.
//   dV = Pᵀ dO, dP = dO Vᵀ, dS = s_h · P ⊙ (dP − rowsum(dP ⊙ P)), dQ = dS K, dK = dSᵀ Q
template <class T>
void sdpa_reference_backward(T* dq, T* dk, T* dv, T* ds, const T* dout, const T* p,
                             const AttentionParams<T>& args);

// ---- Fused path: tiled online softmax (FlashAttention-2 style) ------------------------------

// Assigns out (B,H,Tq,Dv) and lse (B,H,Tq), each row's log Σ exp(s_h · q·k) over visible keys
// (-inf for a row with no visible key). No (Tq, Tk) matrix is stored.
template <class T>
void sdpa_fused_forward(T* out, T* lse, const AttentionParams<T>& args);

// Assigns dq, dk, dv as the reference backward does; row_dot (B,H,Tq) is scratch for
// D = rowsum(dO ⊙ O). P is recomputed from lse. One pass per key tile writes dK and dV, a second
// per query tile writes dQ: each element has one writer, so results are deterministic.
template <class T>
void sdpa_fused_backward(T* dq, T* dk, T* dv, T* row_dot, const T* dout, const T* out, const T* lse,
                         const AttentionParams<T>& args);

// Throws std::invalid_argument when the fused kernels cannot hold the tiles of head dims D, Dv in
// shared memory on the current device (the reference path has no such limit). Returns the rows per
// tile that will be used (64 or 16).
template <class T>
int sdpa_fused_tile_rows(std::size_t D, std::size_t Dv);

}  // namespace attnlab::cuda
