// The score rule of attention: the one definition of which keys a query sees and of the score the
// softmax gets, called by all four paths (CPU reference and fused in lib/src/ops, CUDA reference
// and fused in lib/cuda). __host__ __device__ under nvcc, plain inline C++ otherwise.
//
//   visible(b, i, j) = key_mask(b, j) && (!causal || j <= i + o)
//   S_ij = s_h · q_i·k_j when visible, -inf (excluded from the softmax) otherwise
//
// A variant changes these helpers only: a window adds j > i + o - w to key_visible() and its
// bounds, a bias adds its term in score_of_scaled() and score_row(), grouped-query attention maps
// heads with kv_head_of (params.hpp).
#pragma once

#include <cstddef>

#include "attnlab/attention/params.hpp"
#include "attnlab/cuda_math.hpp"

namespace attnlab::attention {

// Whether query i of batch b may attend to key j (in range: i < Tq, j < Tk).
template <class T>
ATTNLAB_HD inline bool key_visible(const AttentionParams<T>& p, std::size_t b, std::size_t i,
                                   std::size_t j) {
  if (p.key_mask != nullptr && p.key_mask[cuda_math::key_mask_offset(b, j, p.Tk)] == 0) {
    return false;
  }
  return !p.causal || j <= i + p.query_offset;
}

// One past the last key that query i may see, whatever the mask: min(i + o + 1, Tk) when causal,
// else Tk. Keys [key_end(i), Tk) are hidden from query i, and from every earlier query: a tile of
// queries ending at i skips them.
ATTNLAB_HD inline std::size_t key_end(const AttentionSpec& s, std::size_t i) {
  if (!s.causal) return s.Tk;
  const std::size_t end = i + s.query_offset + 1;
  return end < s.Tk ? end : s.Tk;
}

// The first query that may see key j, whatever the mask: j - o (0 if j <= o) when causal, else 0.
// Queries before it never see key j, nor any later key: a tile of keys starting at j skips them.
ATTNLAB_HD inline std::size_t query_begin(const AttentionSpec& s, std::size_t j) {
  if (!s.causal || j <= s.query_offset) return 0;
  return j - s.query_offset;
}

// The score the softmax sees for query i and key j of batch b, head h, from the scaled dot
// scaled_dot = s_h · q_i·k_j: itself when key j is visible to query i, -inf when hidden. A NaN at
// a visible key stays NaN.
template <class T>
ATTNLAB_HD inline T score_of_scaled(const AttentionParams<T>& p, std::size_t b, std::size_t h,
                                    std::size_t i, std::size_t j, T scaled_dot) {
  (void)h;  // read by the bias and ALiBi variants
  return key_visible(p, b, i, j) ? scaled_dot : cuda_math::negative_infinity<T>();
}

// The same from dot = q_i·k_j and scale = s_h (p.scale[h], passed in so that a kernel loads it
// once): S_ij = s_h · dot, or -inf.
template <class T>
ATTNLAB_HD inline T score(const AttentionParams<T>& p, std::size_t b, std::size_t h, std::size_t i,
                          std::size_t j, T scale, T dot) {
  return score_of_scaled(p, b, h, i, j, scale * dot);
}

// score_of_scaled() over n consecutive keys j0.. of query i, in place over their scaled dots (the
// CPU paths get s_h · Q Kᵀ of a tile from one GEMM with alpha = s_h). The same numbers as
// score_of_scaled() element by element (tests/backends/test_cuda_math.cpp checks it), in loops that
// touch only the hidden keys: nothing when the row hides none.
template <class T>
inline void score_row(const AttentionParams<T>& p, std::size_t b, std::size_t h, std::size_t i,
                      std::size_t j0, std::size_t n, T* scaled_row) {
  (void)h;
  const std::size_t end = key_end(p, i);
  const std::size_t shown = end <= j0 ? 0 : (end - j0 < n ? end - j0 : n);  // keys j0.. < end
  constexpr T hidden = cuda_math::negative_infinity<T>();
  if (p.key_mask != nullptr) {
    const unsigned char* mask = p.key_mask + cuda_math::key_mask_offset(b, j0, p.Tk);
    for (std::size_t c = 0; c < shown; ++c) {
      if (mask[c] == 0) scaled_row[c] = hidden;
    }
  }
  for (std::size_t c = shown; c < n; ++c) scaled_row[c] = hidden;
}

}  // namespace attnlab::attention
