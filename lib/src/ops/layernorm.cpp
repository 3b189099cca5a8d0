#include "attnlab/ops/layernorm.hpp"

#include <cmath>
#include <stdexcept>
#include <string>
#include <vector>

#include <xsimd/xsimd.hpp>

#include "../parallel_rows.hpp"
#include "kernels/norms.hpp"
#include "kernels/rows.hpp"
#include "shape_helpers.hpp"

namespace attnlab {

using shape_helpers::dims;
using shape_helpers::last_is;

namespace detail {

template <class T>
void layernorm_forward_rows(T* y, T* mean, T* rstd, const T* x, const T* gamma, const T* beta,
                            std::size_t rows, std::size_t C, T eps) {
  for_row_chunks(rows, C, [&](std::size_t r0, std::size_t r1, std::size_t) {
    for (std::size_t r = r0; r < r1; ++r) {
      const T* xr = x + r * C;
      T* yr = y + r * C;
      // Vectorised sums (row_kernels.hpp): a plain `mu += x[c]` loop is one serial chain of adds,
      // which GCC may not reorder (the profile: tests/bench/README.md).
      const T mu = row_kernels::sum(xr, C) / T(C);
      const T var = row_kernels::sum_squared_deviation(xr, C, mu) / T(C);  // biased, as PyTorch
      const T rs = T(1) / std::sqrt(var + eps);
      mean[r] = mu;
      rstd[r] = rs;
      if (beta) {
        for (std::size_t c = 0; c < C; ++c) yr[c] = gamma[c] * ((xr[c] - mu) * rs) + beta[c];
      } else {
        for (std::size_t c = 0; c < C; ++c) yr[c] = gamma[c] * ((xr[c] - mu) * rs);
      }
    }
  });
}

template <class T>
void layernorm_backward_rows(T* dx, T* dgamma, T* dbeta, const T* dy, const T* x, const T* mean,
                             const T* rstd, const T* gamma, std::size_t rows, std::size_t C,
                             std::vector<T>& scratch) {
  // dγ and dβ side by side in 2C values per chunk; chunk 0 sums into `sums`, copied out at the end.
  using batch = xsimd::batch<T>;
  constexpr std::size_t width = batch::size;
  const std::size_t chunks = row_chunks(rows, C);
  scratch.assign(chunks * 2 * C, T(0));
  for_chunks(rows, chunks, [&](std::size_t r0, std::size_t r1, std::size_t chunk) {
    T* dg = scratch.data() + chunk * 2 * C;
    T* db = dg + C;
    for (std::size_t r = r0; r < r1; ++r) {
      const T* dyr = dy + r * C;
      const T* xr = x + r * C;
      T* dxr = dx + r * C;
      const T mu = mean[r], rs = rstd[r];
      // g = dy ⊙ γ; dx = rstd · (g − mean(g) − x̂ ⊙ mean(g ⊙ x̂)), x̂ recomputed as the forward did.
      // The two means in lane-wise partial sums (one batch each, then a horizontal add and the
      // tail in order).
      const batch muv(mu), rsv(rs);
      batch acc_g(T(0)), acc_gh(T(0));
      std::size_t c = 0;
      for (; c + width <= C; c += width) {
        const batch dyv = batch::load_unaligned(dyr + c);
        const batch h = (batch::load_unaligned(xr + c) - muv) * rsv;
        const batch gc = dyv * batch::load_unaligned(gamma + c);
        acc_g += gc;
        acc_gh = xsimd::fma(gc, h, acc_gh);
        xsimd::fma(dyv, h, batch::load_unaligned(dg + c)).store_unaligned(dg + c);
        (batch::load_unaligned(db + c) + dyv).store_unaligned(db + c);
      }
      T mean_g = xsimd::hadd(acc_g), mean_gh = xsimd::hadd(acc_gh);
      for (; c < C; ++c) {
        const T h = (xr[c] - mu) * rs;
        const T gc = dyr[c] * gamma[c];
        mean_g += gc;
        mean_gh += gc * h;
        dg[c] += dyr[c] * h;
        db[c] += dyr[c];
      }
      mean_g /= T(C);
      mean_gh /= T(C);
      for (std::size_t c = 0; c < C; ++c) {
        const T h = (xr[c] - mu) * rs;
        dxr[c] = rs * (dyr[c] * gamma[c] - mean_g - h * mean_gh);
      }
    }
  });
  for (std::size_t chunk = 1; chunk < chunks; ++chunk) {
    const T* part = scratch.data() + chunk * 2 * C;
    for (std::size_t c = 0; c < 2 * C; ++c) scratch[c] += part[c];
  }
  if (dgamma) std::copy(scratch.data(), scratch.data() + C, dgamma);
  if (dbeta) std::copy(scratch.data() + C, scratch.data() + 2 * C, dbeta);
}

}  // namespace detail

template <class T, std::size_t N>
Tensor<T, N> layernorm_forward(LayerNormCache<T, N>& cache, const Tensor<T, N>& x,
                               const Tensor1<T>& gamma, const Tensor1<T>& beta, double eps) {
  const std::size_t C = gamma.size();
  check_extents("layernorm_forward", "x", dims(x.shape()), last_is<N>(C));
  check_shape("layernorm_forward", "beta", beta, {std::ptrdiff_t(C)});
  check_arg(C > 0, "layernorm_forward", "gamma", "a non-empty (C,) vector", "C = 0");
  const std::size_t rows = x.size() / C;
  detail::assign_copy(cache.x, x);
  cache.mean.resize(rows);
  cache.rstd.resize(rows);
  Tensor<T, N> y(x.shape());
  detail::layernorm_forward_rows(y.data(), cache.mean.data(), cache.rstd.data(), x.data(),
                                 gamma.data(), beta.data(), rows, C, T(eps));
  return y;
}

template <class T, std::size_t N>
LayerNormGrads<T, N> layernorm_backward(const Tensor<T, N>& dy, const LayerNormCache<T, N>& cache,
                                        const Tensor1<T>& gamma) {
  const std::size_t C = shape_helpers::check_norm_backward("layernorm_backward",
                                                           "layernorm_forward", dy, cache, gamma);
  const auto& shape = cache.x.shape();
  LayerNormGrads<T, N> g{Tensor<T, N>(shape), Tensor1<T>::from_shape({C}),
                         Tensor1<T>::from_shape({C})};
  std::vector<T> scratch;
  detail::layernorm_backward_rows(g.dx.data(), g.dgamma.data(), g.dbeta.data(), dy.data(),
                                  cache.x.data(), cache.mean.data(), cache.rstd.data(),
                                  gamma.data(), cache.rstd.size(), C, scratch);
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

#define ATTNLAB_INSTANTIATE_LAYERNORM_ROWS(T)                                                    \
  template void detail::layernorm_forward_rows<T>(T*, T*, T*, const T*, const T*, const T*,      \
                                                  std::size_t, std::size_t, T);                  \
  template void detail::layernorm_backward_rows<T>(T*, T*, T*, const T*, const T*, const T*,     \
                                                   const T*, const T*, std::size_t, std::size_t, \
                                                   std::vector<T>&);
ATTNLAB_INSTANTIATE_LAYERNORM_ROWS(float)
ATTNLAB_INSTANTIATE_LAYERNORM_ROWS(double)
#undef ATTNLAB_INSTANTIATE_LAYERNORM_ROWS

}  // namespace attnlab
