// Softmax cross-entropy fused into one op pair: stable, with an ignore index and mean reduction
// over the labelled positions.
// Reference: torch.nn.functional.cross_entropy(logits, targets, ignore_index=-100,
// reduction='mean').
//
//   loss = −(1/n) Σ_{labelled (b,t)} log softmax(logits[b,t,:])[target[b,t]],  n = #labelled
//   dlogits[b,t,:] = (softmax(logits[b,t,:]) − onehot(target)) / n  at labelled positions, else 0
//
// log-softmax is computed as (x − max) − log Σ exp(x − max), so logits of ±1e4 stay finite.
// A batch with no labelled position has loss 0 and dlogits 0 (never NaN).
#pragma once

#include <cstddef>

#include "attnlab/tensor.hpp"

namespace attnlab {

// Targets equal to this are unlabelled: no loss, no gradient (PyTorch's default ignore_index).
inline constexpr int kIgnoreIndex = -100;

// N = 2: logits (B, V), targets (B,);  N = 3: logits (B, T, V), targets (B, T).
template <class T, std::size_t N>
struct CrossEntropyCache {
  Tensor<T, N> p;                   // (..., V) softmax of the logits
  xt::xtensor<int, N - 1> targets;  // (...)
  int ignore_index = kIgnoreIndex;
  std::size_t labelled = 0;  // n, the number of labelled positions
};

// Returns the mean loss over labelled positions and fills `cache`. Targets must be in [0, V) or
// ignore_index (std::invalid_argument otherwise, naming the position); ShapeError on mismatch.
template <class T, std::size_t N>
T cross_entropy_forward(CrossEntropyCache<T, N>& cache, const Tensor<T, N>& logits,
                        const xt::xtensor<int, N - 1>& targets, int ignore_index = kIgnoreIndex);

// Returns dlogits (..., V) = dloss · (p − onehot) / n at labelled positions, 0 elsewhere (assigns).
// Throws std::logic_error on an empty cache.
template <class T, std::size_t N>
Tensor<T, N> cross_entropy_backward(const CrossEntropyCache<T, N>& cache, T dloss = T(1));

template <class T, std::size_t N>
struct CrossEntropyResult {
  T loss = 0;
  Tensor<T, N> dlogits;
  std::size_t labelled = 0;
};

// Forward and backward in one call: the common case in a training step.
template <class T, std::size_t N>
CrossEntropyResult<T, N> softmax_cross_entropy(const Tensor<T, N>& logits,
                                               const xt::xtensor<int, N - 1>& targets,
                                               int ignore_index = kIgnoreIndex);

}  // namespace attnlab
