// Attention (attnlab/ops/attention.hpp): the CPU kernels behind sdpa_forward / sdpa_backward /
// sdpa_scores, over raw pointers and the one parameter struct (attnlab/attention/params.hpp), as
// the CUDA backend's attention calls (attnlab/device_ops.hpp) are. The op's entry points
// (lib/src/ops/attention.cpp) check shapes and options once and call these, and so does the CPU
// backend (lib/backends/cpu); they are defined in lib/src/ops/attention_reference.cpp and
// attention_fused.cpp. The per-score arithmetic every path shares is attnlab/attention/ and
// attnlab/kernel_math.hpp; the CUDA kernels are lib/backends/cuda/attention_*_kernels.cuh. These
// assume valid params. Buffers are contiguous row-major; every output is assigned. dscale_part
// (B·H) receives, per (b, h) slice, dL/ds_h = ⟨dQ, Q⟩ / s_h.
#pragma once

#include <cstddef>

#include "attnlab/attention/params.hpp"

namespace attnlab::detail {

// ---- reference path (attention_reference.cpp): materialises P ----------------------------------

// scores (B,H,Tq,Tk) = S, hidden positions at -inf.
template <class T>
void sdpa_reference_scores(T* scores, const AttentionParams<T>& p);

// out (B,H,Tq,Dv) = P V; probs (B,H,Tq,Tk) = P, 0 at hidden positions and in empty rows.
template <class T>
void sdpa_reference_forward(T* out, T* probs, const AttentionParams<T>& p);

// dq (B,H,Tq,D), dk (B,Hkv,Tk,D), dv (B,Hkv,Tk,Dv) from dout (B,H,Tq,Dv) and the forward's probs.
template <class T>
void sdpa_reference_backward(T* dq, T* dk, T* dv, T* dscale_part, const T* dout, const T* probs,
                             const AttentionParams<T>& p);

// ---- fused path (attention_fused.cpp): tiles of tile_rows queries x tile_keys keys ------------

// Default row and key tile sizes of the fused path, measured on 2-core AVX-512 Xeons (tests/bench,
// sweep of Br in 32..256 x Bc in 128..512): two Br x Bc float tiles (512 KiB) stay in the 2 MiB L2,
// and gemms on 128 x 512 tiles run close to the speed of whole-matrix gemms. A tile size of 0
// passed to the kernels means these.
inline constexpr std::size_t kFusedRowBlock = 128;
inline constexpr std::size_t kFusedKeyBlock = 512;

// out (B,H,Tq,Dv) = O; lse (B,H,Tq) = log Σ_j exp(S_ij) over visible keys, -inf for a row with
// none.
template <class T>
void sdpa_fused_forward(T* out, T* lse, const AttentionParams<T>& p, std::size_t tile_rows,
                        std::size_t tile_keys);

// dq, dk, dv as the reference backward, from the forward's out and lse, recomputing P by tiles.
template <class T>
void sdpa_fused_backward(T* dq, T* dk, T* dv, T* dscale_part, const T* dout, const T* out,
                         const T* lse, const AttentionParams<T>& p, std::size_t tile_rows,
                         std::size_t tile_keys);

}  // namespace attnlab::detail
