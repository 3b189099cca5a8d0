// Private to lib/src/ops: the fused (flash-style) SDPA kernels behind sdpa_forward/sdpa_backward.
// The public entry points check shapes and fill the cache's dims, scales and mask; these assume it.
#pragma once

#include "attnlab/ops/attention.hpp"

namespace attnlab::detail {

// Row and key tile sizes of the fused path (tuned on 2-core AVX-512 Xeons: tests/bench).
inline constexpr std::size_t kFusedRowBlock = 64;
inline constexpr std::size_t kFusedKeyBlock = 256;

// out: (B,H,Tq,Dv), assigned. Fills cache.out (a copy of O) and cache.lse (B,H,Tq).
// cache.B.., scale, causal and key_mask must already describe q, k, v.
template <class T>
void sdpa_fused_forward(Tensor4<T>& out, SdpaCache<T>& cache, const Tensor4<T>& q,
                        const Tensor4<T>& k, const Tensor4<T>& v);

// Assigns g.dq, g.dk, g.dv (preallocated to the right shapes) and the per-slice dL/ds_h parts
// dscale_part (B·H) from cache.out and cache.lse, recomputing P block by block.
template <class T>
void sdpa_fused_backward(SdpaGrads<T>& g, std::vector<T>& dscale_part, const Tensor4<T>& dout,
                         const SdpaCache<T>& cache, const Tensor4<T>& q, const Tensor4<T>& k,
                         const Tensor4<T>& v);

}  // namespace attnlab::detail
