#include "attnlab/ops/layernorm.hpp"

#include <cmath>
#include <stdexcept>
#include <vector>

#include "../parallel_rows.hpp"
#include "shape_helpers.hpp"

namespace attnlab {

using shape_helpers::dims;
using shape_helpers::last_is;

template <class T, std::size_t N>
Tensor<T, N> layernorm_forward(LayerNormCache<T, N>& cache, const Tensor<T, N>& x,
                               const Tensor1<T>& gamma, const Tensor1<T>& beta, double eps) {
  const std::size_t C = gamma.size();
  check_extents("layernorm_forward", "x", dims(x.shape()), last_is<N>(C));
  check_shape("layernorm_forward", "beta", beta, {std::ptrdiff_t(C)});
  check_arg(C > 0, "layernorm_forward", "gamma", "a non-empty (C,) vector", "C = 0");
  const std::size_t rows = x.size() / C;
  cache.xhat.resize(x.shape());
  cache.rstd.assign(rows, T(0));
  Tensor<T, N> y(x.shape());
  detail::for_row_chunks(rows, C, [&](std::size_t r0, std::size_t r1, std::size_t) {
    for (std::size_t r = r0; r < r1; ++r) {
      const T* xr = x.data() + r * C;
      T* hr = cache.xhat.data() + r * C;
      T* yr = y.data() + r * C;
      T mean = 0;
      for (std::size_t c = 0; c < C; ++c) mean += xr[c];
      mean /= T(C);
      T var = 0;
      for (std::size_t c = 0; c < C; ++c) var += (xr[c] - mean) * (xr[c] - mean);
      var /= T(C);  // biased, as PyTorch
      const T rstd = T(1) / std::sqrt(var + T(eps));
      cache.rstd[r] = rstd;
      for (std::size_t c = 0; c < C; ++c) {
        hr[c] = (xr[c] - mean) * rstd;
        yr[c] = gamma(c) * hr[c] + beta(c);
      }
    }
  });
  return y;
}

template <class T, std::size_t N>
LayerNormGrads<T, N> layernorm_backward(const Tensor<T, N>& dy, const LayerNormCache<T, N>& cache,
                                        const Tensor1<T>& gamma) {
  if (cache.rstd.empty()) {
    throw std::logic_error("layernorm_backward: the cache is empty: call layernorm_forward first");
  }
  const auto& shape = cache.xhat.shape();
  check_extents("layernorm_backward", "dy", dims(dy.shape()),
                std::vector<std::ptrdiff_t>(shape.begin(), shape.end()));
  const std::size_t C = gamma.size();
  const std::size_t rows = cache.rstd.size();
  LayerNormGrads<T, N> g{Tensor<T, N>(shape), Tensor1<T>::from_shape({C}),
                         Tensor1<T>::from_shape({C})};
  g.dgamma.fill(T(0));
  g.dbeta.fill(T(0));
  // dγ and dβ are sums over rows: chunk 0 adds into g, the others into their own partials, added
  // below in chunk order.
  const std::size_t chunks = detail::row_chunks(rows, C);
  std::vector<T> partial(chunks > 1 ? (chunks - 1) * 2 * C : 0, T(0));
  detail::for_chunks(rows, chunks, [&](std::size_t r0, std::size_t r1, std::size_t chunk) {
    T* dgamma = chunk == 0 ? g.dgamma.data() : partial.data() + (chunk - 1) * 2 * C;
    T* dbeta = chunk == 0 ? g.dbeta.data() : dgamma + C;
    for (std::size_t r = r0; r < r1; ++r) {
      const T* dyr = dy.data() + r * C;
      const T* hr = cache.xhat.data() + r * C;
      T* dxr = g.dx.data() + r * C;
      // g = dy ⊙ γ; dx = rstd · (g − mean(g) − x̂ ⊙ mean(g ⊙ x̂)): the Jacobian of x̂ applied to g.
      T mean_g = 0, mean_gh = 0;
      for (std::size_t c = 0; c < C; ++c) {
        const T gc = dyr[c] * gamma(c);
        mean_g += gc;
        mean_gh += gc * hr[c];
        dgamma[c] += dyr[c] * hr[c];
        dbeta[c] += dyr[c];
      }
      mean_g /= T(C);
      mean_gh /= T(C);
      const T rstd = cache.rstd[r];
      for (std::size_t c = 0; c < C; ++c) {
        dxr[c] = rstd * (dyr[c] * gamma(c) - mean_g - hr[c] * mean_gh);
      }
    }
  });
  for (std::size_t chunk = 1; chunk < chunks; ++chunk) {
    const T* part = partial.data() + (chunk - 1) * 2 * C;
    for (std::size_t c = 0; c < C; ++c) {
      g.dgamma(c) += part[c];
      g.dbeta(c) += part[C + c];
    }
  }
  return g;
}

#define ATTNLAB_INSTANTIATE_LAYERNORM(T, N)                                                    \
  template Tensor<T, N> layernorm_forward<T, N>(LayerNormCache<T, N>&, const Tensor<T, N>&,    \
                                                const Tensor1<T>&, const Tensor1<T>&, double); \
  template LayerNormGrads<T, N> layernorm_backward<T, N>(                                      \
      const Tensor<T, N>&, const LayerNormCache<T, N>&, const Tensor1<T>&);
ATTNLAB_INSTANTIATE_LAYERNORM(float, 2)
ATTNLAB_INSTANTIATE_LAYERNORM(float, 3)
ATTNLAB_INSTANTIATE_LAYERNORM(float, 4)
ATTNLAB_INSTANTIATE_LAYERNORM(double, 2)
ATTNLAB_INSTANTIATE_LAYERNORM(double, 3)
ATTNLAB_INSTANTIATE_LAYERNORM(double, 4)
#undef ATTNLAB_INSTANTIATE_LAYERNORM

}  // namespace attnlab
