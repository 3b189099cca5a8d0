// Trains one model on one task: the engine behind `attnlab train` and every run of a study.
//
// Per logged step it appends a row to OUT/metrics.csv (columns: metrics_header()); at the end it
// writes OUT/summary.json, OUT/model.safetensors (model config and step in the metadata) and
// OUT/attention.json (layer 0, head 0's weights on the first eval example at the first and the last
// eval of the run: train_metrics.hpp, write_attention_file). A
// non-finite loss stops the run cleanly: the summary records "diverged at step N" and the first
// layer whose output was non-finite. So does an eval loss more than kDivergenceMargin (10) nats
// above the loss at initialisation (loss_diverged, summary.hpp), a run that blew up without
// overflowing; its summary names the two losses in place of a layer.
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
#include <limits>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

#include "attnlab/app/context.hpp"
#include "attnlab/app/run_config.hpp"
#include "attnlab/app/summary.hpp"
#include "attnlab/app/tasks.hpp"
#include "attnlab/fma_peak.hpp"
#include "attnlab/nn/generate.hpp"

namespace attnlab {
template <class T>
class DeviceOps;
}  // namespace attnlab

namespace attnlab::app {

struct TrainResult {
  int steps_done = 0;
  double init_eval_loss = 0;
  double final_eval_loss = 0;
  double final_eval_acc = 0;
  double final_eval_bpb = std::numeric_limits<double>::quiet_NaN();  // text tasks: bits per byte
  double final_train_loss = 0;
  int steps_to_target = -1;  // first logged step with eval accuracy >= 0.95
  // Steps whose update --skip-outliers skipped (TrainConfig::skip_outliers), over the whole run: a
  // resumed run counts its earlier invocations' too. 0 when off.
  int skipped_steps = 0;
  bool diverged = false;
  int diverged_step = -1;
  std::string diverged_where;  // the first layer that produced a non-finite value, or the losses
  bool interrupted = false;
  double init_qk_var_ratio = 0;  // Var(q·k)/d_k at step 0, layer 0, on the eval set
  double init_jacobian = 0;      // layer 0 head 0's mean softmax Jacobian norm at step 0
  // Layer 0 at step 0 (NaN in a resumed invocation, which did not see step 0) and at the last eval
  // (metrics.csv's last row; the eval that found a divergence included).
  LayerZeroStats layer0_init, layer0_final;
  double seconds = 0;
  std::string device;  // what ran the training step: "cpu" or the DeviceOps name
  // Throughput of this invocation's training steps (forward, loss, backward, clipping, update;
  // not the evals, metrics and checkpoints): tokens = batch · sequence length per step.
  double step_seconds = 0;
  double tokens_per_second = 0;  // 0 when no step ran
  double flops_per_token = 0;    // transformer_flops_per_token of the model (nn/transformer.hpp)
  // With TrainConfig::measure_peaks on the CPU (0 and empty otherwise): the peaks measured after
  // the steps at the run's thread count. Utilisation = flops_per_token · tokens_per_second over
  // each: the cores' FMA peak (attnlab/fma_peak.hpp), the honest one, and the sgemm peak
  // (measure_gemm_peak_gflops, nanoGPT's and llm.c's MFU denominator).
  FmaPeak fma_peak;
  double gemm_peak_gflops = 0;
  // bf16 runs where AMX is usable (amx_support): the cores' AMX bf16 peak (measure_amx_peak), the
  // denominator of a bf16 step's utilisation; gflops 0 otherwise.
  FmaPeak amx_peak;
  // The threads of the batch-parallel step (TrainConfig::thread_split): 1 when each op split its
  // own work instead.
  int batch_threads = 1;
  int world_size = 1;                     // processes the batch was split across (context.comm)
  std::string distributed;                // the communicator's name
  double allreduce_seconds_per_step = 0;  // this rank's mean time in the gradient allreduce
  // The weight decay's reach (TrainConfig::decay_params): the parameter tensors and values the
  // optimizer decays, out of all.
  std::size_t decayed_tensors = 0, decayed_values = 0, param_tensors = 0, param_values = 0;
};

// Data-parallel runs (context.comm of size N > 1; see attnlab/distributed.hpp). Every rank holds
// the whole model and draws the same global batch of config.batch rows from the same data stream;
// rank r trains on the rows shard_rows gives it, so the data order does not depend on N and a run
// saved under N processes resumes under M. The gradients are summed with each rank's weighted by
// its share of the labelled positions, so every rank takes the step of the whole batch; the eval
// set is sharded and its sums reduced. Only rank 0 writes files and shows progress. The ranks
// compare a checksum of their parameters at every logged step and at the end (ReplicaMismatch).
//
// Failures. Before the first collective of the run, the ranks agree on whether each one set up
// (validation, data, checkpoint): if any failed, every rank throws. The failed ranks throw their
// own error, except that when rank 0 failed too the others throw a quiet PeerFailure (rank 0
// reports). After that, an error on one rank is rethrown as RankFailure: the others may be waiting
// in a collective, so the application must end the job (Communicator::abort).
class PeerFailure : public std::runtime_error {
 public:
  PeerFailure(const std::string& what, bool quiet, bool bad_input)
      : std::runtime_error(what), quiet_(quiet), bad_input_(bad_input) {}
  bool quiet() const { return quiet_; }          // another rank reports the error
  bool bad_input() const { return bad_input_; }  // the failed rank's error was bad input

 private:
  bool quiet_, bad_input_;
};
class RankFailure : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// Validates the config and the context (std::invalid_argument naming the field; DataFileError for
// data files), trains, writes the outputs into config.out: OUT/config.json (the effective config,
// model resolved against the task), metrics.csv, summary.json, model.safetensors. Never calls exit.
//
// What `context` says (run control, not part of the run config):
//  - threads: the run's ops use that many threads; it is set on the calling thread for the run
//    only (a ThreadScope), so runs on several threads at once (the study's jobs) are independent;
//  - stop: once the flag is set (e.g. by the app's SIGINT handler) the run saves a checkpoint
//    before its next step and returns with `interrupted`;
//  - backend cuda: the model (Module::to) and its optimizer move to a CUDA backend the run makes
//    and owns, and the training step and the eval forward run there; checkpoints and weight norms
//    read the host copy, brought up to date first; context.device (when not null) replaces that
//    backend: the tests pass the emulated device.
//
// Resume (config.resume = DIR): the run saved in DIR continues. Its saved config is the recipe:
// every field of `config` but out, save_every, the one-off controls and steps must equal it
// (std::invalid_argument naming the first field that differs; start from read_run_config). out
// left at its default writes into DIR. steps may grow (not shrink below the saved step): the LR
// schedule is then the one a fresh run with the new steps follows (warmup and the cosine or wsd
// decay over the new total), continued from the saved step. With skip_outliers the detectors'
// windows and the skipped count continue from the checkpoint. The context may differ (another
// thread count, the other device).
//
// skip_outliers Z > 0: a step whose loss or global gradient norm has a z-score above Z over the
// last 128 steps (attnlab/optim/outlier.hpp) skips its update; its forward and backward run, the
// weights, the optimizer's state and its step count stay, the step (LR schedule, data stream,
// dropout keys) advances. Both values enter the windows whatever is decided (llm.c's rule).
TrainResult train_model(const TrainConfig& config, const Context& context);

// Loss and accuracy on the fixed eval set of a trained run, with a few examples.
struct EvalReport {
  double loss = 0;
  double accuracy = 0;
  double bits_per_byte = std::numeric_limits<double>::quiet_NaN();  // text tasks
  int examples = 0;
  std::string text;  // human-readable: examples with predictions, query attention for recall
};
// Evaluates the run saved in run_dir on its task's fixed eval set, or on valid_file. With
// logits_file, also writes the eval set's logits there atomically: a safetensors file with one F32
// tensor "logits" (N, T, V) in PyTorch's row-major layout (metadata {"format": "pt"}), for
// comparisons with other implementations (python/attnlab_torch.py's tests).

// Text generation from a trained `text` run (`attnlab generate`): its vocabulary comes from the
// checkpoint, so no data file is needed.
struct GenerateRequest {
  std::string run_dir;
  std::string prompt;
  int tokens = 200;
  SamplerOptions sampler;
  bool use_cache = true;  // false: recompute the whole context per token (for comparisons)
};
struct GenerateReport {
  int tokens = 0;
  double seconds = 0;  // generation only (loading excluded)
  std::string text;    // the continuation, without the prompt
};
// Calls on_text with each new token's text as soon as it is chosen. Runs on context.backend with
// context.threads. Throws std::invalid_argument for a run whose task is not text, DataFileError
// naming "--prompt" for a prompt that is empty, not UTF-8 or has a character outside the
// checkpoint's vocabulary, CheckpointError for an unreadable checkpoint.
GenerateReport generate_from_run(const GenerateRequest& request, const Context& context,
                                 const std::function<void(const std::string&)>& on_text = {});

EvalReport evaluate_run(const std::string& run_dir, int show = 4,
                        const std::string& valid_file = "", const std::string& logits_file = "");

}  // namespace attnlab::app
