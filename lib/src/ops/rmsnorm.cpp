#include "attnlab/ops/rmsnorm.hpp"

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

namespace {

// The partial sums of chunk `chunk`: the output itself for chunk 0, else a slice of scratch.
template <class T>
T* partial_of(T* out, std::vector<T>& scratch, std::size_t chunk, std::size_t C) {
  return chunk == 0 ? out : scratch.data() + (chunk - 1) * C;
}

// out[c] += Σ over chunks 1.. of their partials, in chunk order.
template <class T>
void add_partials(T* out, const std::vector<T>& scratch, std::size_t chunks, std::size_t C) {
  for (std::size_t chunk = 1; chunk < chunks; ++chunk) {
    const T* part = scratch.data() + (chunk - 1) * C;
    for (std::size_t c = 0; c < C; ++c) out[c] += part[c];
  }
}

}  // namespace

template <class T>
void rmsnorm_forward_rows(T* y, T* rstd, const T* x, const T* gamma, std::size_t rows,
                          std::size_t C, T eps) {
  for_row_chunks(rows, C, [&](std::size_t r0, std::size_t r1, std::size_t) {
    for (std::size_t r = r0; r < r1; ++r) {
      const T* xr = x + r * C;
      T* yr = y + r * C;
      const T mean_sq = row_kernels::dot(xr, xr, C) / T(C);  // vectorised, as in LayerNorm
      const T rs = T(1) / std::sqrt(mean_sq + eps);
      rstd[r] = rs;
      for (std::size_t c = 0; c < C; ++c) yr[c] = gamma[c] * (xr[c] * rs);
    }
  });
}

template <class T>
void rmsnorm_backward_rows(T* dx, T* dgamma, const T* dy, const T* x, const T* rstd, const T* gamma,
                           std::size_t rows, std::size_t C, std::vector<T>& scratch) {
  using batch = xsimd::batch<T>;
  constexpr std::size_t width = batch::size;
  const std::size_t chunks = row_chunks(rows, C);
  std::fill(dgamma, dgamma + C, T(0));
  scratch.assign(chunks > 1 ? (chunks - 1) * C : 0, T(0));
  for_chunks(rows, chunks, [&](std::size_t r0, std::size_t r1, std::size_t chunk) {
    T* dg = partial_of(dgamma, scratch, chunk, C);
    for (std::size_t r = r0; r < r1; ++r) {
      const T* dyr = dy + r * C;
      const T* xr = x + r * C;
      T* dxr = dx + r * C;
      const T rs = rstd[r];
      // dx = rstd · (g − x̂ ⊙ mean(g ⊙ x̂)), g = dy ⊙ γ.
      // mean(g ⊙ x̂) in lane-wise partial sums (one batch, then a horizontal add and the tail).
      const batch rsv(rs);
      batch acc(T(0));
      std::size_t c = 0;
      for (; c + width <= C; c += width) {
        const batch dyv = batch::load_unaligned(dyr + c);
        const batch h = batch::load_unaligned(xr + c) * rsv;
        acc = xsimd::fma(dyv * batch::load_unaligned(gamma + c), h, acc);
        xsimd::fma(dyv, h, batch::load_unaligned(dg + c)).store_unaligned(dg + c);
      }
      T mean_gh = xsimd::hadd(acc);
      for (; c < C; ++c) {
        const T h = xr[c] * rs;
        mean_gh += dyr[c] * gamma[c] * h;
        dg[c] += dyr[c] * h;
      }
      mean_gh /= T(C);
      for (std::size_t c = 0; c < C; ++c) dxr[c] = rs * (dyr[c] * gamma[c] - xr[c] * rs * mean_gh);
    }
  });
  add_partials(dgamma, scratch, chunks, C);
}

}  // namespace detail

template <class T, std::size_t N>
Tensor<T, N> rmsnorm_forward(RmsNormCache<T, N>& cache, const Tensor<T, N>& x,
                             const Tensor1<T>& gamma, double eps) {
  const std::size_t C = gamma.size();
  check_extents("rmsnorm_forward", "x", dims(x.shape()), last_is<N>(C));
  check_arg(C > 0, "rmsnorm_forward", "gamma", "a non-empty (C,) vector", "C = 0");
  const std::size_t rows = x.size() / C;
  detail::assign_copy(cache.x, x);
  cache.rstd.resize(rows);
  Tensor<T, N> y(x.shape());
  detail::rmsnorm_forward_rows(y.data(), cache.rstd.data(), x.data(), gamma.data(), rows, C,
                               T(eps));
  return y;
}

template <class T, std::size_t N>
RmsNormGrads<T, N> rmsnorm_backward(const Tensor<T, N>& dy, const RmsNormCache<T, N>& cache,
                                    const Tensor1<T>& gamma) {
  const std::size_t C =
      shape_helpers::check_norm_backward("rmsnorm_backward", "rmsnorm_forward", dy, cache, gamma);
  const auto& shape = cache.x.shape();
  RmsNormGrads<T, N> g{Tensor<T, N>(shape), Tensor1<T>::from_shape({C})};
  std::vector<T> scratch;
  detail::rmsnorm_backward_rows(g.dx.data(), g.dgamma.data(), dy.data(), cache.x.data(),
                                cache.rstd.data(), gamma.data(), cache.rstd.size(), C, scratch);
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

#define ATTNLAB_INSTANTIATE_RMSNORM_ROWS(T)                                                      \
  template void detail::rmsnorm_forward_rows<T>(T*, T*, const T*, const T*, std::size_t,         \
                                                std::size_t, T);                                 \
  template void detail::rmsnorm_backward_rows<T>(T*, T*, const T*, const T*, const T*, const T*, \
                                                 std::size_t, std::size_t, std::vector<T>&);
ATTNLAB_INSTANTIATE_RMSNORM_ROWS(float)
ATTNLAB_INSTANTIATE_RMSNORM_ROWS(double)
#undef ATTNLAB_INSTANTIATE_RMSNORM_ROWS

}  // namespace attnlab
