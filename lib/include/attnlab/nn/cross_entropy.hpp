// The training loss on the backend: mean softmax cross-entropy of logits (B, T, V) that stay where
// the model computed them, with dL/dlogits kept there for the backward pass (the fused op of
// DeviceOps: the arithmetic of ops/cross_entropy.hpp on the CPU). Only the loss value crosses to
// the host.
#pragma once

#include "attnlab/buffer.hpp"
#include "attnlab/device_ops.hpp"
#include "attnlab/tensor.hpp"

namespace attnlab {

template <class T>
class CrossEntropyLoss {
 public:
  // logits (B, T, V) on `ops`; targets (B, T) on the host, in [0, V) or kIgnoreIndex
  // (std::invalid_argument naming the first bad one, ShapeError on a shape mismatch). Returns the
  // mean over the labelled positions (0 when none is; non-finite logits give NaN). Synchronises.
  double forward(DeviceOps<T>& ops, const Buffer<T>& logits, const TokenIds& targets);
  // dL/dlogits (B, T, V) of the last forward, on its backend. std::logic_error before forward.
  const Buffer<T>& dlogits() const;

 private:
  Buffer<int> targets_;
  Buffer<T> loss_, dlogits_, row_loss_;
  bool has_forward_ = false;
};

extern template class CrossEntropyLoss<float>;
extern template class CrossEntropyLoss<double>;

}  // namespace attnlab
