#include "attnlab/ops/softmax.hpp"

#include "kernels/rows.hpp"

#include <algorithm>
#include <cmath>
#include <limits>

#include <xsimd/xsimd.hpp>

namespace attnlab {

template <class T>
T exp_shifted_inplace(T* x, std::size_t n, T shift) {
  using batch = xsimd::batch<T>;
  constexpr std::size_t width = batch::size;
  const batch shift_b(shift);
  batch acc(T(0));
  std::size_t i = 0;
  for (; i + width <= n; i += width) {
    const batch e = xsimd::exp(batch::load_unaligned(x + i) - shift_b);
    e.store_unaligned(x + i);
    acc += e;
  }
  T sum = xsimd::hadd(acc);
  for (; i < n; ++i) {
    x[i] = std::exp(x[i] - shift);
    sum += x[i];
  }
  return sum;
}

using row_kernels::dot;
using row_kernels::row_max;
using row_kernels::scale_inplace;

template <class T>
void softmax_rows_forward(T* p, const T* s, std::size_t rows, std::size_t cols) {
  for (std::size_t r = 0; r < rows; ++r) {
    const T* src = s + r * cols;
    T* dst = p + r * cols;
    const T max = row_max(src, cols);  // ignores NaN
    if (max == -std::numeric_limits<T>::infinity()) {
      // No visible entry (all -inf): the row contributes nothing, and never NaN. A NaN logit is
      // not caught here on purpose: it propagates, so that divergence is seen, not hidden.
      const bool has_nan = std::any_of(src, src + cols, [](T x) { return std::isnan(x); });
      std::fill(dst, dst + cols, has_nan ? std::numeric_limits<T>::quiet_NaN() : T(0));
      continue;
    }
    if (dst != src) std::copy(src, src + cols, dst);
    const T sum = exp_shifted_inplace(dst, cols, max);  // exp(-inf - max) = 0
    scale_inplace(dst, cols, T(1) / sum);               // sum >= 1: the max entry gives exp(0)
  }
}

template <class T>
void softmax_rows_backward(T* ds, const T* dp, const T* p, std::size_t rows, std::size_t cols) {
  using batch = xsimd::batch<T>;
  constexpr std::size_t width = batch::size;
  for (std::size_t r = 0; r < rows; ++r) {
    const T* pr = p + r * cols;
    const T* dpr = dp + r * cols;
    T* dsr = ds + r * cols;
    const T row_dot = dot(dpr, pr, cols);  // rowsum(dp ⊙ p)
    const batch row_dot_b(row_dot);
    std::size_t c = 0;
    for (; c + width <= cols; c += width) {
      const batch d = batch::load_unaligned(dpr + c) - row_dot_b;
      (batch::load_unaligned(pr + c) * d).store_unaligned(dsr + c);
    }
    for (; c < cols; ++c) dsr[c] = pr[c] * (dpr[c] - row_dot);
  }
}

template <class T, std::size_t N>
Tensor<T, N> softmax_forward(const Tensor<T, N>& s) {
  Tensor<T, N> p(s.shape());
  const std::size_t cols = N ? s.shape()[N - 1] : 1;
  const std::size_t rows = cols ? s.size() / cols : 0;
  softmax_rows_forward(p.data(), s.data(), rows, cols);
  return p;
}

template <class T, std::size_t N>
Tensor<T, N> softmax_backward(const Tensor<T, N>& dp, const Tensor<T, N>& p) {
  std::vector<std::ptrdiff_t> expected(p.shape().begin(), p.shape().end());
  check_extents("softmax_backward", "dp",
                std::vector<std::size_t>(dp.shape().begin(), dp.shape().end()), expected);
  Tensor<T, N> ds(p.shape());
  const std::size_t cols = p.shape()[N - 1];
  const std::size_t rows = cols ? p.size() / cols : 0;
  softmax_rows_backward(ds.data(), dp.data(), p.data(), rows, cols);
  return ds;
}

template <class T>
Tensor2<T> softmax_jacobian(const Tensor1<T>& p) {
  const std::size_t k = p.size();
  Tensor2<T> jac({k, k});
  for (std::size_t i = 0; i < k; ++i) {
    for (std::size_t j = 0; j < k; ++j) jac(i, j) = (i == j ? p(i) : T(0)) - p(i) * p(j);
  }
  return jac;
}

#define ATTNLAB_INSTANTIATE_SOFTMAX_N(T, N)                         \
  template Tensor<T, N> softmax_forward<T, N>(const Tensor<T, N>&); \
  template Tensor<T, N> softmax_backward<T, N>(const Tensor<T, N>&, const Tensor<T, N>&);
#define ATTNLAB_INSTANTIATE_SOFTMAX(T)                                                      \
  template T exp_shifted_inplace<T>(T*, std::size_t, T);                                    \
  template void softmax_rows_forward<T>(T*, const T*, std::size_t, std::size_t);            \
  template void softmax_rows_backward<T>(T*, const T*, const T*, std::size_t, std::size_t); \
  template Tensor2<T> softmax_jacobian<T>(const Tensor1<T>&);                               \
  ATTNLAB_INSTANTIATE_SOFTMAX_N(T, 1)                                                       \
  ATTNLAB_INSTANTIATE_SOFTMAX_N(T, 2)                                                       \
  ATTNLAB_INSTANTIATE_SOFTMAX_N(T, 3)                                                       \
  ATTNLAB_INSTANTIATE_SOFTMAX_N(T, 4)
ATTNLAB_INSTANTIATE_SOFTMAX(float)
ATTNLAB_INSTANTIATE_SOFTMAX(double)
#undef ATTNLAB_INSTANTIATE_SOFTMAX
#undef ATTNLAB_INSTANTIATE_SOFTMAX_N

}  // namespace attnlab
