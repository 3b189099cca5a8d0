#include "attnlab/ops/embedding.hpp"

#include <algorithm>
#include <stdexcept>
#include <string>

namespace attnlab {

template <class T>
Tensor3<T> embedding_forward(EmbeddingCache& cache, const TokenIds& ids, const Tensor2<T>& table) {
  const std::size_t V = table.shape()[0], C = table.shape()[1];
  const std::size_t B = ids.shape()[0], Tn = ids.shape()[1];
  Tensor3<T> y({B, Tn, C});
  for (std::size_t i = 0; i < B * Tn; ++i) {
    const int id = ids.data()[i];
    T* dst = y.data() + i * C;
    if (id == kNoToken) {
      std::fill(dst, dst + C, T(0));
      continue;
    }
    if (id < 0 || static_cast<std::size_t>(id) >= V) {
      check_arg(false, "embedding_forward",
                "ids[" + std::to_string(i / Tn) + ", " + std::to_string(i % Tn) + "]",
                "an id in [0, " + std::to_string(V) + ") or -1 (no token)", std::to_string(id));
    }
    const T* src = table.data() + static_cast<std::size_t>(id) * C;
    std::copy(src, src + C, dst);  // y[b, t, :] = table[id, :]
  }
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
  dtable.fill(T(0));
  // Scatter-add, in position order (deterministic): repeated ids sum their rows.
  for (std::size_t i = 0; i < B * Tn; ++i) {
    const int id = cache.ids.data()[i];
    if (id == kNoToken) continue;
    T* dst = dtable.data() + static_cast<std::size_t>(id) * C;
    const T* src = dy.data() + i * C;
    for (std::size_t c = 0; c < C; ++c) dst[c] += src[c];
  }
  return dtable;
}

#define ATTNLAB_INSTANTIATE_EMBEDDING(T)                                                         \
  template Tensor3<T> embedding_forward<T>(EmbeddingCache&, const TokenIds&, const Tensor2<T>&); \
  template Tensor2<T> embedding_backward<T>(const Tensor3<T>&, const EmbeddingCache&);
ATTNLAB_INSTANTIATE_EMBEDDING(float)
ATTNLAB_INSTANTIATE_EMBEDDING(double)
#undef ATTNLAB_INSTANTIATE_EMBEDDING

}  // namespace attnlab
