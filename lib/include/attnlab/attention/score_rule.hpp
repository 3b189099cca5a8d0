// The score rule of attention: the one definition of which keys a query sees and of the score the
// softmax gets, called by all four paths (CPU reference and fused in lib/src/ops, CUDA reference
// and fused in lib/backends/cuda). __host__ __device__ under nvcc, plain inline C++ otherwise.
//
//   visible(b, i, j) = key_mask(b, j) && (!causal || j <= i + o) && (!w || j > i + o - w)
//   u_ij = s_h · q_i·k_j                                  the scaled dot
//   S_ij = cap(u_ij) [- m_h · (i + o - j) with ALiBi] [+ bias(b,h,i,j)] when visible, -inf
//          (excluded from the softmax) otherwise
//   cap(u) = c · tanh(u / c) with a softcap c > 0 (Gemma 2), u without
//
// with o the query offset and w the sliding window (causal only: query i sees its w latest keys,
// itself included). The order is FlashAttention's (flash_fwd_kernel: apply_softcap, then the
// mask's ALiBi): the cap bounds the content term s_h · q·k alone, so ALiBi's distance penalty, a
// bias and the mask keep their full size. The backward's dS (the gradient of S, hence of a bias)
// becomes the gradient of u by the cap's slope 1 − (cap(u) / c)² (softcap_slope), before dQ, dK
// and ds_h. A variant changes these helpers only: the softcap, ALiBi and the additive bias add
// their terms in score_of_capped(), score_of_scaled() and score_row(), grouped-query attention
// maps heads with kv_head_of (params.hpp). The tile bounds (key_begin, key_end, query_begin,
// query_end) let the fused paths skip whole tiles that the rule hides.
#pragma once

#include <algorithm>
#include <cstddef>

#include "attnlab/attention/params.hpp"
#include "attnlab/kernel_math.hpp"

namespace attnlab::attention {

// Whether query i of batch b may attend to key j (in range: i < Tq, j < Tk).
template <class T>
ATTNLAB_HD inline bool key_visible(const AttentionParams<T>& p, std::size_t b, std::size_t i,
                                   std::size_t j) {
  if (p.key_mask != nullptr && p.key_mask[kernel_math::key_mask_offset(b, j, p.Tk)] == 0) {
    return false;
  }
  if (!p.causal) return true;
  return j <= i + p.query_offset && (p.window == 0 || j + p.window > i + p.query_offset);
}

// The first key that query i may see, whatever the mask: i + o + 1 - w with a window (0 if that is
// negative), else 0. Keys before it are hidden from query i, and from every earlier query.
ATTNLAB_HD inline std::size_t key_begin(const AttentionSpec& s, std::size_t i) {
  if (!s.causal || s.window == 0 || i + s.query_offset + 1 <= s.window) return 0;
  return i + s.query_offset + 1 - s.window;
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

// One past the last query that may see key j, whatever the mask: j + w - o with a window (clamped
// to [0, Tq]), else Tq. Later queries never see key j, nor any earlier key.
ATTNLAB_HD inline std::size_t query_end(const AttentionSpec& s, std::size_t j) {
  if (!s.causal || s.window == 0) return s.Tq;
  if (j + s.window <= s.query_offset) return 0;
  const std::size_t end = j + s.window - s.query_offset;
  return end < s.Tq ? end : s.Tq;
}

// ALiBi's term for query i, key j of head h: -m_h · (i + o - j) (0 without ALiBi).
template <class T>
ATTNLAB_HD inline T alibi_term(const AttentionParams<T>& p, std::size_t h, std::size_t i,
                               std::size_t j) {
  if (p.alibi_slopes == nullptr) return T(0);
  return p.alibi_slopes[h] * (static_cast<T>(j) - static_cast<T>(i + p.query_offset));
}

// The additive bias of query i, key j of batch b, head h (0 without a bias).
template <class T>
ATTNLAB_HD inline T bias_term(const AttentionParams<T>& p, std::size_t b, std::size_t h,
                              std::size_t i, std::size_t j) {
  if (p.bias == nullptr) return T(0);
  return p.bias[b * p.bias_batch_stride + h * p.bias_head_stride + i * p.Tk + j];
}

// The softcap of a scaled dot u: c · tanh(u / c) with p.softcap = c > 0, u itself without.
template <class T>
ATTNLAB_HD inline T capped(const AttentionSpec& p, T scaled_dot) {
  if (p.softcap == 0) return scaled_dot;
  return kernel_math::softcap_element(scaled_dot, static_cast<T>(p.softcap));
}

// The cap's slope d cap(u) / du = 1 − (cap(u) / c)², from the capped value; 1 without a cap.
template <class T>
ATTNLAB_HD inline T capped_slope(const AttentionSpec& p, T capped_dot) {
  if (p.softcap == 0) return T(1);
  return kernel_math::softcap_slope(capped_dot, static_cast<T>(p.softcap));
}

// The score the softmax sees for query i and key j of batch b, head h, from the capped dot
// capped_dot = cap(s_h · q_i·k_j): itself plus ALiBi's term and the bias when key j is visible
// to query i, -inf when hidden. A NaN at a visible key stays NaN.
template <class T>
ATTNLAB_HD inline T score_of_capped(const AttentionParams<T>& p, std::size_t b, std::size_t h,
                                    std::size_t i, std::size_t j, T capped_dot) {
  if (!key_visible(p, b, i, j)) return kernel_math::negative_infinity<T>();
  if (p.alibi_slopes != nullptr) capped_dot += alibi_term(p, h, i, j);
  if (p.bias != nullptr) capped_dot += bias_term(p, b, h, i, j);
  return capped_dot;
}

// The same from the scaled dot scaled_dot = s_h · q_i·k_j (the cap applied first).
template <class T>
ATTNLAB_HD inline T score_of_scaled(const AttentionParams<T>& p, std::size_t b, std::size_t h,
                                    std::size_t i, std::size_t j, T scaled_dot) {
  return score_of_capped(p, b, h, i, j, capped(p, scaled_dot));
}

// The same from dot = q_i·k_j and scale = s_h (p.scale[h], passed in so that a kernel loads it
// once): S_ij = s_h · dot, or -inf.
template <class T>
ATTNLAB_HD inline T score(const AttentionParams<T>& p, std::size_t b, std::size_t h, std::size_t i,
                          std::size_t j, T scale, T dot) {
  return score_of_scaled(p, b, h, i, j, scale * dot);
}

// capped() over n scaled dots in place; with slope != nullptr, capped_slope() of each to slope
// (which may be row: the slope then replaces the capped dot). Every element, hidden or not.
template <class T>
inline void cap_row(const AttentionSpec& p, std::size_t n, T* row, T* slope = nullptr) {
  if (p.softcap == 0) {
    if (slope != nullptr) std::fill_n(slope, n, T(1));
    return;
  }
  const T c = static_cast<T>(p.softcap);
  for (std::size_t e = 0; e < n; ++e) {
    const T y = kernel_math::softcap_element(row[e], c);
    row[e] = y;
    if (slope != nullptr) slope[e] = kernel_math::softcap_slope(y, c);
  }
}

// score_of_capped() over n consecutive keys j0.. of query i, in place over their capped dots. The
// same numbers as score_of_capped() element by element, in loops that touch only the hidden keys
// (and, with ALiBi or a bias, the shown ones): nothing when the row hides none.
template <class T>
inline void score_row_capped(const AttentionParams<T>& p, std::size_t b, std::size_t h,
                             std::size_t i, std::size_t j0, std::size_t n, T* scaled_row) {
  const std::size_t begin = key_begin(p, i), end = key_end(p, i);
  // Columns [first, shown) of the row are keys in [begin, end); the rest are hidden.
  const std::size_t first = begin <= j0 ? 0 : (begin - j0 < n ? begin - j0 : n);
  const std::size_t shown = end <= j0 ? 0 : (end - j0 < n ? end - j0 : n);
  constexpr T hidden = kernel_math::negative_infinity<T>();
  if (p.alibi_slopes != nullptr) {
    for (std::size_t c = first; c < shown; ++c) scaled_row[c] += alibi_term(p, h, i, j0 + c);
  }
  if (p.bias != nullptr) {
    const T* bias = p.bias + b * p.bias_batch_stride + h * p.bias_head_stride + i * p.Tk + j0;
    for (std::size_t c = first; c < shown; ++c) scaled_row[c] += bias[c];
  }
  for (std::size_t c = 0; c < first; ++c) scaled_row[c] = hidden;
  if (p.key_mask != nullptr) {
    const unsigned char* mask = p.key_mask + kernel_math::key_mask_offset(b, j0, p.Tk);
    for (std::size_t c = first; c < shown; ++c) {
      if (mask[c] == 0) scaled_row[c] = hidden;
    }
  }
  for (std::size_t c = shown > first ? shown : first; c < n; ++c) scaled_row[c] = hidden;
}

// score_of_scaled() over n consecutive keys j0.. of query i, in place over their scaled dots (the
// CPU paths get s_h · Q Kᵀ of a tile from one GEMM with alpha = s_h): cap_row, then
// score_row_capped. The same numbers as score_of_scaled() element by element
// (tests/backends/test_kernel_math.cpp checks it).
template <class T>
inline void score_row(const AttentionParams<T>& p, std::size_t b, std::size_t h, std::size_t i,
                      std::size_t j0, std::size_t n, T* scaled_row) {
  cap_row(p, n, scaled_row);
  score_row_capped(p, b, h, i, j0, n, scaled_row);
}

}  // namespace attnlab::attention
