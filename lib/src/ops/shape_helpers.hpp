// Private to lib/src/ops: small shape helpers for ops whose rank is a template parameter.
#pragma once

#include <cstddef>
#include <vector>

#include "attnlab/tensor.hpp"

namespace attnlab::shape_helpers {

// (*, ..., *, last): any leading extents, a fixed last one.
template <std::size_t N>
std::vector<std::ptrdiff_t> last_is(std::size_t last) {
  std::vector<std::ptrdiff_t> shape(N, kAnyExtent);
  shape[N - 1] = static_cast<std::ptrdiff_t>(last);
  return shape;
}

// The extents of an xtensor shape as a vector, for check_extents.
template <class S>
std::vector<std::size_t> dims(const S& s) {
  return std::vector<std::size_t>(s.begin(), s.end());
}

}  // namespace attnlab::shape_helpers
