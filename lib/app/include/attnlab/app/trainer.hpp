// Trains one model on one task: the engine behind `attnlab train` and every run of a study.
//
// Per logged step it appends a row to OUT/metrics.csv (columns: metrics_header()); at the end it
// writes OUT/summary.json and OUT/model.safetensors (model config and step in the metadata). A
// non-finite loss stops the run cleanly: the summary records "diverged at step N" and the first
// layer whose output was non-finite.
//
// Determinism: the initial weights come from Rng(seed) and the data stream from a second Rng
// derived from the seed only (never from the scaling mode or the LR), so within a seed every arm of
// a study starts from the same weights and sees the same batches. With a fixed thread count two
// runs give bit-identical metrics.csv. A different thread count changes the float rounding (the
// layers split rows into one chunk per thread and sum weight-gradient partials chunk by chunk), so
// metrics then agree only to float tolerance. A study runs every job single-threaded, so its
// results do not depend on --jobs.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "attnlab/app/tasks.hpp"
#include "attnlab/context.hpp"
#include "attnlab/nn/norm.hpp"
#include "attnlab/ops/attention.hpp"

namespace attnlab {
template <class T>
class DeviceOps;
}  // namespace attnlab

namespace attnlab::app {

// The model's shape and attention options (the vocabularies come from the task).
struct ModelSpec {
  int d_model = 64;
  int heads = 1;
  int d_k = 0;  // 0: d_model / heads
  int d_v = 0;  // 0: d_model / heads
  int layers = 1;
  bool attn_only = true;
  Norm norm = Norm::layernorm;
  bool qk_norm = false;
  bool learnable_scale = false;
  Scaling scaling = Scaling::sqrt_dk;
  std::optional<double> scale;  // explicit scale, overrides scaling
  bool causal = false;
  bool positions = true;  // learned positional embedding
  int d_ff = 0;           // MLP width; 0: 4 · d_model
};

// Throws std::invalid_argument naming the field (e.g. heads that do not divide d_model when d_k or
// d_v is left to default).
void validate(const ModelSpec& spec);

struct TrainConfig {
  TaskConfig task;
  std::string data_file;   // train on this file instead of generated batches ("" = generate)
  std::string valid_file;  // eval on this file ("" = the task's fixed eval set)
  ModelSpec model;
  std::string optimizer = "adamw";  // adamw | sgd
  double lr = 3e-3;
  double beta1 = 0.9, beta2 = 0.95;
  double momentum = 0.9;  // sgd
  double weight_decay = 0;
  double clip = 0;                  // 0: no clipping
  std::string schedule = "cosine";  // constant | cosine
  int warmup = 0;
  int steps = 1000;
  int batch = 32;
  std::uint64_t seed = 0;
  std::string out = "runs/train";
  int eval_every = 50;
  int eval_size = 512;
  int save_every = 0;    // 0: only at the end
  std::string resume;    // a run directory to continue from
  int stop_after = 0;    // > 0: stop after this step with a checkpoint, as if interrupted
  bool progress = true;  // live bar on a TTY, plain lines otherwise (false: silent)
  bool write_checkpoint = true;
  // The thread count, the stop flag and the backend are run control, not part of the run config:
  // they come in the Context given to train_model (attnlab/context.hpp), so a run may be resumed
  // with another thread count or on the other device.
};

struct TrainResult {
  int steps_done = 0;
  double init_eval_loss = 0;
  double final_eval_loss = 0;
  double final_eval_acc = 0;
  double final_train_loss = 0;
  int steps_to_target = -1;  // first logged step with eval accuracy >= 0.95
  bool diverged = false;
  int diverged_step = -1;
  std::string diverged_where;  // the first layer that produced a non-finite value
  bool interrupted = false;
  double init_qk_var_ratio = 0;  // Var(q·k)/d_k at step 0, layer 0, on the eval set
  double seconds = 0;
  std::string device;  // what ran the training step: "cpu" or the DeviceOps name
};

// Validates the config and the context (std::invalid_argument naming the field; DataFileError for
// data files), trains, writes the outputs into config.out. Never calls exit. What `context` says:
//  - threads: the run's ops use that many threads; it is set on the calling thread for the run
//    only (a ThreadScope), so runs on several threads at once (the study's jobs) are independent;
//  - stop: once the flag is set (e.g. by the app's SIGINT handler) the run saves a checkpoint
//    before its next step and returns with `interrupted`;
//  - backend cuda: the training step (forward, loss, backward, clipping, optimizer) and the eval
//    forward run on the GPU in a DeviceTransformer (nn/device_transformer.hpp), on a CUDA backend
//    the run makes and owns; the attention metrics are computed on the host from each layer's
//    queries and keys, and the host model is the mirror that checkpoints read. `device_ops` (when
//    not null) replaces that backend: the tests pass the emulated device.
TrainResult train_model(const TrainConfig& config, const Context& context,
                        DeviceOps<float>* device_ops = nullptr);

// Loss and accuracy on the fixed eval set of a trained run, with a few examples.
struct EvalReport {
  double loss = 0;
  double accuracy = 0;
  int examples = 0;
  std::string text;  // human-readable: examples with predictions, query attention for recall
};
EvalReport evaluate_run(const std::string& run_dir, int show = 4,
                        const std::string& valid_file = "");

}  // namespace attnlab::app
