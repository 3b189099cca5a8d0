// Embedding lookup (gather) and its backward (scatter-add).
// Reference: torch.nn.functional.embedding(ids, table).
//
//   y[b, t, :] = table[ids[b, t], :]      (B,T) ids, (V,C) table -> (B,T,C)
//
// An id equal to kNoToken marks "no token here" (a field absent at this position): its output row
// is 0 and it receives no gradient.
#pragma once

#include <cstddef>

#include "attnlab/tensor.hpp"

namespace attnlab {

// The id of an absent token (a field that is not present at a position).
inline constexpr int kNoToken = -1;

struct EmbeddingCache {
  TokenIds ids;       // (B, T)
  std::size_t V = 0;  // rows of the table
};

// ids: (B, T) in [0, V) or kNoToken; table: (V, C). Returns y (B, T, C) and fills `cache`.
// Throws std::invalid_argument naming the first id out of range.
template <class T>
Tensor3<T> embedding_forward(EmbeddingCache& cache, const TokenIds& ids, const Tensor2<T>& table);

// dy: (B, T, C). Returns dtable (V, C) (assigns): row v is the sum of dy over the positions whose
// id is v; rows of unused ids are 0. Throws std::logic_error on an empty cache, ShapeError on
// mismatch.
template <class T>
Tensor2<T> embedding_backward(const Tensor3<T>& dy, const EmbeddingCache& cache);

}  // namespace attnlab
