// Reference: torch.nn.functional.cross_entropy(logits.view(-1, V), targets.view(-1),
// ignore_index=-100, reduction="mean"). Computed in double per row, max-subtracted.
#include "attnlab/train/loss.hpp"

#include <cmath>
#include <limits>

#include "attnlab/train/tasks.hpp"

namespace attnlab::train {

LossResult masked_cross_entropy(const Tensor3<float>& logits, const TokenIds& targets,
                                bool want_grad) {
  const std::size_t B = logits.shape()[0], T = logits.shape()[1], V = logits.shape()[2];
  check_shape("masked_cross_entropy", "targets", targets,
              {static_cast<std::ptrdiff_t>(B), static_cast<std::ptrdiff_t>(T)});
  LossResult r;
  if (want_grad) {
    r.dlogits = Tensor3<float>::from_shape({B, T, V});
    r.dlogits.fill(0.0f);
  }
  for (std::size_t i = 0; i < B * T; ++i)
    if (targets.data()[i] != kIgnoreIndex) ++r.labelled;
  if (r.labelled == 0) return r;
  const double inv = 1.0 / static_cast<double>(r.labelled);
  double total = 0;
  std::size_t correct = 0;
  for (std::size_t i = 0; i < B * T; ++i) {
    const int y = targets.data()[i];
    if (y == kIgnoreIndex) continue;
    check_arg(y >= 0 && static_cast<std::size_t>(y) < V, "masked_cross_entropy", "target",
              "in [0, " + std::to_string(V) + ") or -100", std::to_string(y));
    const float* row = logits.data() + i * V;
    double m = -std::numeric_limits<double>::infinity();
    std::size_t best = 0;
    for (std::size_t j = 0; j < V; ++j)
      if (row[j] > m || std::isnan(row[j])) {
        m = row[j];
        best = j;
        if (std::isnan(row[j])) break;
      }
    if (best == static_cast<std::size_t>(y)) ++correct;
    double z = 0;
    for (std::size_t j = 0; j < V; ++j) z += std::exp(static_cast<double>(row[j]) - m);
    const double lse = m + std::log(z);
    total += lse - static_cast<double>(row[y]);
    if (want_grad) {
      float* d = r.dlogits.data() + i * V;
      for (std::size_t j = 0; j < V; ++j)
        d[j] = static_cast<float>(std::exp(static_cast<double>(row[j]) - lse) * inv);
      d[y] -= static_cast<float>(inv);
    }
  }
  r.loss = total * inv;
  if (!std::isfinite(r.loss)) r.loss = std::numeric_limits<double>::quiet_NaN();
  r.accuracy = static_cast<double>(correct) * inv;
  return r;
}

TokenIds predictions(const Tensor3<float>& logits) {
  const std::size_t B = logits.shape()[0], T = logits.shape()[1], V = logits.shape()[2];
  TokenIds out = TokenIds::from_shape({B, T});
  for (std::size_t i = 0; i < B * T; ++i) {
    const float* row = logits.data() + i * V;
    std::size_t best = 0;
    for (std::size_t j = 1; j < V; ++j)
      if (row[j] > row[best]) best = j;
    out.data()[i] = static_cast<int>(best);
  }
  return out;
}

}  // namespace attnlab::train
