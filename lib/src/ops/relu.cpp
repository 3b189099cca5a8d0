#include "attnlab/ops/relu.hpp"

#include <stdexcept>
#include <string>
#include <vector>

#include "../parallel_rows.hpp"
#include "kernels/relu.hpp"

namespace attnlab {

namespace detail {

template <class T>
void relu_forward_elements(T* y, const T* x, std::size_t n, bool squared) {
  for_row_chunks(n, 1, [&](std::size_t i0, std::size_t i1, std::size_t) {
    if (squared) {
      for (std::size_t i = i0; i < i1; ++i) y[i] = kernel_math::relu_squared_element(x[i]);
    } else {
      for (std::size_t i = i0; i < i1; ++i) y[i] = kernel_math::relu_element(x[i]);
    }
  });
}

template <class T>
void relu_backward_elements(T* dx, const T* dy, const T* x, std::size_t n, bool squared) {
  for_row_chunks(n, 1, [&](std::size_t i0, std::size_t i1, std::size_t) {
    if (squared) {
      for (std::size_t i = i0; i < i1; ++i)
        dx[i] = kernel_math::relu_squared_backward_element(dy[i], x[i]);
    } else {
      for (std::size_t i = i0; i < i1; ++i) dx[i] = kernel_math::relu_backward_element(dy[i], x[i]);
    }
  });
}

}  // namespace detail

namespace {

template <class T, std::size_t N>
Tensor<T, N> forward(ReluCache<T, N>& cache, const Tensor<T, N>& x, bool squared) {
  Tensor<T, N> y(x.shape());
  detail::relu_forward_elements(y.data(), x.data(), x.size(), squared);
  detail::assign_copy(cache.x, x);
  return y;
}

template <class T, std::size_t N>
Tensor<T, N> backward(const Tensor<T, N>& dy, const ReluCache<T, N>& cache, bool squared,
                      const char* op) {
  if (cache.x.size() == 0) {
    throw std::logic_error(std::string(op) + ": the cache is empty: call " +
                           (squared ? "relu_squared_forward" : "relu_forward") + " first");
  }
  const auto& shape = cache.x.shape();
  check_extents(op, "dy", std::vector<std::size_t>(dy.shape().begin(), dy.shape().end()),
                std::vector<std::ptrdiff_t>(shape.begin(), shape.end()));
  Tensor<T, N> dx(shape);
  detail::relu_backward_elements(dx.data(), dy.data(), cache.x.data(), dx.size(), squared);
  return dx;
}

}  // namespace

template <class T, std::size_t N>
Tensor<T, N> relu_forward(ReluCache<T, N>& cache, const Tensor<T, N>& x) {
  return forward(cache, x, false);
}

template <class T, std::size_t N>
Tensor<T, N> relu_backward(const Tensor<T, N>& dy, const ReluCache<T, N>& cache) {
  return backward(dy, cache, false, "relu_backward");
}

template <class T, std::size_t N>
Tensor<T, N> relu_squared_forward(ReluCache<T, N>& cache, const Tensor<T, N>& x) {
  return forward(cache, x, true);
}

template <class T, std::size_t N>
Tensor<T, N> relu_squared_backward(const Tensor<T, N>& dy, const ReluCache<T, N>& cache) {
  return backward(dy, cache, true, "relu_squared_backward");
}

#define ATTNLAB_INSTANTIATE_RELU(T, N)                                                     \
  template Tensor<T, N> relu_forward<T, N>(ReluCache<T, N>&, const Tensor<T, N>&);         \
  template Tensor<T, N> relu_backward<T, N>(const Tensor<T, N>&, const ReluCache<T, N>&);  \
  template Tensor<T, N> relu_squared_forward<T, N>(ReluCache<T, N>&, const Tensor<T, N>&); \
  template Tensor<T, N> relu_squared_backward<T, N>(const Tensor<T, N>&, const ReluCache<T, N>&);
ATTNLAB_INSTANTIATE_RELU(float, 2)
ATTNLAB_INSTANTIATE_RELU(float, 3)
ATTNLAB_INSTANTIATE_RELU(double, 2)
ATTNLAB_INSTANTIATE_RELU(double, 3)
#undef ATTNLAB_INSTANTIATE_RELU

template void detail::relu_forward_elements<float>(float*, const float*, std::size_t, bool);
template void detail::relu_forward_elements<double>(double*, const double*, std::size_t, bool);
template void detail::relu_backward_elements<float>(float*, const float*, const float*, std::size_t,
                                                    bool);
template void detail::relu_backward_elements<double>(double*, const double*, const double*,
                                                     std::size_t, bool);

}  // namespace attnlab
