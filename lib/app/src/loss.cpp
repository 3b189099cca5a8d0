// The loss is the stack's fused softmax cross-entropy (ops/cross_entropy.hpp); this adds the
// argmax accuracy over the labelled positions.
#include "attnlab/app/loss.hpp"

#include <cmath>
#include <limits>

#include "attnlab/ops/cross_entropy.hpp"

namespace attnlab::app {

LossResult masked_cross_entropy(const Tensor3<float>& logits, const TokenIds& targets,
                                bool want_grad) {
  LossResult r;
  const TokenIds pred = predictions(logits);  // checks nothing; shapes are checked below
  if (want_grad) {
    auto ce = softmax_cross_entropy<float, 3>(logits, targets);
    r.loss = ce.loss;
    r.labelled = ce.labelled;
    r.dlogits = std::move(ce.dlogits);
  } else {
    CrossEntropyCache<float, 3> cache;
    r.loss = cross_entropy_forward<float, 3>(cache, logits, targets);
    r.labelled = cache.labelled;
  }
  if (!std::isfinite(r.loss)) r.loss = std::numeric_limits<double>::quiet_NaN();
  std::size_t correct = 0;
  for (std::size_t i = 0; i < targets.size(); ++i)
    if (targets.data()[i] != kIgnoreIndex && pred.data()[i] == targets.data()[i]) ++correct;
  r.accuracy = r.labelled ? static_cast<double>(correct) / static_cast<double>(r.labelled) : 0.0;
  return r;
}

TokenIds predictions(const Tensor3<float>& logits) {
  const std::size_t B = logits.shape()[0], T = logits.shape()[1], V = logits.shape()[2];
  TokenIds out = TokenIds::from_shape({B, T});
  for (std::size_t i = 0; i < B * T; ++i) {
    const float* row = logits.data() + i * V;
    std::size_t best = 0;
    for (std::size_t j = 1; j < V; ++j)
      if (row[j] > row[best] || std::isnan(row[j])) best = j;
    out.data()[i] = static_cast<int>(best);
  }
  return out;
}

}  // namespace attnlab::app
