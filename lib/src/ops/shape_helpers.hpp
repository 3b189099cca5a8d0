// Private to lib/src/ops: small shape helpers for ops whose rank is a template parameter, and the
// shape checks that the norms share.
#pragma once

#include <cstddef>
#include <stdexcept>
#include <string>
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

// The checks of a row norm's backward (LayerNorm, RMSNorm) named op: a cache that `forward` filled,
// dy shaped as the cached x, and gamma of the forward's width C, which it returns.
template <class T, std::size_t N, class Cache>
std::size_t check_norm_backward(const char* op, const char* forward, const Tensor<T, N>& dy,
                                const Cache& cache, const Tensor1<T>& gamma) {
  if (cache.rstd.empty()) {
    throw std::logic_error(std::string(op) + ": the cache is empty: call " + forward + " first");
  }
  const auto& shape = cache.x.shape();
  check_extents(op, "dy", dims(dy.shape()),
                std::vector<std::ptrdiff_t>(shape.begin(), shape.end()));
  const std::size_t C = gamma.size();
  check_arg(C * cache.rstd.size() == cache.x.size(), op, "gamma", "the (C,) vector of the forward",
            "C = " + std::to_string(C));
  return C;
}

}  // namespace attnlab::shape_helpers
