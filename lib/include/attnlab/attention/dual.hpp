// Forward-mode dual numbers for attention programs (attnlab/attention/program.hpp): a value with
// its derivative with respect to the score and with respect to up to kDualSlots captured parameter
// elements, carried exactly by every operation (the chain rule), as ceres::Jet does. A program's
// score function is a template over its score type; the backward instantiates it with Dual<T>.
// Math functions: call them unqualified after `using std::tanh;` and argument-dependent lookup
// finds these overloads for a Dual.
#pragma once

#include <cmath>
#include <cstdint>
#include <type_traits>

#include "attnlab/attention/host_device.hpp"

namespace attnlab::attention {
// ---- Dual numbers

// The parameter slots a Dual carries: the number of distinct captured parameters one score may
// depend on (a relative-position bias and a per-head slope use 2). More throws at the call.
inline constexpr int kDualSlots = 4;

// A value with its derivative with respect to the score (ds) and with respect to up to kDualSlots
// captured parameters, each named by an id (parameter k, element index). Forward-mode: every
// operation carries the derivatives exactly, by the chain rule. n = -1 marks an overflow of slots.
template <class T>
struct Dual {
  T v = T(0);
  T ds = T(0);
  int n = 0;
  std::uint64_t id[kDualSlots] = {};
  T dp[kDualSlots] = {};

  Dual() = default;
  ATTNLAB_HOST_DEVICE Dual(T value)
      : v(value) {}  // NOLINT: constants mix with duals, as in ceres::Jet
  template <class U, class = std::enable_if_t<std::is_arithmetic_v<U> && !std::is_same_v<U, T>>>
  ATTNLAB_HOST_DEVICE Dual(U value) : v(static_cast<T>(value)) {}  // NOLINT

  // The derivative with respect to parameter element `id` (0 when it does not depend on it).
  ATTNLAB_HOST_DEVICE T partial(std::uint64_t want) const {
    for (int s = 0; s < n; ++s) {
      if (id[s] == want) return dp[s];
    }
    return T(0);
  }
};

namespace dual_detail {
// r = a.slots · ka + b.slots · kb, merging equal ids; overflow marks r.n = -1.
template <class T>
ATTNLAB_HOST_DEVICE void combine(Dual<T>& r, const Dual<T>& a, T ka, const Dual<T>& b, T kb) {
  if (a.n < 0 || b.n < 0) {
    r.n = -1;
    return;
  }
  int n = 0;
  std::uint64_t id[kDualSlots];
  T dp[kDualSlots];
  for (int s = 0; s < a.n; ++s) id[n] = a.id[s], dp[n++] = a.dp[s] * ka;
  for (int s = 0; s < b.n; ++s) {
    int at = 0;
    while (at < n && id[at] != b.id[s]) ++at;
    if (at < n) {
      dp[at] += b.dp[s] * kb;
    } else if (n == kDualSlots) {
      r.n = -1;
      return;
    } else {
      id[n] = b.id[s], dp[n++] = b.dp[s] * kb;
    }
  }
  r.n = n;
  for (int s = 0; s < n; ++s) r.id[s] = id[s], r.dp[s] = dp[s];
}
// r = f(a) with f'(a.v) = slope: every derivative scaled by the slope.
template <class T>
ATTNLAB_HOST_DEVICE Dual<T> chain(const Dual<T>& a, T value, T slope) {
  Dual<T> r(value);
  r.ds = a.ds * slope;
  r.n = a.n;
  for (int s = 0; s < a.n; ++s) r.id[s] = a.id[s], r.dp[s] = a.dp[s] * slope;
  return r;
}
}  // namespace dual_detail

template <class T>
ATTNLAB_HOST_DEVICE Dual<T> operator+(const Dual<T>& a, const Dual<T>& b) {
  Dual<T> r(a.v + b.v);
  r.ds = a.ds + b.ds;
  dual_detail::combine(r, a, T(1), b, T(1));
  return r;
}
template <class T>
ATTNLAB_HOST_DEVICE Dual<T> operator-(const Dual<T>& a, const Dual<T>& b) {
  Dual<T> r(a.v - b.v);
  r.ds = a.ds - b.ds;
  dual_detail::combine(r, a, T(1), b, T(-1));
  return r;
}
template <class T>
ATTNLAB_HOST_DEVICE Dual<T> operator*(const Dual<T>& a, const Dual<T>& b) {
  Dual<T> r(a.v * b.v);
  r.ds = a.ds * b.v + a.v * b.ds;
  dual_detail::combine(r, a, b.v, b, a.v);
  return r;
}
template <class T>
ATTNLAB_HOST_DEVICE Dual<T> operator/(const Dual<T>& a, const Dual<T>& b) {
  const T inv = T(1) / b.v, q = a.v / b.v;
  Dual<T> r(q);
  r.ds = (a.ds - q * b.ds) * inv;
  dual_detail::combine(r, a, inv, b, -q * inv);
  return r;
}
template <class T>
ATTNLAB_HOST_DEVICE Dual<T> operator-(const Dual<T>& a) {
  return dual_detail::chain(a, -a.v, T(-1));
}
template <class T>
ATTNLAB_HOST_DEVICE Dual<T> operator+(const Dual<T>& a) {
  return a;
}

// Mixed with plain numbers (a constant has no derivative).
#define ATTNLAB_DUAL_MIXED(op)                                                   \
  template <class T, class U, class = std::enable_if_t<std::is_arithmetic_v<U>>> \
  ATTNLAB_HOST_DEVICE Dual<T> operator op(const Dual<T>& a, U b) {               \
    return a op Dual<T>(static_cast<T>(b));                                      \
  }                                                                              \
  template <class T, class U, class = std::enable_if_t<std::is_arithmetic_v<U>>> \
  ATTNLAB_HOST_DEVICE Dual<T> operator op(U a, const Dual<T>& b) {               \
    return Dual<T>(static_cast<T>(a)) op b;                                      \
  }
ATTNLAB_DUAL_MIXED(+)
ATTNLAB_DUAL_MIXED(-)
ATTNLAB_DUAL_MIXED(*)
ATTNLAB_DUAL_MIXED(/)
#undef ATTNLAB_DUAL_MIXED

// Comparisons compare values: branches in a program choose a piece, whose derivative is used.
#define ATTNLAB_DUAL_COMPARE(op)                                                 \
  template <class T>                                                             \
  ATTNLAB_HOST_DEVICE bool operator op(const Dual<T>& a, const Dual<T>& b) {     \
    return a.v op b.v;                                                           \
  }                                                                              \
  template <class T, class U, class = std::enable_if_t<std::is_arithmetic_v<U>>> \
  ATTNLAB_HOST_DEVICE bool operator op(const Dual<T>& a, U b) {                  \
    return a.v op static_cast<T>(b);                                             \
  }                                                                              \
  template <class T, class U, class = std::enable_if_t<std::is_arithmetic_v<U>>> \
  ATTNLAB_HOST_DEVICE bool operator op(U a, const Dual<T>& b) {                  \
    return static_cast<T>(a) op b.v;                                             \
  }
ATTNLAB_DUAL_COMPARE(<)
ATTNLAB_DUAL_COMPARE(<=)
ATTNLAB_DUAL_COMPARE(>)
ATTNLAB_DUAL_COMPARE(>=)
ATTNLAB_DUAL_COMPARE(==)
ATTNLAB_DUAL_COMPARE(!=)
#undef ATTNLAB_DUAL_COMPARE

template <class T>
ATTNLAB_HOST_DEVICE Dual<T> exp(const Dual<T>& a) {
  const T e = std::exp(a.v);
  return dual_detail::chain(a, e, e);
}
template <class T>
ATTNLAB_HOST_DEVICE Dual<T> log(const Dual<T>& a) {
  return dual_detail::chain(a, std::log(a.v), T(1) / a.v);
}
template <class T>
ATTNLAB_HOST_DEVICE Dual<T> tanh(const Dual<T>& a) {
  const T t = std::tanh(a.v);
  return dual_detail::chain(a, t, T(1) - t * t);
}
template <class T>
ATTNLAB_HOST_DEVICE Dual<T> sqrt(const Dual<T>& a) {
  const T r = std::sqrt(a.v);
  return dual_detail::chain(a, r, T(0.5) / r);
}
template <class T>
ATTNLAB_HOST_DEVICE Dual<T> abs(const Dual<T>& a) {
  return dual_detail::chain(a, std::abs(a.v), a.v < T(0) ? T(-1) : T(1));
}
template <class T>
ATTNLAB_HOST_DEVICE Dual<T> sin(const Dual<T>& a) {
  return dual_detail::chain(a, std::sin(a.v), std::cos(a.v));
}
template <class T>
ATTNLAB_HOST_DEVICE Dual<T> cos(const Dual<T>& a) {
  return dual_detail::chain(a, std::cos(a.v), -std::sin(a.v));
}

// The plain value of a score type (T itself, or a Dual's value).
template <class T>
ATTNLAB_HOST_DEVICE T value_of(T x) {
  return x;
}
template <class T>
ATTNLAB_HOST_DEVICE T value_of(const Dual<T>& x) {
  return x.v;
}

}  // namespace attnlab::attention
