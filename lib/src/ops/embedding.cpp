#include "attnlab/ops/embedding.hpp"

#include <algorithm>
#include <stdexcept>
#include <string>

#include "../parallel_rows.hpp"
#include "kernels/embedding.hpp"

namespace attnlab {

namespace detail {

template <class T>
void embedding_forward_rows(T* y, const int* ids, const T* table, std::size_t rows, std::size_t C) {
  for_row_chunks(rows, C, [&](std::size_t i0, std::size_t i1, std::size_t) {
    for (std::size_t i = i0; i < i1; ++i) {
      T* dst = y + i * C;
      if (ids[i] < 0) {  // kNoToken
        std::fill(dst, dst + C, T(0));
        continue;
      }
      const T* src = table + static_cast<std::size_t>(ids[i]) * C;
      std::copy(src, src + C, dst);
    }
  });
}

template <class T>
void embedding_backward_rows(T* dtable, const T* dy, const int* ids, std::size_t rows,
                             std::size_t V, std::size_t C) {
  std::fill(dtable, dtable + V * C, T(0));
  // Scatter-add in position order (deterministic); columns cut across threads.
  for_row_chunks(C, rows, [&](std::size_t c0, std::size_t c1, std::size_t) {
    for (std::size_t i = 0; i < rows; ++i) {
      if (ids[i] < 0 || static_cast<std::size_t>(ids[i]) >= V) continue;
      T* dst = dtable + static_cast<std::size_t>(ids[i]) * C;
      const T* src = dy + i * C;
      for (std::size_t c = c0; c < c1; ++c) dst[c] += src[c];
    }
  });
}

}  // namespace detail

template <class T>
Tensor3<T> embedding_forward(EmbeddingCache& cache, const TokenIds& ids, const Tensor2<T>& table) {
  const std::size_t V = table.shape()[0], C = table.shape()[1];
  const std::size_t B = ids.shape()[0], Tn = ids.shape()[1];
  for (std::size_t i = 0; i < B * Tn; ++i) {
    const int id = ids.data()[i];
    if (id != kNoToken && (id < 0 || static_cast<std::size_t>(id) >= V)) {
      check_arg(false, "embedding_forward",
                "ids[" + std::to_string(i / Tn) + ", " + std::to_string(i % Tn) + "]",
                "an id in [0, " + std::to_string(V) + ") or -1 (no token)", std::to_string(id));
    }
  }
  Tensor3<T> y({B, Tn, C});
  detail::embedding_forward_rows(y.data(), ids.data(), table.data(), B * Tn, C);
  cache.ids = ids;
  cache.V = V;
  return y;
}

template <class T>
Tensor2<T> embedding_backward(const Tensor3<T>& dy, const EmbeddingCache& cache) {
  if (cache.V == 0) {
    throw std::logic_error("embedding_backward: the cache is empty: call embedding_forward first");
  }
  const std::size_t B = cache.ids.shape()[0], Tn = cache.ids.shape()[1];
  check_shape("embedding_backward", "dy", dy, {std::ptrdiff_t(B), std::ptrdiff_t(Tn), kAnyExtent});
  const std::size_t C = dy.shape()[2];
  Tensor2<T> dtable({cache.V, C});
  detail::embedding_backward_rows(dtable.data(), dy.data(), cache.ids.data(), B * Tn, cache.V, C);
  return dtable;
}

#define ATTNLAB_INSTANTIATE_EMBEDDING(T)                                                         \
  template Tensor3<T> embedding_forward<T>(EmbeddingCache&, const TokenIds&, const Tensor2<T>&); \
  template Tensor2<T> embedding_backward<T>(const Tensor3<T>&, const EmbeddingCache&);
ATTNLAB_INSTANTIATE_EMBEDDING(float)
ATTNLAB_INSTANTIATE_EMBEDDING(double)
#undef ATTNLAB_INSTANTIATE_EMBEDDING

#define ATTNLAB_INSTANTIATE_EMBEDDING_ROWS(T)                                             \
  template void detail::embedding_forward_rows<T>(T*, const int*, const T*, std::size_t,  \
                                                  std::size_t);                           \
  template void detail::embedding_backward_rows<T>(T*, const T*, const int*, std::size_t, \
                                                   std::size_t, std::size_t);
ATTNLAB_INSTANTIATE_EMBEDDING_ROWS(float)
ATTNLAB_INSTANTIATE_EMBEDDING_ROWS(double)
#undef ATTNLAB_INSTANTIATE_EMBEDDING_ROWS

}  // namespace attnlab
