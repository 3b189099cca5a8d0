#include "attnlab/ops/rmsnorm.hpp"

#include <cmath>
#include <stdexcept>
#include <vector>

#include "../parallel_rows.hpp"
#include "shape_helpers.hpp"

namespace attnlab {

using shape_helpers::dims;
using shape_helpers::last_is;

template <class T, std::size_t N>
Tensor<T, N> rmsnorm_forward(RmsNormCache<T, N>& cache, const Tensor<T, N>& x,
                             const Tensor1<T>& gamma, double eps) {
  const std::size_t C = gamma.size();
  check_extents("rmsnorm_forward", "x", dims(x.shape()), last_is<N>(C));
  check_arg(C > 0, "rmsnorm_forward", "gamma", "a non-empty (C,) vector", "C = 0");
  const std::size_t rows = x.size() / C;
  cache.xhat.resize(x.shape());
  cache.rstd.assign(rows, T(0));
  Tensor<T, N> y(x.shape());
  detail::for_row_chunks(rows, C, [&](std::size_t r0, std::size_t r1, std::size_t) {
    for (std::size_t r = r0; r < r1; ++r) {
      const T* xr = x.data() + r * C;
      T* hr = cache.xhat.data() + r * C;
      T* yr = y.data() + r * C;
      T mean_sq = 0;
      for (std::size_t c = 0; c < C; ++c) mean_sq += xr[c] * xr[c];
      mean_sq /= T(C);
      const T rstd = T(1) / std::sqrt(mean_sq + T(eps));
      cache.rstd[r] = rstd;
      for (std::size_t c = 0; c < C; ++c) {
        hr[c] = xr[c] * rstd;
        yr[c] = gamma(c) * hr[c];
      }
    }
  });
  return y;
}

template <class T, std::size_t N>
RmsNormGrads<T, N> rmsnorm_backward(const Tensor<T, N>& dy, const RmsNormCache<T, N>& cache,
                                    const Tensor1<T>& gamma) {
  if (cache.rstd.empty()) {
    throw std::logic_error("rmsnorm_backward: the cache is empty: call rmsnorm_forward first");
  }
  const auto& shape = cache.xhat.shape();
  check_extents("rmsnorm_backward", "dy", dims(dy.shape()),
                std::vector<std::ptrdiff_t>(shape.begin(), shape.end()));
  const std::size_t C = gamma.size();
  const std::size_t rows = cache.rstd.size();
  RmsNormGrads<T, N> g{Tensor<T, N>(shape), Tensor1<T>::from_shape({C})};
  g.dgamma.fill(T(0));
  // dγ is a sum over rows: one partial per chunk after the first, added in chunk order.
  const std::size_t chunks = detail::row_chunks(rows, C);
  std::vector<T> partial(chunks > 1 ? (chunks - 1) * C : 0, T(0));
  detail::for_chunks(rows, chunks, [&](std::size_t r0, std::size_t r1, std::size_t chunk) {
    T* dgamma = chunk == 0 ? g.dgamma.data() : partial.data() + (chunk - 1) * C;
    for (std::size_t r = r0; r < r1; ++r) {
      const T* dyr = dy.data() + r * C;
      const T* hr = cache.xhat.data() + r * C;
      T* dxr = g.dx.data() + r * C;
      // x̂ = x · rstd(x); ∂rstd/∂x = −rstd³ x / C, hence dx = rstd · (g − x̂ ⊙ mean(g ⊙ x̂)).
      T mean_gh = 0;
      for (std::size_t c = 0; c < C; ++c) {
        mean_gh += dyr[c] * gamma(c) * hr[c];
        dgamma[c] += dyr[c] * hr[c];
      }
      mean_gh /= T(C);
      const T rstd = cache.rstd[r];
      for (std::size_t c = 0; c < C; ++c) dxr[c] = rstd * (dyr[c] * gamma(c) - hr[c] * mean_gh);
    }
  });
  for (std::size_t chunk = 1; chunk < chunks; ++chunk) {
    const T* part = partial.data() + (chunk - 1) * C;
    for (std::size_t c = 0; c < C; ++c) g.dgamma(c) += part[c];
  }
  return g;
}

#define ATTNLAB_INSTANTIATE_RMSNORM(T, N)                                               \
  template Tensor<T, N> rmsnorm_forward<T, N>(RmsNormCache<T, N>&, const Tensor<T, N>&, \
                                              const Tensor1<T>&, double);               \
  template RmsNormGrads<T, N> rmsnorm_backward<T, N>(                                   \
      const Tensor<T, N>&, const RmsNormCache<T, N>&, const Tensor1<T>&);
ATTNLAB_INSTANTIATE_RMSNORM(float, 2)
ATTNLAB_INSTANTIATE_RMSNORM(float, 3)
ATTNLAB_INSTANTIATE_RMSNORM(float, 4)
ATTNLAB_INSTANTIATE_RMSNORM(double, 2)
ATTNLAB_INSTANTIATE_RMSNORM(double, 3)
ATTNLAB_INSTANTIATE_RMSNORM(double, 4)
#undef ATTNLAB_INSTANTIATE_RMSNORM

}  // namespace attnlab
