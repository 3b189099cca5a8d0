// The embedding lookup (attnlab/ops/embedding.hpp): the raw-pointer cores that the op front
// (lib/src/ops/embedding.cpp, where they are defined) and the CPU backend (lib/backends/cpu) call;
// the CUDA kernels are lib/backends/cuda/embedding.cuh. Ids are validated by the caller; an id of
// kNoToken (-1) gives a row of zeros and no gradient. Every output is assigned.
#pragma once

#include <cstddef>

namespace attnlab::detail {

// y (rows, C) = table[ids] for table (V, C), ids (rows,).
template <class T>
void embedding_forward_rows(T* y, const int* ids, const T* table, std::size_t rows, std::size_t C);

// dtable (V, C): row v = Σ of dy (rows, C) over the positions whose id is v, in position order (a
// scatter-add with the columns cut across threads: the same sums for any thread count).
template <class T>
void embedding_backward_rows(T* dtable, const T* dy, const int* ids, std::size_t rows,
                             std::size_t V, std::size_t C);

}  // namespace attnlab::detail
