#include "attnlab/ops/softcap.hpp"

#include <cmath>
#include <stdexcept>
#include <string>
#include <vector>

#include "../parallel_rows.hpp"
#include "attnlab/kernel_math.hpp"
#include "kernels/softcap.hpp"

namespace attnlab {

namespace detail {

template <class T>
void softcap_forward_elements(T* y, const T* x, std::size_t n, T cap) {
  for_row_chunks(n, 1, [&](std::size_t i0, std::size_t i1, std::size_t) {
    for (std::size_t i = i0; i < i1; ++i) y[i] = kernel_math::softcap_element(x[i], cap);
  });
}

template <class T>
void softcap_backward_elements(T* dx, const T* dy, const T* y, std::size_t n, T cap) {
  for_row_chunks(n, 1, [&](std::size_t i0, std::size_t i1, std::size_t) {
    for (std::size_t i = i0; i < i1; ++i) dx[i] = dy[i] * kernel_math::softcap_slope(y[i], cap);
  });
}

}  // namespace detail

void check_softcap(std::string_view op, std::string_view name, double cap) {
  check_arg(std::isfinite(cap) && cap > 0, op, name, "a finite cap > 0", std::to_string(cap));
}

template <class T, std::size_t N>
Tensor<T, N> softcap_forward(SoftcapCache<T, N>& cache, const Tensor<T, N>& x, double cap) {
  check_softcap("softcap_forward", "cap", cap);
  Tensor<T, N> y(x.shape());
  detail::softcap_forward_elements(y.data(), x.data(), x.size(), static_cast<T>(cap));
  detail::assign_copy(cache.y, y);
  cache.cap = cap;
  return y;
}

template <class T, std::size_t N>
Tensor<T, N> softcap_backward(const Tensor<T, N>& dy, const SoftcapCache<T, N>& cache) {
  const char* op = "softcap_backward";
  if (cache.cap == 0) {
    throw std::logic_error(std::string(op) + ": the cache is empty: call softcap_forward first");
  }
  const auto& shape = cache.y.shape();
  check_extents(op, "dy", std::vector<std::size_t>(dy.shape().begin(), dy.shape().end()),
                std::vector<std::ptrdiff_t>(shape.begin(), shape.end()));
  Tensor<T, N> dx(shape);
  detail::softcap_backward_elements(dx.data(), dy.data(), cache.y.data(), dx.size(),
                                    static_cast<T>(cache.cap));
  return dx;
}

#define ATTNLAB_INSTANTIATE_SOFTCAP(T, N)                                                        \
  template Tensor<T, N> softcap_forward<T, N>(SoftcapCache<T, N>&, const Tensor<T, N>&, double); \
  template Tensor<T, N> softcap_backward<T, N>(const Tensor<T, N>&, const SoftcapCache<T, N>&);
ATTNLAB_INSTANTIATE_SOFTCAP(float, 2)
ATTNLAB_INSTANTIATE_SOFTCAP(float, 3)
ATTNLAB_INSTANTIATE_SOFTCAP(double, 2)
ATTNLAB_INSTANTIATE_SOFTCAP(double, 3)
#undef ATTNLAB_INSTANTIATE_SOFTCAP

template void detail::softcap_forward_elements<float>(float*, const float*, std::size_t, float);
template void detail::softcap_forward_elements<double>(double*, const double*, std::size_t, double);
template void detail::softcap_backward_elements<float>(float*, const float*, const float*,
                                                       std::size_t, float);
template void detail::softcap_backward_elements<double>(double*, const double*, const double*,
                                                        std::size_t, double);

}  // namespace attnlab
