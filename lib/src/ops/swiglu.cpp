#include "attnlab/ops/swiglu.hpp"

#include <stdexcept>
#include <string>
#include <vector>

#include "../parallel_rows.hpp"
#include "attnlab/kernel_math.hpp"
#include "kernels/swiglu.hpp"

namespace attnlab {

namespace detail {

template <class T>
void swiglu_forward_rows(T* y, const T* h, std::size_t rows, std::size_t F) {
  for_row_chunks(rows, F, [&](std::size_t r0, std::size_t r1, std::size_t) {
    for (std::size_t r = r0; r < r1; ++r) {
      const T* a = h + r * 2 * F;
      const T* b = a + F;
      T* yr = y + r * F;
      for (std::size_t c = 0; c < F; ++c) yr[c] = kernel_math::silu_element(a[c]) * b[c];
    }
  });
}

template <class T>
void swiglu_backward_rows(T* dh, const T* dy, const T* h, std::size_t rows, std::size_t F) {
  for_row_chunks(rows, F, [&](std::size_t r0, std::size_t r1, std::size_t) {
    for (std::size_t r = r0; r < r1; ++r) {
      const T* a = h + r * 2 * F;
      const T* b = a + F;
      const T* g = dy + r * F;
      T* da = dh + r * 2 * F;
      T* db = da + F;
      for (std::size_t c = 0; c < F; ++c) {
        da[c] = g[c] * b[c] * kernel_math::swiglu_gate_slope(a[c]);
        db[c] = g[c] * kernel_math::silu_element(a[c]);
      }
    }
  });
}

}  // namespace detail

namespace {

template <class T, std::size_t N>
std::vector<std::size_t> shape_of(const Tensor<T, N>& t) {
  return std::vector<std::size_t>(t.shape().begin(), t.shape().end());
}

}  // namespace

template <class T, std::size_t N>
Tensor<T, N> swiglu_forward(SwigluCache<T, N>& cache, const Tensor<T, N>& h) {
  const std::size_t last = h.shape()[N - 1];
  if (last % 2 != 0 || last == 0) {
    throw ShapeError("swiglu_forward", "h", std::vector<std::ptrdiff_t>(N, kAnyExtent), shape_of(h),
                     "the last extent even and nonzero: [gate | up], 2F");
  }
  auto shape = h.shape();
  shape[N - 1] = last / 2;
  Tensor<T, N> y(shape);
  detail::swiglu_forward_rows(y.data(), h.data(), h.size() / last, last / 2);
  detail::assign_copy(cache.h, h);
  return y;
}

template <class T, std::size_t N>
Tensor<T, N> swiglu_backward(const Tensor<T, N>& dy, const SwigluCache<T, N>& cache) {
  const char* op = "swiglu_backward";
  if (cache.h.size() == 0) {
    throw std::logic_error(std::string(op) + ": the cache is empty: call swiglu_forward first");
  }
  const auto& shape = cache.h.shape();
  std::vector<std::ptrdiff_t> want(shape.begin(), shape.end());
  want[N - 1] /= 2;
  check_extents(op, "dy", shape_of(dy), want);
  Tensor<T, N> dh(shape);
  const std::size_t F = shape[N - 1] / 2;
  detail::swiglu_backward_rows(dh.data(), dy.data(), cache.h.data(), dy.size() / F, F);
  return dh;
}

#define ATTNLAB_INSTANTIATE_SWIGLU(T, N)                                               \
  template Tensor<T, N> swiglu_forward<T, N>(SwigluCache<T, N>&, const Tensor<T, N>&); \
  template Tensor<T, N> swiglu_backward<T, N>(const Tensor<T, N>&, const SwigluCache<T, N>&);
ATTNLAB_INSTANTIATE_SWIGLU(float, 2)
ATTNLAB_INSTANTIATE_SWIGLU(float, 3)
ATTNLAB_INSTANTIATE_SWIGLU(double, 2)
ATTNLAB_INSTANTIATE_SWIGLU(double, 3)
#undef ATTNLAB_INSTANTIATE_SWIGLU

template void detail::swiglu_forward_rows<float>(float*, const float*, std::size_t, std::size_t);
template void detail::swiglu_forward_rows<double>(double*, const double*, std::size_t, std::size_t);
template void detail::swiglu_backward_rows<float>(float*, const float*, const float*, std::size_t,
                                                  std::size_t);
template void detail::swiglu_backward_rows<double>(double*, const double*, const double*,
                                                   std::size_t, std::size_t);

}  // namespace attnlab
