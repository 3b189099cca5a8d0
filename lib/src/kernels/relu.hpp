// Private to the library (lib/src, and lib/backends/cpu, which calls the same cores): the
// raw-pointer cores of ReLU and ReLU² (ops/relu.cpp), called by the xtensor ops and by the CPU
// device backend. Elementwise over n values, cut across threads as
// ../parallel_rows.hpp says (the same bits for any cut); every output is assigned.
#pragma once

#include <cstddef>

namespace attnlab::detail {

// y = max(x, 0), or its square when `squared` (ReLU², So et al. 2021, "Primer").
template <class T>
void relu_forward_elements(T* y, const T* x, std::size_t n, bool squared);

// dx = dy where x > 0, else 0; with `squared`, dx = (2x) · dy where x > 0, else 0.
template <class T>
void relu_backward_elements(T* dx, const T* dy, const T* x, std::size_t n, bool squared);

}  // namespace attnlab::detail
