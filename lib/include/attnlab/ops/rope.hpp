// Rotary position embedding (RoPE; Su et al. 2021, "RoFormer", §3.4), forward and backward, on q
// or k per head: (B, H, T, D) -> the same, each row rotated by its position.
//
// The first rot = ⌊fraction · D⌋ dims of a row at position p form rot/2 pairs; pair i turns by the
// angle p · θ^(−2i/rot):
//   (a, b) <- (a cos − b sin, b cos + a sin)
// and dims rot .. D pass through (partial RoPE, GPT-NeoX's rotary_pct). Pair i is (i, i + rot/2)
// by default (half-split: GPT-NeoX, Hugging Face LLaMA's rotate_half) or (2i, 2i + 1) with
// `interleaved` (the paper's and Meta's LLaMA). A rotation is orthogonal, so the backward is the
// inverse rotation of dy (the transpose), with no cache. Dot products of rotated vectors depend
// only on the difference of their positions: q_p · k_p' is a function of p − p'.
//
// The angles' cosines and sines come from a table (rope_table) computed in double on the host and
// used in T; row t of a call reads position offset + t, so decoding with a KV cache continues from
// the cache's length. The arithmetic is kernel_math::rope_element on every backend;
// DeviceOps::rope runs it on a backend's buffers.
#pragma once

#include <cstddef>
#include <string>
#include <string_view>
#include <vector>

#include "attnlab/tensor.hpp"

namespace attnlab {

struct RopeOptions {
  double theta = 10000.0;  // base θ, finite and > 0 (LLaMA 3 uses 500,000)
  double fraction = 1.0;  // of the head dim that rotates, in (0, 1]; ⌊fraction · D⌋ even, ≥ 2
  bool interleaved = false;  // pairs (2i, 2i+1) instead of (i, i + rot/2)
};

// The rotated dims of a head of D: ⌊fraction · D⌋ (to within 1e-9, so 0.7 · 10 is 7). Throws
// std::invalid_argument "<op>: <prefix>rope_theta expected a finite base > 0, got ...", or
// rope_fraction "in (0, 1]", or "<prefix>rope_fraction expected ⌊fraction · d_k⌋ even and >= 2
// (d_k = 6), got 0.5 (3 dims)".
std::size_t rope_dims(std::string_view op, const RopeOptions& options, std::size_t D,
                      const std::string& prefix = "");

// cos and sin of every angle for positions 0 .. positions − 1: (positions, rot/2) each, row-major.
struct RopeTable {
  std::vector<double> cos, sin;
  std::size_t positions = 0, half = 0;
};
RopeTable rope_table(const RopeOptions& options, std::size_t D, std::size_t positions);

// x: (B, H, T, D), rows at positions offset .. offset + T − 1. Returns the rotated x.
template <class T>
Tensor4<T> rope_forward(const Tensor4<T>& x, const RopeOptions& options, std::size_t offset = 0);
// dy: (B, H, T, D). Returns dx = the inverse rotation of dy (assigns).
template <class T>
Tensor4<T> rope_backward(const Tensor4<T>& dy, const RopeOptions& options, std::size_t offset = 0);

}  // namespace attnlab
