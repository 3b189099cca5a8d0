// Attention-health metrics on attention weights P (B,H,Tq,Tk) and scaled logits S (B,H,Tq,Tk).
//
// Per head, averaged over the (batch, query) rows that see at least one key:
//   entropy             −Σ_j p_j ln p_j (nats; ln Tk is uniform, 0 is one-hot)
//   max_weight          max_j p_j
//   saturated_fraction  fraction of rows with max_j p_j > kSaturatedWeight
//   jacobian_norm       ‖diag(p) − p pᵀ‖_F, by the closed form ‖J‖_F² = Σp² − 2Σp³ + (Σp²)²
// and max_abs_logit, the max over finite entries of |S| (the logits the softmax sees).
// The Jacobian norm is what the backward multiplies by: it goes to 0 as a row saturates.
#pragma once

#include <cstddef>
#include <vector>

#include "attnlab/tensor.hpp"

namespace attnlab::app {

inline constexpr double kSaturatedWeight = 0.99;

struct HeadHealth {
  double entropy = 0;
  double max_weight = 0;
  double saturated_fraction = 0;
  double jacobian_norm = 0;
  double max_abs_logit = 0;
};

// ‖diag(p) − p pᵀ‖_F for one row of n weights.
template <class T>
double softmax_jacobian_norm(const T* p, std::size_t n);

// weights: (B,H,Tq,Tk); scores: (B,H,Tq,Tk) or empty (size 0: max_abs_logit is then NaN).
// Returns one entry per head. Throws ShapeError if scores is non-empty and shaped differently.
template <class T>
std::vector<HeadHealth> attention_health(const Tensor4<T>& weights, const Tensor4<T>& scores);

// Per head: the mean over the batch of the weight that query row `query_row` puts on key
// key_pos[b] (examples with key_pos[b] < 0 are skipped). For recall: mass on the correct key.
template <class T>
std::vector<double> correct_key_mass(const Tensor4<T>& weights, std::size_t query_row,
                                     const std::vector<int>& key_pos);

}  // namespace attnlab::app
