// Rotary positions (attnlab/ops/rope.hpp): the pair arithmetic (rope_element over a
// kernel_math::RopeShape), which the CUDA kernel runs (lib/backends/cuda/rope.cuh), and the
// raw-pointer core that the op front (lib/src/ops/rope.cpp, where it is defined) and the CPU
// backend (lib/backends/cpu) call. Rows are cut across threads as lib/src/parallel_rows.hpp says
// (each row independent: the same bits for any cut). Seen by nvcc: no xtensor, no xsimd, no OpenMP
// here.
#pragma once

#include <cstddef>

#include "attnlab/kernel_math.hpp"

namespace attnlab::kernel_math {

// Rotates pair i of `row` (rot/2 = half pairs) by the angle whose cosine and sine are c and s:
//   (a, b) <- (a c − b s, b c + a s).
template <class T>
ATTNLAB_HD inline void rope_rotate_pair(T* row, std::size_t i, std::size_t half, bool interleaved,
                                        T c, T s) {
  const std::size_t ia = interleaved ? 2 * i : i, ib = interleaved ? 2 * i + 1 : i + half;
  const T a = row[ia], b = row[ib];
  row[ia] = a * c - b * s;
  row[ib] = b * c + a * s;
}

// Pair `pair` (an index over slices · Tn · rot/2 pairs) of a RopeShape rotation, in place.
template <class T>
ATTNLAB_HD inline void rope_element(T* x, const T* cos, const T* sin, const RopeShape& shape,
                                    std::size_t pair) {
  const std::size_t half = shape.rot / 2;
  const std::size_t row = pair / half, i = pair % half, t = row % shape.Tn;
  const std::size_t at = (shape.offset + t) * half + i;
  rope_rotate_pair(x + row * shape.D, i, half, shape.interleaved, cos[at],
                   shape.inverse ? -sin[at] : sin[at]);
}

}  // namespace attnlab::kernel_math

namespace attnlab::detail {

// In place on x (shape.slices · shape.Tn rows of shape.D): every rotated pair of every row.
template <class T>
void rope_rows(T* x, const T* cos, const T* sin, const kernel_math::RopeShape& shape);

}  // namespace attnlab::detail
