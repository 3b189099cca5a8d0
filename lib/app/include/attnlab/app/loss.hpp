// The training loss as the trainer sees it: mean softmax cross-entropy over the labelled positions
// (targets != kIgnoreIndex), its gradient, and the accuracy of the argmax prediction.
#pragma once

#include "attnlab/tensor.hpp"

namespace attnlab::app {

struct LossResult {
  double loss = 0;      // mean over labelled positions (NaN if a logit is non-finite)
  double accuracy = 0;  // fraction of labelled positions whose argmax is the target
  std::size_t labelled = 0;
  Tensor3<float> dlogits;  // (B, T, V) dloss/dlogits when requested, else empty
};

// logits: (B, T, V); targets: (B, T) in [0, V) or kIgnoreIndex. Throws ShapeError on mismatch and
// std::invalid_argument for a target outside [0, V).
LossResult masked_cross_entropy(const Tensor3<float>& logits, const TokenIds& targets,
                                bool want_grad);

// argmax over V per position: (B, T).
TokenIds predictions(const Tensor3<float>& logits);

}  // namespace attnlab::app
