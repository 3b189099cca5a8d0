#include "attnlab/ops/linear.hpp"

#include <stdexcept>

#include "attnlab/blas.hpp"

namespace attnlab {

namespace {
std::ptrdiff_t e(std::size_t x) {
  return static_cast<std::ptrdiff_t>(x);
}

// The expected shape of a rank-N tensor whose last extent is `last` (leading extents free).
template <std::size_t N>
std::vector<std::ptrdiff_t> with_last(std::size_t last) {
  std::vector<std::ptrdiff_t> shape(N, kAnyExtent);
  shape[N - 1] = e(last);
  return shape;
}

template <class S>
std::vector<std::size_t> dims(const S& s) {
  return std::vector<std::size_t>(s.begin(), s.end());
}
}  // namespace

template <class T, std::size_t N>
Tensor<T, N> linear_forward(LinearCache<T, N>& cache, const Tensor<T, N>& x, const Tensor2<T>& w,
                            const Tensor1<T>* b) {
  const std::size_t in = w.shape()[0], out = w.shape()[1];
  check_extents("linear_forward", "x", dims(x.shape()), with_last<N>(in));
  if (b) check_shape("linear_forward", "b", *b, {e(out)});
  const std::size_t rows = x.size() / (in ? in : 1);
  auto y_shape = x.shape();
  y_shape[N - 1] = out;
  Tensor<T, N> y(y_shape);
  if (rows > 0 && out > 0) {
    if (in == 0) {
      y.fill(T(0));
    } else {
      //                                               (rows,In) x (In,Out) -> (rows,Out)
      blas::gemm<T>(false, false, int(rows), int(out), int(in), T(1), x.data(), int(in), w.data(),
                    int(out), T(0), y.data(), int(out));
    }
    if (b) {
      for (std::size_t r = 0; r < rows; ++r) {
        T* row = y.data() + r * out;
        for (std::size_t c = 0; c < out; ++c) row[c] += (*b)(c);
      }
    }
  }
  cache.x = x;
  return y;
}

template <class T, std::size_t N>
LinearGrads<T, N> linear_backward(const Tensor<T, N>& dy, const LinearCache<T, N>& cache,
                                  const Tensor2<T>& w, bool with_bias) {
  if (cache.x.size() == 0) {
    throw std::logic_error("linear_backward: the cache is empty: call linear_forward first");
  }
  const std::size_t in = w.shape()[0], out = w.shape()[1];
  auto expected = dims(cache.x.shape());
  expected[N - 1] = out;
  check_extents("linear_backward", "dy", dims(dy.shape()),
                std::vector<std::ptrdiff_t>(expected.begin(), expected.end()));
  check_extents("linear_backward", "x (cache)", dims(cache.x.shape()), with_last<N>(in));
  const std::size_t rows = cache.x.size() / in;
  LinearGrads<T, N> g{Tensor<T, N>(cache.x.shape()), Tensor2<T>({in, out}), Tensor1<T>()};
  // dx = dy Wᵀ                                       (rows,Out) x (Out,In) -> (rows,In)
  blas::gemm<T>(false, true, int(rows), int(in), int(out), T(1), dy.data(), int(out), w.data(),
                int(out), T(0), g.dx.data(), int(in));
  // dW = xᵀ dy                                       (In,rows) x (rows,Out) -> (In,Out)
  blas::gemm<T>(true, false, int(in), int(out), int(rows), T(1), cache.x.data(), int(in), dy.data(),
                int(out), T(0), g.dw.data(), int(out));
  if (with_bias) {
    g.db = Tensor1<T>::from_shape({out});
    g.db.fill(T(0));
    for (std::size_t r = 0; r < rows; ++r) {
      const T* row = dy.data() + r * out;
      for (std::size_t c = 0; c < out; ++c) g.db(c) += row[c];
    }
  }
  return g;
}

#define ATTNLAB_INSTANTIATE_LINEAR(T, N)                                                          \
  template Tensor<T, N> linear_forward<T, N>(LinearCache<T, N>&, const Tensor<T, N>&,             \
                                             const Tensor2<T>&, const Tensor1<T>*);               \
  template LinearGrads<T, N> linear_backward<T, N>(const Tensor<T, N>&, const LinearCache<T, N>&, \
                                                   const Tensor2<T>&, bool);
ATTNLAB_INSTANTIATE_LINEAR(float, 2)
ATTNLAB_INSTANTIATE_LINEAR(float, 3)
ATTNLAB_INSTANTIATE_LINEAR(double, 2)
ATTNLAB_INSTANTIATE_LINEAR(double, 3)
#undef ATTNLAB_INSTANTIATE_LINEAR

}  // namespace attnlab
