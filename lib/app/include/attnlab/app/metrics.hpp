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
#include <limits>
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

// Per head, where its largest |scaled logit| is: the example b, query i and key j, the |logit|,
// and the query and key the core saw there (after QK-norm and RoPE): ‖q_i‖, ‖k_j‖ and their
// cosine q·k / (‖q‖‖k‖). The logit is s · q·k (times a softcap's squash): with one scale per head
// it is s·‖q‖‖k‖·|cos|, so the three say whether a growth comes from the norms or the alignment.
// NaN everywhere for a head whose scores have no finite entry, or a NaN (a diverged eval).
struct MaxLogitPair {
  double abs_logit = std::numeric_limits<double>::quiet_NaN();
  double q_norm = std::numeric_limits<double>::quiet_NaN();
  double k_norm = std::numeric_limits<double>::quiet_NaN();
  double cos = std::numeric_limits<double>::quiet_NaN();
  std::size_t b = 0, i = 0, j = 0;
};

// scores (B,H,Tq,Tk) as attention_health takes them; q (B,H,Tq,D) and k (B,Hkv,Tk,D) with Hkv
// dividing H (query head h reads key head h / (H / Hkv)). One entry per head; ShapeError on
// mismatched shapes.
template <class T>
std::vector<MaxLogitPair> max_logit_pairs(const Tensor4<T>& scores, const Tensor4<T>& q,
                                          const Tensor4<T>& k);

// σ₁, the largest singular value, of the rows x cols matrix at `a` whose row r starts at
// a + r * ld: power iteration on AᵀA from a fixed start, `iterations` times (each a product by A
// and by Aᵀ, in double), then ‖A v‖ for the unit v reached. A lower bound that converges to σ₁
// at the rate (σ₂/σ₁)^(2·iterations); exact for rank one. 0 for a zero matrix.
double spectral_norm(const float* a, std::size_t rows, std::size_t cols, std::size_t ld,
                     int iterations = 50);

// σ₁ of each head's block of a projection W (C, H·D): the columns [h·D, (h+1)·D).
std::vector<double> head_spectral_norms(const float* w, std::size_t rows, std::size_t heads,
                                        std::size_t head_dim, int iterations = 50);

}  // namespace attnlab::app
