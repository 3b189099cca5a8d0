#include "attnlab/ops/cross_entropy.hpp"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <stdexcept>
#include <string>
#include <vector>

#include "../parallel_rows.hpp"
#include "attnlab/ops/softmax.hpp"
#include "kernels/cross_entropy.hpp"

namespace attnlab {

namespace detail {

namespace {
bool labelled_row(int target, std::size_t V, int ignore_index) {
  return target != ignore_index && target >= 0 && static_cast<std::size_t>(target) < V;
}
}  // namespace

std::string shown_number(double v) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.6g", v);
  return buf;
}

template <class T>
std::size_t cross_entropy_forward_rows(T* loss, T* z_term, T* p, std::vector<double>& row_loss,
                                       std::vector<double>& row_log_z, const T* logits,
                                       const int* targets, std::size_t rows, std::size_t V,
                                       int ignore_index, double z_loss) {
  row_loss.assign(rows, 0.0);
  row_log_z.assign(rows, 0.0);
  for_row_chunks(rows, V, [&](std::size_t r0, std::size_t r1, std::size_t) {
    for (std::size_t r = r0; r < r1; ++r) {
      const T* x = logits + r * V;
      T* pr = p + r * V;
      const T row_max = *std::max_element(x, x + V);
      std::copy(x, x + V, pr);
      const T sum = exp_shifted_inplace(pr, V, row_max);  // p = exp(x − max), sum ≥ 1
      const T inv = T(1) / sum;
      for (std::size_t c = 0; c < V; ++c) pr[c] *= inv;
      if (!labelled_row(targets[r], V, ignore_index)) continue;
      // −log p[target] = −(x[target] − max) + log Σ exp(x − max): finite for any finite logits.
      const auto target = static_cast<std::size_t>(targets[r]);
      const double log_sum = std::log(static_cast<double>(sum));
      row_loss[r] = -(static_cast<double>(x[target] - row_max) - log_sum);
      row_log_z[r] = static_cast<double>(row_max) + log_sum;  // log Z = logsumexp(x)
    }
  });
  double total = 0, total_z = 0;
  std::size_t labelled = 0;
  for (std::size_t r = 0; r < rows; ++r) {
    if (!labelled_row(targets[r], V, ignore_index)) continue;
    total += row_loss[r];
    total_z += row_log_z[r] * row_log_z[r];
    ++labelled;
  }
  const double n = static_cast<double>(labelled);
  if (loss) *loss = labelled ? static_cast<T>(total / n) : T(0);
  if (z_term) *z_term = labelled ? static_cast<T>(z_loss * total_z / n) : T(0);
  return labelled;
}

template <class T>
void cross_entropy_backward_rows(T* dlogits, const T* p, const int* targets, std::size_t rows,
                                 std::size_t V, int ignore_index, T w, const double* log_z,
                                 double z_loss) {
  for_row_chunks(rows, V, [&](std::size_t r0, std::size_t r1, std::size_t) {
    for (std::size_t r = r0; r < r1; ++r) {
      const T* pr = p + r * V;
      T* d = dlogits + r * V;
      if (!labelled_row(targets[r], V, ignore_index)) {
        std::fill(d, d + V, T(0));
        continue;
      }
      // d(z · logZ²)/dx = 2 z logZ · p: the z-loss scales p (the factor is w exactly when z = 0).
      const T scale = z_loss != 0
                          ? static_cast<T>(static_cast<double>(w) * (1.0 + 2.0 * z_loss * log_z[r]))
                          : w;
      for (std::size_t c = 0; c < V; ++c) d[c] = scale * pr[c];
      d[targets[r]] -= w;  // (p (1 + 2 z logZ) − onehot) / n
    }
  });
}

}  // namespace detail

template <class T, std::size_t N>
T cross_entropy_forward(CrossEntropyCache<T, N>& cache, const Tensor<T, N>& logits,
                        const xt::xtensor<int, N - 1>& targets, int ignore_index, T z_loss) {
  std::vector<std::ptrdiff_t> expected(targets.shape().begin(), targets.shape().end());
  expected.push_back(kAnyExtent);
  check_extents("cross_entropy_forward", "logits",
                std::vector<std::size_t>(logits.shape().begin(), logits.shape().end()), expected);
  const std::size_t V = logits.shape()[N - 1];
  check_arg(V > 0, "cross_entropy_forward", "logits", "a non-empty class axis", "V = 0");
  check_arg(std::isfinite(static_cast<double>(z_loss)) && z_loss >= T(0), "cross_entropy_forward",
            "z_loss", "a finite number >= 0", detail::shown_number(static_cast<double>(z_loss)));
  const std::size_t rows = targets.size();
  for (std::size_t r = 0; r < rows; ++r) {
    const int target = targets.data()[r];
    if (target != ignore_index && (target < 0 || static_cast<std::size_t>(target) >= V)) {
      check_arg(false, "cross_entropy_forward", "targets[" + std::to_string(r) + "] (flat)",
                "a class in [0, " + std::to_string(V) + ") or ignore_index " +
                    std::to_string(ignore_index),
                std::to_string(target));
    }
  }
  cache.p.resize(logits.shape());
  std::vector<double> row_loss;
  T loss = 0, z_term = 0;
  const std::size_t labelled = detail::cross_entropy_forward_rows(
      &loss, &z_term, cache.p.data(), row_loss, cache.log_z, logits.data(), targets.data(), rows, V,
      ignore_index, static_cast<double>(z_loss));
  cache.targets = targets;
  cache.ignore_index = ignore_index;
  cache.labelled = labelled;
  cache.z_loss = z_loss;
  cache.cross_entropy = loss;
  cache.z_term = z_term;
  return loss + z_term;
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
  const T w = cache.labelled ? dloss / static_cast<T>(cache.labelled) : T(0);
  detail::cross_entropy_backward_rows(dlogits.data(), cache.p.data(), cache.targets.data(), rows, V,
                                      cache.ignore_index, w, cache.log_z.data(),
                                      static_cast<double>(cache.z_loss));
  return dlogits;
}

template <class T, std::size_t N>
CrossEntropyResult<T, N> softmax_cross_entropy(const Tensor<T, N>& logits,
                                               const xt::xtensor<int, N - 1>& targets,
                                               int ignore_index, T z_loss) {
  CrossEntropyCache<T, N> cache;
  CrossEntropyResult<T, N> result;
  result.loss = cross_entropy_forward(cache, logits, targets, ignore_index, z_loss);
  result.dlogits = cross_entropy_backward(cache);
  result.labelled = cache.labelled;
  result.cross_entropy = cache.cross_entropy;
  result.z_term = cache.z_term;
  return result;
}

#define ATTNLAB_INSTANTIATE_CE(T, N)                                                     \
  template T cross_entropy_forward<T, N>(CrossEntropyCache<T, N>&, const Tensor<T, N>&,  \
                                         const xt::xtensor<int, N - 1>&, int, T);        \
  template Tensor<T, N> cross_entropy_backward<T, N>(const CrossEntropyCache<T, N>&, T); \
  template CrossEntropyResult<T, N> softmax_cross_entropy<T, N>(                         \
      const Tensor<T, N>&, const xt::xtensor<int, N - 1>&, int, T);
ATTNLAB_INSTANTIATE_CE(float, 2)
ATTNLAB_INSTANTIATE_CE(float, 3)
ATTNLAB_INSTANTIATE_CE(double, 2)
ATTNLAB_INSTANTIATE_CE(double, 3)
#undef ATTNLAB_INSTANTIATE_CE

#define ATTNLAB_INSTANTIATE_CE_ROWS(T)                                                           \
  template std::size_t detail::cross_entropy_forward_rows<T>(                                    \
      T*, T*, T*, std::vector<double>&, std::vector<double>&, const T*, const int*, std::size_t, \
      std::size_t, int, double);                                                                 \
  template void detail::cross_entropy_backward_rows<T>(                                          \
      T*, const T*, const int*, std::size_t, std::size_t, int, T, const double*, double);
ATTNLAB_INSTANTIATE_CE_ROWS(float)
ATTNLAB_INSTANTIATE_CE_ROWS(double)
#undef ATTNLAB_INSTANTIATE_CE_ROWS

}  // namespace attnlab
