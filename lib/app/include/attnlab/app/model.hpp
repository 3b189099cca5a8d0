// The trainer's view of a model: the stack's Transformer behind a small interface that speaks in
// task batches (summed token fields, absent fields) and exposes what the metrics need.
//
// This adapter lives in the application (lib/app) so that the library's nn/ layer stays free of
// tasks; it owns the Transformer.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "attnlab/app/tasks.hpp"
#include "attnlab/buffer.hpp"
#include "attnlab/nn/parameter.hpp"
#include "attnlab/random.hpp"
#include "attnlab/tensor.hpp"

namespace attnlab {
template <class T>
class Transformer;
template <class T>
class DeviceOps;
struct TransformerConfig;
}  // namespace attnlab

namespace attnlab::app {

class Model {
 public:
  // config: resolved against the task (resolve_model in run_config.hpp). Draws the initial weights
  // from rng (the order of draws depends only on the shapes, never on the scaling mode, so that
  // the modes of a study start from identical weights).
  Model(const TransformerConfig& config, Rng& rng);
  ~Model();
  Model(const Model&) = delete;
  Model& operator=(const Model&) = delete;

  // Evaluation mode (no dropout) from construction on. train_mode: the trainer's steps, with the
  // dropout masks keyed by the run's seed and the step (Module::set_dropout_key).
  void train_mode(std::uint64_t seed, std::uint64_t step);
  void eval_mode();

  // logits (B, T, V) for the batch's fields (each (B, T); kAbsent contributes nothing).
  Tensor3<float> forward(const Batch& batch);
  // The same, the logits left on the model's backend.
  Buffer<float> forward_on_backend(const Batch& batch);
  // dlogits (B, T, V): adds into the parameters' grads.
  void backward(const Tensor3<float>& dlogits);
  void backward(const Buffer<float>& dlogits);
  // Moves the network to `ops` (Module::to); the non-finite check stays on only where it costs no
  // copy (a backend whose memory is the host's).
  void to(DeviceOps<float>& ops);
  DeviceOps<float>& ops() const;
  // Brings the Parameter xarrays up to date from a device backend (a no-op on the CPU).
  void copy_to_host();
  ParameterList<float> parameters();
  void zero_grad();

  std::size_t layers() const;
  std::size_t heads() const;
  // Layer l of the last forward: attention weights P (B,H,T,T) and the scaled logits S (B,H,T,T).
  Tensor4<float> attention_weights(std::size_t layer) const;
  Tensor4<float> attention_logits(std::size_t layer) const;
  // The unscaled dot products q·k of layer l (B,H,T,T), every pair (no mask, bias or scale), for
  // the Var(q·k)/d_k premise check.
  Tensor4<float> attention_dots(std::size_t layer) const;
  // The queries (B,H,T,D) and keys (B,Hkv,T,D) of layer l's last forward, as its core saw them
  // (after QK-norm and RoPE).
  Tensor4<float> attention_queries(std::size_t layer) const;
  Tensor4<float> attention_keys(std::size_t layer) const;
  // Names of W_Q and W_K of layer l in parameters().
  std::string w_q_name(std::size_t layer) const;
  std::string w_k_name(std::size_t layer) const;
  // For a batch whose forward produced a non-finite logit: the first stage whose output was
  // non-finite ("embedding", "blocks.0.attn", ..., "head"; "" if none), found by replaying the
  // forward of `batch` with the check on (forwards run without it).
  std::string locate_nonfinite(const Batch& batch);
  // The underlying network.
  Transformer<float>& transformer();

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace attnlab::app
