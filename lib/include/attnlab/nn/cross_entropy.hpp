// The training loss on the backend: mean softmax cross-entropy of logits (B, T, V) that stay where
// the model computed them, plus PaLM's z-loss z · log Z² when z > 0, with dL/dlogits kept there for
// the backward pass (the fused op of DeviceOps: the arithmetic of ops/cross_entropy.hpp on the
// CPU). Only the loss values cross to the host.
#pragma once

#include "attnlab/buffer.hpp"
#include "attnlab/device_ops.hpp"
#include "attnlab/tensor.hpp"

namespace attnlab {

template <class T>
class CrossEntropyLoss {
 public:
  // z_loss: the z-loss coefficient z, finite and >= 0 (0: plain cross-entropy; else
  // std::invalid_argument naming it).
  explicit CrossEntropyLoss(double z_loss = 0);

  // logits (B, T, V) on `ops`; targets (B, T) on the host, in [0, V) or kIgnoreIndex
  // (std::invalid_argument naming the first bad one, ShapeError on a shape mismatch). Returns the
  // mean over the labelled positions of cross-entropy + z-loss term (0 when none is labelled;
  // non-finite logits give NaN); cross_entropy() and z_term() are its parts. dlogits() is then
  // `weight` times the gradient of that loss: a weighted piece of a larger batch's mean (gradient
  // accumulation, a rank's shard), added by the backward into the gradients. Synchronises.
  double forward(DeviceOps<T>& ops, const Buffer<T>& logits, const TokenIds& targets,
                 double weight = 1);
  // The last forward's mean cross-entropy and mean z-loss term (their sum is its loss).
  double cross_entropy() const { return cross_entropy_; }
  double z_term() const { return z_term_; }
  double z_loss() const { return z_loss_; }
  // dL/dlogits (B, T, V) of the last forward, on its backend. std::logic_error before forward.
  const Buffer<T>& dlogits() const;

 private:
  double z_loss_ = 0;
  Buffer<int> targets_;
  Buffer<T> loss_, dlogits_, row_loss_;
  double cross_entropy_ = 0, z_term_ = 0;
  bool has_forward_ = false;
};

extern template class CrossEntropyLoss<float>;
extern template class CrossEntropyLoss<double>;

}  // namespace attnlab
