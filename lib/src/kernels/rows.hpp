// Vectorised (xsimd) helpers on one contiguous row, shared by the CPU cores: the softmax
// (lib/src/ops/softmax.cpp), the fused attention path, the norms, and the CPU backend
// (lib/backends/cpu). Host only: xsimd, so never included by what nvcc compiles.
#pragma once

#include <algorithm>
#include <cstddef>
#include <limits>

#include <xsimd/xsimd.hpp>

namespace attnlab::row_kernels {

// max over x[0..n), vectorised; -inf for n = 0. NaN entries may be ignored: callers check for NaN
// where the max alone would hide it (a row of NaN and -inf).
template <class T>
inline T row_max(const T* x, std::size_t n) {
  using batch = xsimd::batch<T>;
  constexpr std::size_t width = batch::size;
  T m = -std::numeric_limits<T>::infinity();
  std::size_t i = 0;
  if (n >= width) {
    batch acc = batch::load_unaligned(x);
    for (i = width; i + width <= n; i += width) acc = xsimd::max(acc, batch::load_unaligned(x + i));
    alignas(64) T lanes[width];
    acc.store_aligned(lanes);
    m = *std::max_element(lanes, lanes + width);
  }
  for (; i < n; ++i) m = std::max(m, x[i]);
  return m;
}

// x[i] *= factor, vectorised.
template <class T>
inline void scale_inplace(T* x, std::size_t n, T factor) {
  using batch = xsimd::batch<T>;
  constexpr std::size_t width = batch::size;
  const batch f(factor);
  std::size_t i = 0;
  for (; i + width <= n; i += width) (batch::load_unaligned(x + i) * f).store_unaligned(x + i);
  for (; i < n; ++i) x[i] *= factor;
}

// Σ a[i] b[i], vectorised (lane-wise partial sums, then a horizontal add).
template <class T>
inline T dot(const T* a, const T* b, std::size_t n) {
  using batch = xsimd::batch<T>;
  constexpr std::size_t width = batch::size;
  batch acc0(T(0)), acc1(T(0));
  std::size_t i = 0;
  for (; i + 2 * width <= n; i += 2 * width) {
    acc0 = xsimd::fma(batch::load_unaligned(a + i), batch::load_unaligned(b + i), acc0);
    acc1 = xsimd::fma(batch::load_unaligned(a + i + width), batch::load_unaligned(b + i + width),
                      acc1);
  }
  for (; i + width <= n; i += width) {
    acc0 = xsimd::fma(batch::load_unaligned(a + i), batch::load_unaligned(b + i), acc0);
  }
  T sum = xsimd::hadd(acc0 + acc1);
  for (; i < n; ++i) sum += a[i] * b[i];
  return sum;
}

// Σ x[i] and Σ (x[i] − c)², vectorised like dot: lane-wise partial sums in two accumulators, a
// horizontal add, then the tail in order. The order depends only on n and the SIMD width (the same
// in every translation unit), never on the thread count.
template <class T>
inline T sum(const T* x, std::size_t n) {
  using batch = xsimd::batch<T>;
  constexpr std::size_t width = batch::size;
  batch acc0(T(0)), acc1(T(0));
  std::size_t i = 0;
  for (; i + 2 * width <= n; i += 2 * width) {
    acc0 += batch::load_unaligned(x + i);
    acc1 += batch::load_unaligned(x + i + width);
  }
  for (; i + width <= n; i += width) acc0 += batch::load_unaligned(x + i);
  T s = xsimd::hadd(acc0 + acc1);
  for (; i < n; ++i) s += x[i];
  return s;
}

template <class T>
inline T sum_squared_deviation(const T* x, std::size_t n, T c) {
  using batch = xsimd::batch<T>;
  constexpr std::size_t width = batch::size;
  const batch cv(c);
  batch acc0(T(0)), acc1(T(0));
  std::size_t i = 0;
  for (; i + 2 * width <= n; i += 2 * width) {
    const batch d0 = batch::load_unaligned(x + i) - cv;
    const batch d1 = batch::load_unaligned(x + i + width) - cv;
    acc0 = xsimd::fma(d0, d0, acc0);
    acc1 = xsimd::fma(d1, d1, acc1);
  }
  for (; i + width <= n; i += width) {
    const batch d = batch::load_unaligned(x + i) - cv;
    acc0 = xsimd::fma(d, d, acc0);
  }
  T s = xsimd::hadd(acc0 + acc1);
  for (; i < n; ++i) s += (x[i] - c) * (x[i] - c);
  return s;
}

}  // namespace attnlab::row_kernels
