#include "attnlab/ops/relu.hpp"

#include <stdexcept>

namespace attnlab {

template <class T, std::size_t N>
Tensor<T, N> relu_forward(ReluCache<T, N>& cache, const Tensor<T, N>& x) {
  Tensor<T, N> y(x.shape());
  for (std::size_t i = 0; i < x.size(); ++i) {
    y.data()[i] = x.data()[i] > T(0) ? x.data()[i] : T(0);
  }
  cache.x = x;
  return y;
}

template <class T, std::size_t N>
Tensor<T, N> relu_backward(const Tensor<T, N>& dy, const ReluCache<T, N>& cache) {
  if (cache.x.size() == 0) {
    throw std::logic_error("relu_backward: the cache is empty: call relu_forward first");
  }
  const auto& shape = cache.x.shape();
  check_extents("relu_backward", "dy",
                std::vector<std::size_t>(dy.shape().begin(), dy.shape().end()),
                std::vector<std::ptrdiff_t>(shape.begin(), shape.end()));
  Tensor<T, N> dx(shape);
  for (std::size_t i = 0; i < dx.size(); ++i) {
    dx.data()[i] = cache.x.data()[i] > T(0) ? dy.data()[i] : T(0);
  }
  return dx;
}

#define ATTNLAB_INSTANTIATE_RELU(T, N)                                             \
  template Tensor<T, N> relu_forward<T, N>(ReluCache<T, N>&, const Tensor<T, N>&); \
  template Tensor<T, N> relu_backward<T, N>(const Tensor<T, N>&, const ReluCache<T, N>&);
ATTNLAB_INSTANTIATE_RELU(float, 2)
ATTNLAB_INSTANTIATE_RELU(float, 3)
ATTNLAB_INSTANTIATE_RELU(double, 2)
ATTNLAB_INSTANTIATE_RELU(double, 3)
#undef ATTNLAB_INSTANTIATE_RELU

}  // namespace attnlab
