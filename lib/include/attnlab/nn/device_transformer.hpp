// The stack's Transformer (nn/transformer.hpp) resident on a device, and its optimizer.
//
// Parameters, gradients, optimizer state and activations live in device memory, in one flat arena
// each (parameters in Transformer::parameters() order), and a training step runs as device
// operations (attnlab/device_ops.hpp): embedding, positions, pre-LN blocks (LayerNorm/RMSNorm/none,
// QK-norm, learnable per-head scale, causal and key mask, reference or fused attention), the head,
// the fused softmax cross-entropy, the backward pass, the global grad norm and clipping, and AdamW
// or SGD. Per step the host uploads the token ids and targets and reads back one loss value (and
// the grad norm when clipping); nothing else crosses.
//
// It mirrors the CPU Transformer op for op (same parameter names, same order of the additions), so
// from the same weights it computes the same function and gradients to rounding; DeviceOptimizer
// mirrors attnlab::AdamW / attnlab::SGD and names its state as they do, so a checkpoint written
// from either side loads in the other. Not mirrored: the non-finite check (Transformer::
// set_nonfinite_check); replay the batch on the host model to find where a NaN started.
//
// Unlike Module::backward, backward() ASSIGNS the gradients (a training step needs no zero_grad).
#pragma once

#include <cstddef>
#include <memory>
#include <string>
#include <vector>

#include "attnlab/device_ops.hpp"
#include "attnlab/nn/transformer.hpp"
#include "attnlab/optim/adamw.hpp"
#include "attnlab/optim/optimizer.hpp"
#include "attnlab/optim/sgd.hpp"

namespace attnlab {

template <class T>
class DeviceTransformer {
 public:
  // The configuration and the current weights of `host`; `ops` must outlive this object. Throws
  // std::invalid_argument when the configuration asks for the fused attention path with head dims
  // the device's fused kernels cannot take.
  DeviceTransformer(Transformer<T>& host, DeviceOps<T>& ops);
  ~DeviceTransformer();
  DeviceTransformer(const DeviceTransformer&) = delete;
  DeviceTransformer& operator=(const DeviceTransformer&) = delete;

  const TransformerConfig& config() const;
  DeviceOps<T>& ops() const;

  // Copies every value host -> device, or device -> host (values or grads). `params` must be a
  // Transformer::parameters() list of the same configuration: same names, order and shapes
  // (std::invalid_argument / ShapeError naming the parameter otherwise).
  void upload_parameters(const ParameterList<T>& params);
  void download_parameters(const ParameterList<T>& params) const;
  void download_gradients(const ParameterList<T>& params) const;

  // As Transformer::forward: fields (B, T) ids in [0, vocab) or kNoToken, key_mask (B, T) or null.
  // The logits stay on the device. Throws as the CPU model does on bad ids, counts and shapes.
  void forward(const std::vector<TokenIds>& fields, const KeyMask* key_mask = nullptr);
  // (B, T, out_vocab) logits of the last forward, copied to the host.
  Tensor3<T> logits() const;
  // Mean softmax cross-entropy of the last forward's logits (targets (B, T) in [0, out_vocab) or
  // kIgnoreIndex; 0 when nothing is labelled), computed on the device, which keeps dL/dlogits for
  // backward(). Synchronises. Throws std::logic_error before forward.
  double loss(const TokenIds& targets);
  // Backward from the last loss(): ASSIGNS every parameter's gradient. std::logic_error before
  // loss.
  void backward();

  // √(Σ g²) over every gradient, accumulated in double (optim/clip.hpp's grad_norm).
  double grad_norm();
  // √(Σ g²) of one parameter's gradient; std::invalid_argument for an unknown name.
  double grad_norm(const std::string& name);
  // clip_grad_norm's contract: when the norm exceeds max_norm, multiplies every gradient by
  // max_norm / (norm + kClipNormEps). Returns the norm before clipping.
  double clip_grad_norm(double max_norm);

  // Layer l's queries and keys of the last forward as the attention core saw them (B,H,T,D) and
  // the per-head scales, copied to the host: what the attention metrics need.
  Tensor4<T> queries(std::size_t layer) const;
  Tensor4<T> keys(std::size_t layer) const;
  std::vector<double> head_scales(std::size_t layer) const;

  // The flat arenas, for DeviceOptimizer: parameter i occupies [offset(i), offset(i) + size(i)).
  std::size_t parameter_count() const;  // number of scalars
  const std::vector<std::string>& parameter_names() const;
  const std::vector<std::vector<std::size_t>>& parameter_shapes() const;
  const std::vector<std::size_t>& parameter_offsets() const;
  T* parameter_data();
  T* gradient_data();

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// AdamW or SGD over a DeviceTransformer's flat arenas: one kernel launch per step. Same update,
// same step count semantics and same state names as the CPU optimizers (optim/*.hpp).
template <class T>
class DeviceOptimizer {
 public:
  DeviceOptimizer(DeviceTransformer<T>& model, const AdamWOptions& options);
  DeviceOptimizer(DeviceTransformer<T>& model, const SgdOptions& options);
  ~DeviceOptimizer();
  DeviceOptimizer(const DeviceOptimizer&) = delete;
  DeviceOptimizer& operator=(const DeviceOptimizer&) = delete;

  // "AdamW" or "SGD".
  const std::string& name() const;
  double lr() const;
  // Throws std::invalid_argument unless lr is finite and >= 0.
  void set_lr(double lr);
  // One update of every parameter from its current gradient.
  void step();
  std::size_t step_count() const;
  // As Optimizer::state_tensors / load_state (copies to / from the host; names
  // optim_state_name(param, slot); load validates everything before assigning anything).
  std::vector<NamedTensor<T>> state_tensors() const;
  void load_state(const std::vector<NamedTensor<T>>& tensors, std::size_t step_count);

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

extern template class DeviceTransformer<float>;
extern template class DeviceTransformer<double>;
extern template class DeviceOptimizer<float>;
extern template class DeviceOptimizer<double>;

}  // namespace attnlab
