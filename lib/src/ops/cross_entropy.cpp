#include "attnlab/ops/cross_entropy.hpp"

#include <algorithm>
#include <cmath>
#include <stdexcept>
#include <string>

#include "attnlab/ops/softmax.hpp"

namespace attnlab {

template <class T, std::size_t N>
T cross_entropy_forward(CrossEntropyCache<T, N>& cache, const Tensor<T, N>& logits,
                        const xt::xtensor<int, N - 1>& targets, int ignore_index) {
  std::vector<std::ptrdiff_t> expected(targets.shape().begin(), targets.shape().end());
  expected.push_back(kAnyExtent);
  check_extents("cross_entropy_forward", "logits",
                std::vector<std::size_t>(logits.shape().begin(), logits.shape().end()), expected);
  const std::size_t V = logits.shape()[N - 1];
  check_arg(V > 0, "cross_entropy_forward", "logits", "a non-empty class axis", "V = 0");
  const std::size_t rows = targets.size();
  cache.p.resize(logits.shape());
  double total = 0;  // accumulated in double: many rows of float losses
  std::size_t labelled = 0;
  for (std::size_t r = 0; r < rows; ++r) {
    const T* x = logits.data() + r * V;
    T* p = cache.p.data() + r * V;
    const int target = targets.data()[r];
    const T row_max = *std::max_element(x, x + V);
    std::copy(x, x + V, p);
    const T sum = exp_shifted_inplace(p, V, row_max);  // p = exp(x − max), sum ≥ 1
    const T inv = T(1) / sum;
    for (std::size_t c = 0; c < V; ++c) p[c] *= inv;
    if (target == ignore_index) continue;
    if (target < 0 || static_cast<std::size_t>(target) >= V) {
      check_arg(false, "cross_entropy_forward", "targets[" + std::to_string(r) + "] (flat)",
                "a class in [0, " + std::to_string(V) + ") or ignore_index " +
                    std::to_string(ignore_index),
                std::to_string(target));
    }
    // −log p[target] = −(x[target] − max) + log Σ exp(x − max): finite for any finite logits.
    total += -(static_cast<double>(x[target] - row_max) - std::log(static_cast<double>(sum)));
    ++labelled;
  }
  cache.targets = targets;
  cache.ignore_index = ignore_index;
  cache.labelled = labelled;
  return labelled ? static_cast<T>(total / static_cast<double>(labelled)) : T(0);
}

template <class T, std::size_t N>
Tensor<T, N> cross_entropy_backward(const CrossEntropyCache<T, N>& cache, T dloss) {
  if (cache.p.size() == 0) {
    throw std::logic_error(
        "cross_entropy_backward: the cache is empty: call cross_entropy_forward first");
  }
  const std::size_t V = cache.p.shape()[N - 1];
  const std::size_t rows = cache.targets.size();
  Tensor<T, N> dlogits(cache.p.shape());
  dlogits.fill(T(0));
  if (cache.labelled == 0) return dlogits;  // nothing labelled: zero gradient, not NaN
  const T w = dloss / static_cast<T>(cache.labelled);
  for (std::size_t r = 0; r < rows; ++r) {
    const int target = cache.targets.data()[r];
    if (target == cache.ignore_index) continue;
    const T* p = cache.p.data() + r * V;
    T* d = dlogits.data() + r * V;
    for (std::size_t c = 0; c < V; ++c) d[c] = w * p[c];
    d[target] -= w;  // (p − onehot) / n
  }
  return dlogits;
}

template <class T, std::size_t N>
CrossEntropyResult<T, N> softmax_cross_entropy(const Tensor<T, N>& logits,
                                               const xt::xtensor<int, N - 1>& targets,
                                               int ignore_index) {
  CrossEntropyCache<T, N> cache;
  CrossEntropyResult<T, N> result;
  result.loss = cross_entropy_forward(cache, logits, targets, ignore_index);
  result.dlogits = cross_entropy_backward(cache);
  result.labelled = cache.labelled;
  return result;
}

#define ATTNLAB_INSTANTIATE_CE(T, N)                                                     \
  template T cross_entropy_forward<T, N>(CrossEntropyCache<T, N>&, const Tensor<T, N>&,  \
                                         const xt::xtensor<int, N - 1>&, int);           \
  template Tensor<T, N> cross_entropy_backward<T, N>(const CrossEntropyCache<T, N>&, T); \
  template CrossEntropyResult<T, N> softmax_cross_entropy<T, N>(                         \
      const Tensor<T, N>&, const xt::xtensor<int, N - 1>&, int);
ATTNLAB_INSTANTIATE_CE(float, 2)
ATTNLAB_INSTANTIATE_CE(float, 3)
ATTNLAB_INSTANTIATE_CE(double, 2)
ATTNLAB_INSTANTIATE_CE(double, 3)
#undef ATTNLAB_INSTANTIATE_CE

}  // namespace attnlab
