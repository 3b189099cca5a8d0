// Private to the library (lib/src, and lib/backends/cpu, which calls the same cores): the
// raw-pointer core of rotary positions (ops/rope.cpp), called by the xtensor op pair and by the CPU
// device backend. Rows are cut across threads as
// ../parallel_rows.hpp says (each row independent: the same bits for any cut); the pair
// arithmetic is kernel_math::rope_element, the CUDA kernel's too.
#pragma once

#include "attnlab/kernel_math.hpp"

namespace attnlab::detail {

// In place on x (shape.slices · shape.Tn rows of shape.D): every rotated pair of every row.
template <class T>
void rope_rows(T* x, const T* cos, const T* sin, const kernel_math::RopeShape& shape);

}  // namespace attnlab::detail
