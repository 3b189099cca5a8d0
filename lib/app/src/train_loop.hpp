// The trainer's loop (lib/app/src/trainer.cpp sets it up and runs it): what a set-up run's evals,
// steps and wrap-up share, one training step, the evals and the run's results. Internal to the app
// (lib/app/src).
#pragma once

#include <cstddef>
#include <limits>
#include <optional>
#include <vector>

#include "attnlab/app/progress.hpp"
#include "train_backend.hpp"
#include "train_setup.hpp"

namespace attnlab::app {

// What a set-up run's evals, steps and wrap-up share; train_impl owns every piece.
struct RunParts {
  const TrainConfig& c;
  const Context& context;
  Communicator& comm;
  const TrainData& data;
  const Shard& shard;  // this rank's rows of each batch
  const Batch& eval;   // this rank's rows of the eval set
  Model& model;
  const ParameterList<float>& params;
  OptimizerGroups<float>& opt;  // the run's parameter groups (one, "default", unless configured)
  TrainBackend& backend;
  const LrSchedule& schedule;
  std::optional<MetricsLog>& log;  // rank 0 only
  const RunSaver& saver;
  const ProgressFn& progress;
  Rng& data_rng;
  std::size_t start, steps;  // this invocation's first step; the run's last
  std::size_t d_k;
  const std::vector<std::uint32_t>& token_bytes;  // per output id (bits per byte), or empty
  bool lead;                                      // writes the files, shows progress
};

// What the loop carries from step to step and hands to the wrap-up.
struct LoopState {
  explicit LoopState(std::size_t layers) {
    for (auto* v : {&norms.wq_grad, &norms.wk_grad, &norms.wq, &norms.wk}) v->assign(layers, 0.0);
  }
  TrainResult result;
  TrainClock::time_point t0;
  EvalStats st;  // the latest eval
  // This invocation's first eval: its example attention goes into OUT/attention.json.
  EvalStats first_st;
  std::size_t eval_step = 0;                                      // the step of the eval in `st`
  std::size_t step = 0;                                           // the next step to take
  double last_loss = std::numeric_limits<double>::quiet_NaN();    // the cross-entropy
  double last_z_term = std::numeric_limits<double>::quiet_NaN();  // the z-loss term
  double step_seconds = 0;  // the training steps' wall time (no evals, metrics, checkpoints)
  double allreduce_seconds = 0;
  LayerNorms norms;            // the logged step's gradient and weight norms (metrics.csv)
  std::vector<float> staging;  // the gradient allreduce's host buffer, kept across steps
  // --skip-outliers (nullopt when off): the detectors and the count; whether the last step skipped.
  std::optional<OutlierSkip> outliers;
  bool skipped = false;
};

// The first eval of this invocation (a resumed run's too), logged and kept for attention.json.
void first_eval(const RunParts& p, LoopState& s, bool resuming);
// Whether the run stops before `step` (the step budget, a stop request).
bool stop_before(const RunParts& p, std::size_t step);
// One step: batch, forward, backward, allreduce, update, metrics; false once the run diverged.
bool train_step(const RunParts& p, LoopState& s);
// The run's results into s.result.
void fill_result(const RunParts& p, LoopState& s, const TaskShape& shape);
// The last checkpoint, attention.json and summary.json (rank 0).
void finish_outputs(const RunParts& p, const LoopState& s);

}  // namespace attnlab::app
