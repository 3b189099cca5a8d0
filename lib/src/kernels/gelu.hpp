// Private to the library (lib/src, and lib/backends/cpu, which calls the same cores): the
// raw-pointer core of gelu_forward / gelu_backward (ops/gelu.cpp), shared with the CPU device
// backend. Vectorised (xsimd) and parallel over blocks of 64 values; each value takes the same path
// for any thread count.
#pragma once

#include <cstddef>

namespace attnlab::detail {

// y = gelu(x) over n values (dy null), or dx = dy ⊙ gelu'(x) (dy not null); out may alias x or dy.
template <class T>
void gelu_elements(T* out, const T* x, const T* dy, std::size_t n, bool exact);

}  // namespace attnlab::detail
