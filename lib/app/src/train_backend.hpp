// One training step on the model's backend, whatever it is: the trainer's loop calls these and has
// no device branches. The backend is chosen once, by moving the Model there (Model::to); the same
// model code, optimizer and loss then run on the CPU, on a CUDA device or on the emulated device.
// Internal to the app (lib/app/src).
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "attnlab/app/model.hpp"
#include "attnlab/app/tasks.hpp"
#include "attnlab/nn/cross_entropy.hpp"
#include "attnlab/optim/param_groups.hpp"

namespace attnlab::app {

// Layer l's attention in the last eval forward: P and S (B,H,T,T), for layer 0 the unscaled
// q·k (B,H,T,T) of the Var(q·k)/d_k premise check (empty for other layers), and the queries
// (B,H,T,D) and keys (B,Hkv,T,D) the core saw (the max-logit pairs of the metrics).
struct LayerAttention {
  Tensor4<float> weights, scores, dots, queries, keys;
};

class TrainBackend {
 public:
  // `model` already on its backend; `optimizer` the groups over model.parameters(); z_loss the
  // loss's z-loss coefficient (0: none).
  TrainBackend(Model& model, OptimizerGroups<float>& optimizer, double z_loss = 0);
  ~TrainBackend();
  TrainBackend(const TrainBackend&) = delete;
  TrainBackend& operator=(const TrainBackend&) = delete;

  std::string name() const;  // the backend's name: "cpu", "cuda: ...", "emulated (CPU)"

  // The batch-parallel step (lib/README.md, "Threads in the training step"): `threads` copies of
  // the model, the first the model itself and the others replicas built from `config` (the
  // model's), so that forward_backward can run one piece of a batch on each, a thread each, in
  // one parallel region. The replicas read the model's weights (Parameter::read_values_of: one copy
  // of them in memory, nothing copied per step); their gradients are their own, added into the
  // model's and zeroed as they are read. CPU backend only
  // (std::invalid_argument otherwise); threads >= 1 (1: off).
  void use_batch_threads(const TransformerConfig& config, int threads);
  // 1 unless use_batch_threads set more.
  int batch_threads() const { return static_cast<int>(replicas_.size()) + 1; }
  void set_lr(double lr);
  // The run's seed and the step of the next forward_loss: they key its dropout masks.
  void set_step(std::uint64_t seed, std::uint64_t step);
  // The loss of one forward: the mean cross-entropy and the mean z-loss term (each NaN when
  // non-finite).
  struct Loss {
    double cross_entropy = 0, z_term = 0;
    double total() const { return cross_entropy + z_term; }
  };
  // Training forward (train mode) and mean loss of the batch. The next backward adds `weight`
  // times its gradient (a micro-batch's or a shard's share of the step's batch).
  Loss forward_loss(const Batch& batch, double weight = 1);
  void zero_grad();
  // Adds the gradients of the last forward_loss, times its weight, to the parameters' grads.
  void backward();
  // The batch-parallel forward_loss + backward: parts[t] (at most batch_threads() of them) runs on
  // copy t of the model, at one thread, with weight weights[t] and its dropout masks keyed on step
  // first_step + t; all in one parallel region. Then the replicas' gradients are added into the
  // model's, each element in replica order, so the bits depend on the thread count only. The
  // model's grads end as after forward_loss + backward of parts[0], parts[1], ... in turn at one
  // thread: the same terms, summed per part first (the same bits where a backward adds one term
  // per parameter; a rounding apart for the embedding tables, whose rows collect one term per
  // token). Returns each part's loss; a part with a non-finite loss skips its backward.
  std::vector<Loss> forward_backward(std::span<const Batch> parts, std::span<const double> weights,
                                     std::uint64_t first_step);
  double grad_norm(const std::string& parameter);
  // The global 2-norm of every parameter's gradient (clip_grad_norm's, before clipping).
  double grad_norm();
  void clip_grad_norm(double max_norm);
  void step();
  // Waits for the work queued so far (a device backend runs asynchronously): what the throughput
  // timing calls before reading the clock.
  void synchronize();
  // Eval forward (eval mode: no dropout): (B, T, V) logits; attention(l) then describes it.
  Tensor3<float> eval_logits(const Batch& batch);
  LayerAttention attention(std::size_t layer);
  // Brings the Parameter xarrays up to date for host readers (weight norms, checkpoints); a no-op
  // on the CPU. The optimizer's state_tensors() read its state wherever it is.
  void sync_host();
  // After a non-finite loss on `batch`: the first stage whose output was non-finite ("" if none).
  std::string locate_nonfinite(const Batch& batch);

 private:
  struct Replica;
  void zero_replica_grads();
  Model& model_;
  OptimizerGroups<float>& opt_;
  ParameterList<float> params_;
  CrossEntropyLoss<float> loss_;
  std::uint64_t seed_ = 0, step_ = 0;
  std::vector<std::unique_ptr<Replica>> replicas_;
};

// √(Σ x²) accumulated in double: the weight and gradient norms of metrics.csv.
double tensor_norm(const xt::xarray<float>& a);

}  // namespace attnlab::app
