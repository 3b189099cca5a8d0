#include "attnlab/ops/gelu.hpp"

#include <algorithm>
#include <cmath>
#include <numbers>
#include <stdexcept>

#include <xsimd/xsimd.hpp>

#include "../parallel_rows.hpp"
#include "gelu_kernels.hpp"

namespace attnlab {

namespace {
constexpr double kGeluCubic = 0.044715;

template <class T>
T gelu_value(T x, GeluApproximation a) {
  if (a == GeluApproximation::exact) {
    return T(0.5) * x * (T(1) + std::erf(x / T(std::numbers::sqrt2)));
  }
  const T c = T(std::sqrt(2.0 / std::numbers::pi));
  return T(0.5) * x * (T(1) + std::tanh(c * (x + T(kGeluCubic) * x * x * x)));
}

template <class T>
T gelu_derivative(T x, GeluApproximation a) {
  if (a == GeluApproximation::exact) {
    // d/dx x Φ(x) = Φ(x) + x φ(x)
    const T cdf = T(0.5) * (T(1) + std::erf(x / T(std::numbers::sqrt2)));
    const T pdf = std::exp(T(-0.5) * x * x) / T(std::sqrt(2.0 * std::numbers::pi));
    return cdf + x * pdf;
  }
  // u = c (x + a x³), y = ½ x (1 + tanh u): y' = ½ (1 + tanh u) + ½ x (1 − tanh² u) c (1 + 3a x²)
  const T c = T(std::sqrt(2.0 / std::numbers::pi));
  const T t = std::tanh(c * (x + T(kGeluCubic) * x * x * x));
  return T(0.5) * (T(1) + t) + T(0.5) * x * (T(1) - t * t) * c * (T(1) + T(3 * kGeluCubic) * x * x);
}

// The elementwise maps, vectorised with xsimd (the same formulas as gelu_value/gelu_derivative,
// which handle the tail and serve as the readable reference).
template <class T, bool Derivative>
void gelu_map(T* out, const T* x, const T* dy, std::size_t n, GeluApproximation a) {
  using batch = xsimd::batch<T>;
  constexpr std::size_t width = batch::size;
  const batch half = batch(T(0.5)), one = batch(T(1));
  const batch c = batch(T(std::sqrt(2.0 / std::numbers::pi)));
  const batch cubic = batch(T(kGeluCubic)), cubic3 = batch(T(3 * kGeluCubic));
  const batch inv_sqrt2 = batch(T(1 / std::numbers::sqrt2));
  const batch inv_sqrt2pi = batch(T(1 / std::sqrt(2.0 * std::numbers::pi)));
  std::size_t i = 0;
  for (; i + width <= n; i += width) {
    const batch v = batch::load_unaligned(x + i);
    batch r;
    if (a == GeluApproximation::exact) {
      const batch cdf = half * (one + xsimd::erf(v * inv_sqrt2));
      r = Derivative ? cdf + v * xsimd::exp(-half * v * v) * inv_sqrt2pi : v * cdf;
    } else {
      const batch t = xsimd::tanh(c * (v + cubic * v * v * v));
      r = Derivative ? half * (one + t) + half * v * (one - t * t) * c * (one + cubic3 * v * v)
                     : half * v * (one + t);
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
