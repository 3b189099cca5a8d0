// Where a training step runs, chosen once per run so that the trainer's loop has no device
// branches: the host (Transformer + Optimizer) or a device (DeviceTransformer + DeviceOptimizer,
// with the host model and optimizer kept as the mirror that checkpoints and weight norms read).
//
// Deliberately thin: the redesign will make the two models one, and this interface then goes.
// Internal to the app (lib/app/src).
#pragma once

#include <memory>
#include <string>

#include "attnlab/app/model.hpp"
#include "attnlab/app/tasks.hpp"
#include "attnlab/optim/adamw.hpp"
#include "attnlab/optim/sgd.hpp"

namespace attnlab {
template <class T>
class DeviceOps;
}  // namespace attnlab

namespace attnlab::app {

// Layer l's attention in the last eval forward: P and S (B,H,T,T), and for layer 0 the unscaled
// q·k (B,H,T,T) of the Var(q·k)/d_k premise check (empty for other layers).
struct LayerAttention {
  Tensor4<float> weights, scores, dots;
};

class TrainBackend {
 public:
  virtual ~TrainBackend() = default;
  virtual std::string name() const = 0;  // "cpu" or the DeviceOps name
  virtual void set_lr(double lr) = 0;
  // Training forward and mean loss of the batch (may be non-finite).
  virtual double forward_loss(const Batch& batch) = 0;
  // Gradients of the last forward_loss (previous grads replaced).
  virtual void backward() = 0;
  virtual double grad_norm(const std::string& parameter) = 0;
  virtual void clip_grad_norm(double max_norm) = 0;
  virtual void step() = 0;
  // Waits for the work queued so far (a device backend runs asynchronously): what the throughput
  // timing calls before reading the clock.
  virtual void synchronize() = 0;
  // Eval forward: (B, T, V) logits; attention(l) then describes it.
  virtual Tensor3<float> eval_logits(const Batch& batch) = 0;
  virtual LayerAttention attention(std::size_t layer) = 0;
  // Brings the host model's parameters (and the host optimizer's state) up to date; a no-op on
  // the host.
  virtual void sync_host(bool optimizer_state) = 0;
  // After a non-finite loss on `batch`: the first stage whose output was non-finite ("" if none).
  virtual std::string locate_nonfinite(const Batch& batch) = 0;
};

// The host backend trains `model` with `optimizer` directly.
std::unique_ptr<TrainBackend> host_backend(Model& model, Optimizer<float>& optimizer);

// The device backend: a device-resident copy of `model` and of `optimizer` (its state included,
// so a resumed run continues there), trained with the same options. `ops` null: the CUDA backend
// (std::invalid_argument naming "device" when no usable CUDA device is present).
std::unique_ptr<TrainBackend> device_backend(Model& model, Optimizer<float>& optimizer,
                                             const AdamWOptions* adamw, const SgdOptions* sgd,
                                             DeviceOps<float>* ops);

// √(Σ x²) accumulated in double: the weight and gradient norms of metrics.csv.
double tensor_norm(const xt::xarray<float>& a);

}  // namespace attnlab::app
