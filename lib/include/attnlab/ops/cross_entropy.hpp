// Softmax cross-entropy fused into one op pair: stable, with an ignore index and mean reduction
// over the labelled positions, and an optional z-loss.
// Reference: torch.nn.functional.cross_entropy(logits, targets, ignore_index=-100,
// reduction='mean'); the z-loss is PaLM's (Chowdhery et al. 2022, §5; Wortsman et al. 2023 use
// z = 1e-4), which keeps log Z, the log of the softmax's normaliser, near 0.
//
//   log Z[b,t] = logsumexp(logits[b,t,:])
//   loss = (1/n) Σ_{labelled (b,t)} (−log softmax(logits[b,t,:])[target[b,t]] + z · log Z[b,t]²)
//          = cross_entropy + z_term,  n = #labelled
//   dlogits[b,t,:] = (softmax(logits[b,t,:]) · (1 + 2 z log Z[b,t]) − onehot(target)) / n  at
//                    labelled positions, else 0
//
// log-softmax is computed as (x − max) − log Σ exp(x − max), so logits of ±1e4 stay finite; log Z
// is max + log Σ exp(x − max), from the same pass. A batch with no labelled position has loss 0 and
// dlogits 0 (never NaN).
#pragma once

#include <cstddef>
#include <vector>

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
  std::size_t labelled = 0;         // n, the number of labelled positions
  T z_loss = 0;                     // z, the z-loss coefficient
  std::vector<double> log_z;        // (rows,) log Z of each labelled row (0 elsewhere), row-major
  T cross_entropy = 0, z_term = 0;  // the loss's two parts
};

// Returns the mean loss over labelled positions (cross-entropy + z-loss term; both also in
// `cache`) and fills `cache`. Targets must be in [0, V) or ignore_index (std::invalid_argument
// otherwise, naming the position); z_loss finite and >= 0 (0: none); ShapeError on mismatch.
template <class T, std::size_t N>
T cross_entropy_forward(CrossEntropyCache<T, N>& cache, const Tensor<T, N>& logits,
                        const xt::xtensor<int, N - 1>& targets, int ignore_index = kIgnoreIndex,
                        T z_loss = T(0));

// Returns dlogits (..., V) = dloss · (p (1 + 2 z log Z) − onehot) / n at labelled positions, 0
// elsewhere (assigns). Throws std::logic_error on an empty cache.
template <class T, std::size_t N>
Tensor<T, N> cross_entropy_backward(const CrossEntropyCache<T, N>& cache, T dloss = T(1));

template <class T, std::size_t N>
struct CrossEntropyResult {
  T loss = 0;  // cross_entropy + z_term
  Tensor<T, N> dlogits;
  std::size_t labelled = 0;
  T cross_entropy = 0, z_term = 0;
};

// Forward and backward in one call: the common case in a training step.
template <class T, std::size_t N>
CrossEntropyResult<T, N> softmax_cross_entropy(const Tensor<T, N>& logits,
                                               const xt::xtensor<int, N - 1>& targets,
                                               int ignore_index = kIgnoreIndex, T z_loss = T(0));

}  // namespace attnlab
