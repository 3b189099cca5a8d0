// Private to lib/src: the raw-pointer cores of softmax cross-entropy (ops/cross_entropy.cpp),
// called by the xtensor op pair and by the CPU device backend's fused call. A row is labelled when
// its target is in [0, V) and is not ignore_index (the op validates targets first; the backend's
// contract treats out-of-range targets as unlabelled).
#pragma once

#include <cstddef>
#include <vector>

namespace attnlab::detail {

// p (rows, V) = softmax of every row of logits (p may be the buffer the backward writes into);
// row_loss (rows,) = −log p[target] in double on labelled rows, 0 elsewhere. Returns the number of
// labelled rows; *loss (when not null) = the mean of row_loss over them, summed in row order (0
// when none is labelled), so the loss does not depend on the thread count.
template <class T>
std::size_t cross_entropy_forward_rows(T* loss, T* p, std::vector<double>& row_loss,
                                       const T* logits, const int* targets, std::size_t rows,
                                       std::size_t V, int ignore_index);

// dlogits (rows, V) = w · (p − onehot(target)) on labelled rows, 0 elsewhere (assigns; dlogits may
// be p). w is dloss / n.
template <class T>
void cross_entropy_backward_rows(T* dlogits, const T* p, const int* targets, std::size_t rows,
                                 std::size_t V, int ignore_index, T w);

}  // namespace attnlab::detail
