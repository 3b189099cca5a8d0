#include "attnlab/ops/gelu.hpp"

#include <algorithm>
#include <cmath>
#include <numbers>
#include <stdexcept>
#include <type_traits>

#include <xsimd/xsimd.hpp>

#include "../parallel_rows.hpp"
#include "kernels/gelu.hpp"

namespace attnlab {

namespace {
constexpr double kGeluCubic = 0.044715;

// erf for the exact form. double: std::erf / xsimd::erf. float: a 13/8-degree rational
// interpolant on [-4, 4] (clamped outside, where erf rounds to ±1 in float): Eigen's
// generic_fast_erf_float (unsupported/SpecialFunctions, from XLA), |error| <= 3.4e-7 against erf in
// double (tests/ops/test_ops_layers.cpp), a few float ulps near ±1, against xsimd::erf's ~1.5
// ulp. It needs no exp and no branch, so it runs several times faster than xsimd::erf
// (tests/bench/README.md, "Figures behind code comments"). The scalar tail uses the same function
// (xsimd::fma/min/max on a float are std::fma/min/max).
template <class V>
V erf_float(V a) {
  const V x = xsimd::max(xsimd::min(a, V(4.f)), V(-4.f));
  const V x2 = x * x;
  V p = xsimd::fma(x2, V(-2.72614225801306e-10f), V(2.77068142495902e-08f));
  p = xsimd::fma(x2, p, V(-2.10102402082508e-06f));
  p = xsimd::fma(x2, p, V(-5.69250639462346e-05f));
  p = xsimd::fma(x2, p, V(-7.34990630326855e-04f));
  p = xsimd::fma(x2, p, V(-2.95459980854025e-03f));
  p = xsimd::fma(x2, p, V(-1.60960333262415e-02f));
  p = x * p;
  V q = xsimd::fma(x2, V(-1.45660718464996e-05f), V(-2.13374055278905e-04f));
  q = xsimd::fma(x2, q, V(-1.68282697438203e-03f));
  q = xsimd::fma(x2, q, V(-7.37332916720468e-03f));
  q = xsimd::fma(x2, q, V(-1.42647390514189e-02f));
  return p / q;
}

// erf of a scalar or an xsimd batch of T.
template <class V>
V erf_of(V x) {
  if constexpr (std::is_same_v<V, float> || std::is_same_v<V, xsimd::batch<float>>) {
    return erf_float(x);
  } else if constexpr (std::is_same_v<V, double>) {
    return std::erf(x);
  } else {
    return xsimd::erf(x);
  }
}

template <class T>
T gelu_value(T x, GeluApproximation a) {
  if (a == GeluApproximation::exact) {
    return T(0.5) * x * (T(1) + erf_of(x / T(std::numbers::sqrt2)));
  }
  // ½ (1 + tanh u) = σ(2u) = 1 / (1 + e^(−2u)): one exp and a division instead of tanh (1.5-1.7x
  // faster vectorised, as accurate, and no cancellation in 1 + tanh u for u ≪ 0).
  const T c = T(std::sqrt(2.0 / std::numbers::pi));
  const T u = c * (x + T(kGeluCubic) * x * x * x);
  return x / (T(1) + std::exp(T(-2) * u));
}

template <class T>
T gelu_derivative(T x, GeluApproximation a) {
  if (a == GeluApproximation::exact) {
    // d/dx x Φ(x) = Φ(x) + x φ(x)
    const T cdf = T(0.5) * (T(1) + erf_of(x / T(std::numbers::sqrt2)));
    const T pdf = std::exp(T(-0.5) * x * x) / T(std::sqrt(2.0 * std::numbers::pi));
    return cdf + x * pdf;
  }
  // u = c (x + a x³), y = ½ x (1 + tanh u) = x σ(2u) with s = σ(2u) = 1 / (1 + e), e = e^(−2u):
  // y' = s + x s (1 − s) 2c (1 + 3a x²), with 1 − s = e s for u > 0 (no cancellation near s = 1;
  // e is then at most 1, so never inf).
  const T c = T(std::sqrt(2.0 / std::numbers::pi));
  const T u = c * (x + T(kGeluCubic) * x * x * x);
  const T e = std::exp(T(-2) * u);
  const T s = T(1) / (T(1) + e);
  const T one_minus_s = u > T(0) ? e * s : T(1) - s;
  return s + x * s * one_minus_s * T(2) * c * (T(1) + T(3 * kGeluCubic) * x * x);
}

// The elementwise maps, vectorised with xsimd (the same formulas as gelu_value/gelu_derivative,
// which handle the tail and serve as the readable reference).
template <class T, bool Derivative>
void gelu_map(T* out, const T* x, const T* dy, std::size_t n, GeluApproximation a) {
  using batch = xsimd::batch<T>;
  constexpr std::size_t width = batch::size;
  const batch half = batch(T(0.5)), one = batch(T(1)), two = batch(T(2)), minus_two = batch(T(-2));
  const batch c = batch(T(std::sqrt(2.0 / std::numbers::pi)));
  const batch cubic = batch(T(kGeluCubic)), cubic3 = batch(T(3 * kGeluCubic));
  const batch inv_sqrt2 = batch(T(1 / std::numbers::sqrt2));
  const batch inv_sqrt2pi = batch(T(1 / std::sqrt(2.0 * std::numbers::pi)));
  std::size_t i = 0;
  for (; i + width <= n; i += width) {
    const batch v = batch::load_unaligned(x + i);
    batch r;
    if (a == GeluApproximation::exact) {
      const batch cdf = half * (one + erf_of(v * inv_sqrt2));
      r = Derivative ? cdf + v * xsimd::exp(-half * v * v) * inv_sqrt2pi : v * cdf;
    } else {
      const batch u = c * (v + cubic * v * v * v);
      if (Derivative) {
        const batch e = xsimd::exp(minus_two * u);
        const batch s = one / (one + e);
        const batch one_minus_s = xsimd::select(u > batch(T(0)), e * s, one - s);
        r = s + v * s * one_minus_s * two * c * (one + cubic3 * v * v);
      } else {
        r = v / (one + xsimd::exp(minus_two * u));
      }
    }
    if (Derivative) r *= batch::load_unaligned(dy + i);
    r.store_unaligned(out + i);
  }
  for (; i < n; ++i) {
    out[i] = Derivative ? dy[i] * gelu_derivative(x[i], a) : gelu_value(x[i], a);
  }
}

// gelu_map over [0, n) in parallel. Chunks start at multiples of kBlock (a multiple of the SIMD
// width), so every element takes the same path, and the result is the same, for any thread count.
template <class T, bool Derivative>
void gelu_map_parallel(T* out, const T* x, const T* dy, std::size_t n, GeluApproximation a) {
  constexpr std::size_t kBlock = 64;
  static_assert(kBlock % xsimd::batch<T>::size == 0);
  const std::size_t blocks = (n + kBlock - 1) / kBlock;
  detail::for_row_chunks(blocks, kBlock, [&](std::size_t b0, std::size_t b1, std::size_t) {
    const std::size_t i0 = b0 * kBlock, i1 = std::min(n, b1 * kBlock);
    gelu_map<T, Derivative>(out + i0, x + i0, Derivative ? dy + i0 : nullptr, i1 - i0, a);
  });
}
}  // namespace

namespace detail {

template <class T>
void gelu_elements(T* out, const T* x, const T* dy, std::size_t n, bool exact) {
  const auto a = exact ? GeluApproximation::exact : GeluApproximation::tanh;
  if (dy) {
    gelu_map_parallel<T, true>(out, x, dy, n, a);
  } else {
    gelu_map_parallel<T, false>(out, x, nullptr, n, a);
  }
}

template void gelu_elements<float>(float*, const float*, const float*, std::size_t, bool);
template void gelu_elements<double>(double*, const double*, const double*, std::size_t, bool);

}  // namespace detail

template <class T, std::size_t N>
Tensor<T, N> gelu_forward(GeluCache<T, N>& cache, const Tensor<T, N>& x,
                          GeluApproximation approximation) {
  Tensor<T, N> y(x.shape());
  gelu_map_parallel<T, false>(y.data(), x.data(), nullptr, x.size(), approximation);
  detail::assign_copy(cache.x, x);
  cache.approximation = approximation;
  return y;
}

template <class T, std::size_t N>
Tensor<T, N> gelu_backward(const Tensor<T, N>& dy, const GeluCache<T, N>& cache) {
  if (cache.x.size() == 0) {
    throw std::logic_error("gelu_backward: the cache is empty: call gelu_forward first");
  }
  const auto& shape = cache.x.shape();
  check_extents("gelu_backward", "dy",
                std::vector<std::size_t>(dy.shape().begin(), dy.shape().end()),
                std::vector<std::ptrdiff_t>(shape.begin(), shape.end()));
  Tensor<T, N> dx(shape);
  gelu_map_parallel<T, true>(dx.data(), cache.x.data(), dy.data(), dx.size(), cache.approximation);
  return dx;
}

#define ATTNLAB_INSTANTIATE_GELU(T, N)                                            \
  template Tensor<T, N> gelu_forward<T, N>(GeluCache<T, N>&, const Tensor<T, N>&, \
                                           GeluApproximation);                    \
  template Tensor<T, N> gelu_backward<T, N>(const Tensor<T, N>&, const GeluCache<T, N>&);
ATTNLAB_INSTANTIATE_GELU(float, 2)
ATTNLAB_INSTANTIATE_GELU(float, 3)
ATTNLAB_INSTANTIATE_GELU(double, 2)
ATTNLAB_INSTANTIATE_GELU(double, 3)
#undef ATTNLAB_INSTANTIATE_GELU

}  // namespace attnlab
