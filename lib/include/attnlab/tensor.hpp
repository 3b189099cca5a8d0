// Tensor aliases, shape formatting and ShapeError.
//
// Shape glossary used in every comment: B batch, T sequence (Tq queries, Tk keys), C model width,
// H heads, D head dim of q/k (d_k), Dv head dim of v, V vocabulary, F feed-forward width.
// Every tensor is an evaluated, contiguous, row-major xt::xtensor<T, N> with T = float or double.
#pragma once

// First, before any xtensor header.
#include "attnlab/xtensor_config.hpp"

#include <cstddef>
#include <initializer_list>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

#include <xtensor/xtensor.hpp>

namespace attnlab {

template <class T, std::size_t N>
using Tensor = xt::xtensor<T, N>;
template <class T>
using Tensor1 = xt::xtensor<T, 1>;
template <class T>
using Tensor2 = xt::xtensor<T, 2>;
template <class T>
using Tensor3 = xt::xtensor<T, 3>;
template <class T>
using Tensor4 = xt::xtensor<T, 4>;

// Key padding mask (B, Tk): true = may attend (the polarity of PyTorch's
// scaled_dot_product_attention).
using KeyMask = xt::xtensor<bool, 2>;
// Token ids and targets (B, T).
using TokenIds = xt::xtensor<int, 2>;

// A wildcard in an expected shape: any extent is accepted and printed as '*'.
inline constexpr std::ptrdiff_t kAnyExtent = -1;

// "(2, 4, *, 16)"; negative extents print as '*'.
std::string format_shape(const std::vector<std::ptrdiff_t>& extents);
std::string format_shape(const std::vector<std::size_t>& extents);

template <class S>
std::string format_shape_of(const S& shape) {
  return format_shape(std::vector<std::size_t>(shape.begin(), shape.end()));
}

// Thrown for a tensor argument whose rank or extents are wrong. The message names the operation,
// the argument, the expected shape and the actual one:
//   "sdpa_forward: k expected (2, 4, *, 16), got (2, 4, 7, 8)"
class ShapeError : public std::invalid_argument {
 public:
  ShapeError(std::string_view op, std::string_view arg, const std::vector<std::ptrdiff_t>& expected,
             const std::vector<std::size_t>& actual, std::string_view detail = {});
};

// Throws ShapeError unless `shape` has exactly the expected extents (kAnyExtent matches anything).
void check_extents(std::string_view op, std::string_view arg,
                   const std::vector<std::size_t>& actual,
                   const std::vector<std::ptrdiff_t>& expected);

template <class E>
void check_shape(std::string_view op, std::string_view arg, const E& tensor,
                 std::initializer_list<std::ptrdiff_t> expected) {
  const auto& s = tensor.shape();
  check_extents(op, arg, std::vector<std::size_t>(s.begin(), s.end()),
                std::vector<std::ptrdiff_t>(expected));
}

// A value for a message: `text` whole, or its first `max` bytes (never half a UTF-8 character)
// followed by "... (N characters)" (a value from a file may be megabytes long).
std::string shown_text(std::string_view text, std::size_t max);

// A number for a message, as an ostream writes it by default (6 significant digits: "0.001",
// "1e-12", "inf", "nan").
std::string number_text(double x);

// Throws std::invalid_argument "op: name expected <what>, got <value>" unless ok (the value
// through shown_text, 200 bytes).
void check_arg(bool ok, std::string_view op, std::string_view name, std::string_view what,
               std::string_view got);

}  // namespace attnlab
