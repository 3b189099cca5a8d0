#include "attnlab/app/trainer.hpp"

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <limits>
#include <memory>
#include <span>
#include <sstream>

#include <nlohmann/json.hpp>

#include "attnlab/app/data_file.hpp"
#include "attnlab/app/loss.hpp"
#include "attnlab/app/model.hpp"
#include "attnlab/app/param_groups.hpp"
#include "attnlab/app/progress.hpp"
#include "attnlab/app/run_checkpoint.hpp"
#include "attnlab/app/text.hpp"
#include "attnlab/backends/cpu.hpp"
#include "attnlab/blas.hpp"
#include "attnlab/cuda.hpp"
#include "attnlab/distributed.hpp"
#include "attnlab/io/safetensors.hpp"
#include "attnlab/optim/schedule.hpp"
#include "attnlab/threads.hpp"
#include "train_backend.hpp"
#include "train_metrics.hpp"
#include "train_saver.hpp"

namespace attnlab::app {

namespace {

using json = nlohmann::json;
using Clock = std::chrono::steady_clock;

// The data stream's seed: derived from the run seed only (splitmix64 of seed ^ a constant).
std::uint64_t data_seed(std::uint64_t seed) {
  std::uint64_t z = seed ^ 0xda7a5eedULL;
  z += 0x9e3779b97f4a7c15ULL;
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  return z ^ (z >> 31);
}

// The run's recipe as JSON: every field but the run control that a resumed run may change.
json recipe_json(const TrainConfig& c) {
  json j = c;
  for (const char* k : {"out", "save_every", "steps"}) j.erase(k);
  return j;
}

// The first key path where two JSON values differ ("" when equal).
std::string first_difference(const json& a, const json& b, const std::string& path = "") {
  if (a.is_object() && b.is_object()) {
    for (const auto& item : a.items()) {
      const std::string p = path.empty() ? item.key() : path + "." + item.key();
      if (!b.contains(item.key())) return p;
      const std::string d = first_difference(item.value(), b.at(item.key()), p);
      if (!d.empty()) return d;
    }
    return "";
  }
  return a == b ? "" : path;
}

json at_path(const json& j, const std::string& path) {
  // "a.b.c" -> "/a/b/c". Built by appending, and without std::regex: GCC 12 warns falsely on
  // "/" + string (-Wrestrict at -O3) and inside <regex> (-Wmaybe-uninitialized under ASan).
  std::string pointer(1, '/');
  pointer += path;
  std::replace(pointer.begin(), pointer.end(), '.', '/');
  return j.at(json::json_pointer(pointer));
}

Parameter<float>* find_param(const ParameterList<float>& params, const std::string& name) {
  for (const auto& p : params)
    if (p.name == name) return p.param;
  return nullptr;
}

void write_summary(const std::string& path, const TrainConfig& c, const TrainResult& r) {
  json j;
  j["config"] = c;
  j["steps_done"] = r.steps_done;
  j["init_eval_loss"] = r.init_eval_loss;
  j["final_eval_loss"] = std::isfinite(r.final_eval_loss) ? json(r.final_eval_loss) : json(nullptr);
  j["final_eval_acc"] = r.final_eval_acc;
  j["final_train_loss"] =
      std::isfinite(r.final_train_loss) ? json(r.final_train_loss) : json(nullptr);
  j["steps_to_95"] = r.steps_to_target;
  j["skipped_steps"] = r.skipped_steps;  // updates skipped by --skip-outliers (0 when off)
  j["diverged"] = r.diverged;
  if (r.diverged) {
    j["diverged_step"] = r.diverged_step;
    j["status"] = "diverged at step " + std::to_string(r.diverged_step);
    j["first_nonfinite_layer"] = r.diverged_where;
  } else {
    j["status"] = r.interrupted ? "interrupted" : "finished";
  }
  j["init_qk_var_ratio"] = r.init_qk_var_ratio;
  const auto layer0 = [](const LayerZeroStats& z) {
    const auto num = [](double x) { return std::isfinite(x) ? json(x) : json(nullptr); };
    return json{{"max_logit", num(z.max_logit)},
                {"entropy", num(z.entropy)},
                {"wq_norm", num(z.wq_norm)},
                {"wk_norm", num(z.wk_norm)}};
  };
  j["layer0"] = {{"init", layer0(r.layer0_init)}, {"final", layer0(r.layer0_final)}};
  j["seconds"] = r.seconds;
  j["step_seconds"] = r.step_seconds;
  j["tokens_per_second"] = r.tokens_per_second;
  j["flops_per_token"] = r.flops_per_token;
  if (r.fma_peak.gflops > 0 && r.tokens_per_second > 0) {  // every percentage names its denominator
    const double gflops = r.flops_per_token * r.tokens_per_second / 1e9;
    j["utilisation"] = {{"model_gflops", gflops},
                        {"threads", r.fma_peak.threads},
                        {"fma_peak_gflops", r.fma_peak.gflops},
                        {"fma_peak_vector", r.fma_peak.vector},
                        {"of_fma_peak", gflops / r.fma_peak.gflops},
                        {"sgemm_peak_gflops", r.gemm_peak_gflops},
                        {"of_sgemm_peak", gflops / r.gemm_peak_gflops}};
  }
  j["device"] = r.device;
  j["blas_core"] = blas_info().core;
  j["gemm_engine"] = blas_info().engine_name;  // the float gemms'
  j["gemm_precision"] = c.precision;
  if (c.precision == GemmPrecision::bf16) j["bf16_gemm"] = blas_info().bf16_engine_name;
  // batch: each of `batch_threads` threads trained its part of the batch through the whole model;
  // ops: every op split its work across the run's threads.
  j["thread_split"] = r.batch_threads > 1 ? ThreadSplit::batch : ThreadSplit::ops;
  j["batch_threads"] = r.batch_threads;
  j["world_size"] = r.world_size;
  j["distributed"] = r.distributed;
  if (r.world_size > 1) j["allreduce_seconds_per_step"] = r.allreduce_seconds_per_step;
  const std::string text = j.dump(2) + '\n';
  write_file_atomic(path, std::as_bytes(std::span(text.data(), text.size())));
}

// Resume: checks config_in against the run saved in config_in.resume (see train_model), sets c's
// resolved model and default out, and returns the checkpoint's metadata.
RunMeta check_resume(const TrainConfig& config_in, TrainConfig& c) {
  const std::string resume_path = c.resume + "/model.safetensors";
  const RunMeta resumed = read_run_meta(resume_path);
  if (resumed.weights_only) {
    throw CheckpointError(resume_path,
                          "holds the weights only (written by train --weights-only): there is no "
                          "optimizer state to resume from; evaluate it instead");
  }
  TrainConfig saved;
  read_saved_config(resumed, resume_path, saved);
  // The saved config is the recipe; only run control and steps may differ (both resolved, so a
  // run saved before the model recorded its vocabularies compares equal).
  const TaskShape saved_shape = task_shape(saved.task);
  saved.model = resolve_model(saved.model, saved_shape);
  TrainConfig given = config_in;
  given.model = resolve_model(given.model, task_shape(given.task));
  const json want = recipe_json(saved), got = recipe_json(given);
  const std::string diff = first_difference(want, got);
  if (!diff.empty())
    check_arg(false, "train", "resume: " + diff,
              at_path(want, diff).dump() +
                  " (the saved run's; only steps, out and save_every (and the --threads/--device "
                  "of the run context) may "
                  "change)",
              at_path(got, diff).dump());
  check_arg(config_in.steps >= static_cast<int>(resumed.step), "train", "steps",
            ">= the saved step " + std::to_string(resumed.step) + " when resuming",
            std::to_string(config_in.steps));
  c.model = given.model;
  if (config_in.out == TrainConfig{}.out) c.out = c.resume;
  return resumed;
}

// A text task's eval set: eval_size fixed blocks of the validation tokens, which are the last 10%
// of data_file, or the whole of valid_file when given.
Batch text_eval_set(const TrainConfig& c, const std::string& valid_file,
                    std::vector<int>* train_tokens = nullptr) {
  const TextVocab vocab(c.task);
  const auto block = static_cast<std::size_t>(c.task.block);
  std::vector<int> valid;
  if (train_tokens || valid_file.empty()) {
    TextData split =
        split_text(vocab.encode(read_text_file(c.data_file), c.data_file), block, c.data_file);
    if (train_tokens) *train_tokens = std::move(split.train);
    valid = std::move(split.valid);
  }
  if (!valid_file.empty()) valid = vocab.encode(read_text_file(valid_file), valid_file);
  check_arg(valid.size() > block, "train", "valid_file",
            "a text of at least block + 1 = " + std::to_string(block + 1) + " tokens",
            std::to_string(valid.size()) + " tokens");
  return text_eval_batch(valid, block, static_cast<std::size_t>(c.eval_size));
}

// The training data: batches generated from the data Rng, or drawn (by the same Rng) from a file;
// the eval set fixed by the task, or read from a file.
struct TrainData {
  TrainData(const TrainConfig& c, const TaskShape& shape) : task(c.task) {
    if (c.task.kind == TaskKind::text) {
      eval = text_eval_set(c, c.valid_file, &text);
      return;
    }
    if (!c.data_file.empty()) file = read_data_file(c.data_file, &shape);
    std::string valid = c.valid_file;
    if (valid.empty() && !c.data_file.empty()) {
      const auto sibling = std::filesystem::path(c.data_file).parent_path() / "valid.txt";
      if (std::filesystem::exists(sibling) && sibling != std::filesystem::path(c.data_file))
        valid = sibling.string();
    }
    eval = valid.empty() ? eval_batch(c.task, static_cast<std::size_t>(c.eval_size))
                         : read_data_file(valid, &shape);
  }
  Batch next(std::size_t batch, Rng& rng) const {
    if (task.kind == TaskKind::text)
      return text_batch(text, static_cast<std::size_t>(task.block), batch, rng);
    if (!file) return generate_batch(task, batch, rng);
    std::vector<std::size_t> rows(batch);
    for (auto& r : rows) r = rng.below(file->size());
    return gather_batch(*file, rows);
  }
  TaskConfig task;
  std::optional<Batch> file;
  std::vector<int> text;  // task text: the training part's tokens
  Batch eval;
};

// The labelled positions (targets != kIgnoreIndex) of rows [begin, end) of `targets`.
std::size_t labelled_rows(const TokenIds& targets, std::size_t begin, std::size_t end) {
  const std::size_t T = targets.shape()[1];
  std::size_t n = 0;
  for (std::size_t i = begin * T; i < end * T; ++i) n += targets.data()[i] != kIgnoreIndex;
  return n;
}

// Rows [begin, end) of a batch.
Batch shard_of(const Batch& batch, const Shard& shard) {
  if (shard.begin == 0 && shard.end == batch.size()) return batch;
  std::vector<std::size_t> rows(shard.size());
  for (std::size_t i = 0; i < rows.size(); ++i) rows[i] = shard.begin + i;
  return gather_batch(batch, rows);
}

bool is_bad_input(const std::exception& e) {
  return dynamic_cast<const std::invalid_argument*>(&e) != nullptr ||
         dynamic_cast<const DataFileError*>(&e) != nullptr ||
         dynamic_cast<const CheckpointError*>(&e) != nullptr;
}

// The ranks' agreement that each one set up (see PeerFailure). `failed`: this rank's setup threw
// (the caller rethrows its own error when this returns).
void agree_on_setup(Communicator& comm, bool failed, bool bad_input) {
  const int n = comm.size(), r = comm.rank();
  // [the first failed rank, as n − rank (0: none); any bad input; rank 0 failed]
  std::vector<double> v = {failed ? static_cast<double>(n - r) : 0.0, bad_input ? 1.0 : 0.0,
                           failed && r == 0 ? 1.0 : 0.0};
  comm.allreduce_max(v.data(), v.size());
  if (v[0] == 0) return;
  const bool rank0_failed = v[2] > 0;
  if (failed && (r == 0 || !rank0_failed)) return;  // this rank reports its own error
  const int first = n - static_cast<int>(v[0]);
  throw PeerFailure("train: rank " + std::to_string(first) + " of " + std::to_string(n) +
                        " failed before training started (its error is above)",
                    r != 0 || rank0_failed, v[1] > 0);
}

double seconds_since(Clock::time_point t) {
  return std::chrono::duration<double>(Clock::now() - t).count();
}

// The backend, chosen once: the model moves there (its optimizer follows), and the loop runs the
// same code whatever it is. A CUDA backend made for this run goes to own_ops, which the caller
// makes before the model, whose buffers it must outlive.
DeviceOps<float>* choose_ops(const Context& context, DeviceOps<float>* device_ops,
                             std::unique_ptr<DeviceOps<float>>& own_ops) {
  DeviceOps<float>* ops = &cpu_ops<float>();
  if (context.backend == Backend::cuda) {
    if (!device_ops) {
      if (!cuda_available()) {
        check_arg(
            false, "train", "device", "a usable CUDA device for 'cuda'",
            cuda_built() ? "none (no driver or no GPU)" : "none (attnlab was built without CUDA)");
      }
      own_ops = make_cuda_device_ops<float>();
      device_ops = own_ops.get();
    }
    ops = device_ops;
  }
  return ops;
}

// The batch-parallel step's thread count (TrainConfig::thread_split): the run's threads, at most
// one per row of this rank's shard, on the CPU backend with thread_split "batch"; else 1 (every op
// splits its own work across the threads).
int batch_threads(const TrainConfig& c, const Context& context, DeviceOps<float>& ops,
                  const Shard& shard) {
  if (c.thread_split != ThreadSplit::batch || &ops != &cpu_ops<float>()) return 1;
  return static_cast<int>(
      std::min<std::size_t>(static_cast<std::size_t>(context.threads), shard.size()));
}

LrSchedule make_schedule(const TrainConfig& c, std::size_t steps) {
  const auto warmup = static_cast<std::size_t>(c.warmup);
  switch (c.schedule) {
    case LrScheduleKind::warmup_cosine:
      return LrSchedule::warmup_cosine(c.lr, c.min_lr, warmup, steps);
    case LrScheduleKind::warmup_stable_decay:
      return LrSchedule::warmup_stable_decay(c.lr, c.min_lr, warmup, steps, c.warmdown);
    case LrScheduleKind::constant:
      break;
  }
  return LrSchedule::constant(c.lr);
}

// A resumed run's state from its checkpoint: the weights and the optimizer state (into the host
// copy, before the model moves to its backend) and the data stream's position.
void restore_training_state(const TrainConfig& c, const RunMeta& resumed,
                            ParameterList<float>& params, OptimizerGroups<float>& opt,
                            Rng& data_rng) {
  StateTensors state;
  for (auto& t : opt.state_tensors()) state.emplace_back(t.first, std::move(t.second));
  load_run_checkpoint(c.resume + "/model.safetensors", params, &state);
  opt.load_state(state, resumed.optimizer_steps);
  data_rng.set_state(resumed.data_rng);
}

// --skip-outliers' detectors (nullopt when off): empty, or a resumed run's from its checkpoint.
std::optional<OutlierSkip> outlier_skip(const TrainConfig& c, const RunMeta& resumed,
                                        bool resuming) {
  std::optional<OutlierSkip> skip;
  if (c.skip_outliers <= 0) return skip;
  skip.emplace();
  if (resuming) {
    const std::string path = c.resume + "/model.safetensors";
    if (resumed.outliers.empty())
      throw CheckpointError(path, "metadata lacks 'outliers' (the state of --skip-outliers)");
    read_outlier_skip(resumed.outliers, path, *skip);
  }
  return skip;
}

// Rank 0's outputs from the start: OUT/, OUT/config.json and OUT/metrics.csv (a resumed run's
// rows kept up to its saved step). Other ranks write nothing: nullopt.
std::optional<MetricsLog> open_outputs(const TrainConfig& c, const Model& model, bool lead,
                                       bool resuming, std::size_t start) {
  std::optional<MetricsLog> log;
  if (lead) {
    std::filesystem::create_directories(c.out);
    write_config_file(c.out + "/config.json", c);
    log.emplace(c.out + "/metrics.csv", model.layers(), model.heads(),
                c.task.kind == TaskKind::recall, resuming ? c.resume + "/metrics.csv" : "", start,
                c.z_loss > 0, c.skip_outliers > 0);
  }
  return log;
}

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
  bool lead;  // writes the files, shows progress
};

// What the loop carries from step to step and hands to the wrap-up.
struct LoopState {
  explicit LoopState(std::size_t layers) {
    for (auto* v : {&norms.wq_grad, &norms.wk_grad, &norms.wq, &norms.wk}) v->assign(layers, 0.0);
  }
  TrainResult result;
  Clock::time_point t0;
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

// What the checkpoint keeps of --skip-outliers (null when off).
const OutlierSkip* outlier_state(const LoopState& s) {
  return s.outliers ? &*s.outliers : nullptr;
}

EvalStats eval_all(const RunParts& p) {
  EvalStats s = evaluate(p.backend, p.model.layers(), p.eval, p.c.task, p.d_k);
  reduce_eval(p.comm, s, p.d_k);
  return s;
}

// One row of metrics.csv: the eval `st`, the step's gradient norms (already in `norms`) and the
// weight norms now, read from the host copy.
// write = false: the norms only (a resumed run's first eval, whose row is already in the file).
void log_row(const RunParts& p, LayerNorms& norms, std::size_t step, double train_loss,
             double train_z_term, double lr, const EvalStats& st, bool skipped = false,
             bool write = true) {
  for (std::size_t l = 0; l < p.model.layers(); ++l) {
    norms.wq[l] = tensor_norm(find_param(p.params, p.model.w_q_name(l))->value);
    norms.wk[l] = tensor_norm(find_param(p.params, p.model.w_k_name(l))->value);
  }
  if (p.log && write) p.log->write(step, train_loss, lr, st, norms, train_z_term, skipped);
}

// Layer 0's figures at the eval `st`, with the weight norms log_row has just read.
LayerZeroStats layer_zero(const RunParts& p, const EvalStats& st, const LayerNorms& norms) {
  LayerZeroStats z;
  const std::size_t heads = p.model.layers() > 0 ? st.health.size() / p.model.layers() : 0;
  if (heads > 0) {
    z.max_logit = 0;
    z.entropy = 0;
    for (std::size_t h = 0; h < heads; ++h) {
      const double m = st.health[h].max_abs_logit;  // NaN (a diverged eval) stays NaN
      z.max_logit = std::isnan(m) || std::isnan(z.max_logit)
                        ? std::numeric_limits<double>::quiet_NaN()
                        : std::max(z.max_logit, m);
      z.entropy += st.health[h].entropy / static_cast<double>(heads);
    }
  }
  if (!norms.wq.empty()) z.wq_norm = norms.wq[0];
  if (!norms.wk.empty()) z.wk_norm = norms.wk[0];
  return z;
}

void diverge(TrainResult& result, std::size_t step, std::string where, const char* fallback) {
  result.diverged = true;
  result.diverged_step = static_cast<int>(step);
  result.diverged_where = where.empty() ? fallback : std::move(where);
}

// The eval before this invocation's first step: the figures at initialisation and, in a new run,
// metrics.csv's step-0 row.
void first_eval(const RunParts& p, LoopState& s, bool resuming) {
  TrainResult& result = s.result;
  s.st = eval_all(p);
  s.first_st = s.st;
  s.eval_step = p.start;
  result.init_qk_var_ratio = s.st.qk_var_ratio;
  result.init_jacobian = s.st.health.empty() ? 0.0 : s.st.health.front().jacobian_norm;
  // A resumed run's loss at initialisation comes from its saved rows.
  result.init_eval_loss =
      resuming && p.log ? p.log->kept_init_eval_loss().value_or(s.st.loss) : s.st.loss;
  log_row(p, s.norms, 0, std::numeric_limits<double>::quiet_NaN(),
          std::numeric_limits<double>::quiet_NaN(), p.schedule.lr_at(0), s.st, false, !resuming);
  result.layer0_final = layer_zero(p, s.st, s.norms);
  if (!resuming) result.layer0_init = result.layer0_final;
  result.final_eval_loss = s.st.loss;
  result.final_eval_acc = s.st.accuracy;
}

// A stop before `step`: --stop-after, or a signal in a single process (with several ranks a stop
// request is agreed on in agreed_loss: a signal may reach them apart).
bool stop_before(const RunParts& p, std::size_t step) {
  return (p.comm.size() == 1 && p.context.stop_requested()) ||
         (p.c.stop_after > 0 && step == static_cast<std::size_t>(p.c.stop_after));
}

// With several ranks, the global loss (NaN if any rank's is) from this rank's `loss` and its
// `weight`, and whether any rank must stop (nullopt then). One process: `loss` as it is.
std::optional<TrainBackend::Loss> agreed_loss(const RunParts& p, const TrainBackend::Loss& loss,
                                              double weight) {
  if (p.comm.size() == 1) return loss;
  double agreed[3] = {loss.cross_entropy * weight, loss.z_term * weight,
                      p.context.stop_requested() ? 1.0 : 0.0};
  p.comm.allreduce_sum(agreed, 3);
  if (agreed[2] > 0) return std::nullopt;
  return TrainBackend::Loss{agreed[0], agreed[1]};
}

// A step's data, as the lib/README.md's gradient accumulation defines it: the step draws N · B rows
// (N = grad_accum, B = batch) from the data stream, as one batch of N · B would; micro-batch k is
// rows [kB, (k+1)B) of them, and this rank trains on its shard of each. With the batch-parallel
// step the rank's shard of each micro-batch is cut again into P contiguous parts, one per thread
// (part t of micro-batch k is piece kP + t): the pieces of N micro-batches of P parts are those of
// N · P micro-batches of B / P rows. Each piece's gradient is that of its own mean loss, weighted
// by its share of this rank's labelled positions, and the rank's sum by the rank's share of the
// step's (the weight of allreduce_gradients): the gradient of the N · B rows' mean loss, whatever
// their masks.
struct StepData {
  std::vector<Batch> micro;    // this rank's pieces: P per micro-batch, in order
  std::vector<double> weight;  // each one's share of this rank's labelled positions
  double rank_weight = 1;      // this rank's share of the step's
};

StepData step_data(const RunParts& p, std::size_t P) {
  const auto B = static_cast<std::size_t>(p.c.batch), N = static_cast<std::size_t>(p.c.grad_accum);
  const Batch all = p.data.next(N * B, p.data_rng);
  const std::size_t S = p.shard.size();
  StepData d;
  std::vector<std::size_t> labelled, rows;
  std::size_t rank_labelled = 0;
  for (std::size_t k = 0; k < N; ++k) {
    for (std::size_t t = 0; t < P; ++t) {
      const std::size_t first = k * B + p.shard.begin;
      const Shard piece{first + S * t / P, first + S * (t + 1) / P};
      d.micro.push_back(shard_of(all, piece));
      labelled.push_back(labelled_rows(all.targets, piece.begin, piece.end));
      rows.push_back(piece.size());
      rank_labelled += labelled.back();
    }
  }
  const std::size_t rank_rows = N * S;
  d.rank_weight = labelled_share(rank_labelled, rank_rows,
                                 labelled_rows(all.targets, 0, all.size()), all.size());
  for (std::size_t j = 0; j < d.micro.size(); ++j)
    d.weight.push_back(labelled_share(labelled[j], rows[j], rank_labelled, rank_rows));
  return d;
}

// The gradients of the step's micro-batches, summed over the ranks with their shares as weights.
void reduce_gradients(const RunParts& p, LoopState& s, double weight) {
  p.backend.synchronize();
  if (p.comm.size() > 1) {
    const auto t = Clock::now();
    allreduce_gradients(p.comm, p.params, weight, s.staging);
    s.allreduce_seconds += seconds_since(t);
  }
}

// Read before the update, which clipping and the optimizer base on the same gradients.
void record_grad_norms(const RunParts& p, LayerNorms& norms) {
  for (std::size_t l = 0; l < p.model.layers(); ++l) {
    norms.wq_grad[l] = p.backend.grad_norm(p.model.w_q_name(l));
    norms.wk_grad[l] = p.backend.grad_norm(p.model.w_k_name(l));
  }
}

// --skip-outliers, as llm.c's train_gpt2.cu does it: the step's loss (the cross-entropy of the
// whole batch, agreed across the ranks) and its global gradient norm (after the allreduce and
// before clipping: the same gradients, so the same norm, on every rank) enter their detectors
// whatever is decided, then the step is an outlier when either z-score is finite and above the
// threshold. While the windows fill (the first 128 steps of a run) no step is skipped.
bool outlier_step(const RunParts& p, OutlierSkip& o, double loss) {
  const double z_loss = o.loss.update(loss);
  const double z_grad = o.grad_norm.update(p.backend.grad_norm());
  const double limit = p.c.skip_outliers;
  return (std::isfinite(z_loss) && z_loss > limit) || (std::isfinite(z_grad) && z_grad > limit);
}

void update_weights(const RunParts& p) {
  if (p.c.clip > 0) p.backend.clip_grad_norm(p.c.clip);
  p.backend.step();
  p.backend.synchronize();
}

// A logged step after its update: the replicas agree, the eval, metrics.csv's row. False when the
// eval loss is non-finite (the run diverged).
bool log_step(const RunParts& p, LoopState& s, double lr) {
  const std::size_t step = s.step;
  p.backend.sync_host();  // the weight norms of the row and the checksum read the host copy
  check_replicas(p.comm, p.params, step + 1);
  s.st = eval_all(p);
  s.eval_step = step + 1;
  log_row(p, s.norms, step + 1, s.last_loss, s.last_z_term, lr, s.st, s.skipped);
  s.result.layer0_final = layer_zero(p, s.st, s.norms);
  s.result.final_eval_loss = s.st.loss;
  s.result.final_eval_acc = s.st.accuracy;
  if (!std::isfinite(s.st.loss)) {
    diverge(s.result, step + 1, p.model.locate_nonfinite(p.eval), "eval loss");
    return false;
  }
  return true;
}

void report_progress(const RunParts& p, const LoopState& s, double loss, double lr, bool log_now) {
  char detail[160];
  std::snprintf(detail, sizeof detail, "loss %.4f eval_loss %.4f eval_acc %.3f lr %.3g", loss,
                s.st.loss, s.st.accuracy, lr);
  p.progress({"step", p.start, s.step + 1, p.steps, seconds_since(s.t0), detail, log_now});
}

// Step s.step: forward, backward, update, and the eval, checkpoint and progress when due. False
// when the run ends here (a rank asked to stop, or it diverged); s.step then counts the steps
// done.
bool train_step(const RunParts& p, LoopState& s) {
  const std::size_t step = s.step;
  const double lr = p.schedule.lr_at(step);
  p.backend.set_lr(lr);
  const auto P = static_cast<std::size_t>(p.backend.batch_threads());  // parts per micro-batch
  const StepData d = step_data(p, P);
  const std::size_t N = d.micro.size();
  // The dropout masks' key: one per piece (the step's own when N = 1).
  const auto dropout_step = [&](std::size_t k) { return static_cast<std::uint64_t>(step * N + k); };
  auto step_start = Clock::now();
  TrainBackend::Loss local;  // this rank's: the pieces' losses, weighted
  std::size_t failed = 0;    // the piece whose loss was non-finite (if one was)
  const auto add = [&](std::size_t k, const TrainBackend::Loss& loss) {
    local.cross_entropy += d.weight[k] * loss.cross_entropy;
    local.z_term += d.weight[k] * loss.z_term;
    if (std::isfinite(loss.total())) return true;
    failed = k;
    local.cross_entropy = std::numeric_limits<double>::quiet_NaN();
    return false;
  };
  p.backend.zero_grad();
  if (P == 1) {
    for (std::size_t k = 0; k < N; ++k) {
      p.backend.set_step(static_cast<std::uint64_t>(p.c.seed), dropout_step(k));
      if (!add(k, p.backend.forward_loss(d.micro[k], d.weight[k]))) break;
      p.backend.backward();  // adds d.weight[k] times its gradient
    }
  } else {  // one parallel region per micro-batch: its P parts at once
    for (std::size_t k = 0; k < N; k += P) {
      p.backend.set_step(static_cast<std::uint64_t>(p.c.seed), dropout_step(k));
      const std::vector<TrainBackend::Loss> losses = p.backend.forward_backward(
          std::span(d.micro).subspan(k, P), std::span(d.weight).subspan(k, P), dropout_step(k));
      bool finite = true;
      for (std::size_t t = 0; t < P && finite; ++t) finite = add(k + t, losses[t]);
      if (!finite) break;
    }
  }
  const std::optional<TrainBackend::Loss> agreed = agreed_loss(p, local, d.rank_weight);
  if (!agreed) {
    s.result.interrupted = true;
    return false;
  }
  if (!std::isfinite(agreed->total())) {
    p.backend.set_step(static_cast<std::uint64_t>(p.c.seed), dropout_step(failed));
    diverge(s.result, step + 1, p.backend.locate_nonfinite(d.micro[failed]), "loss");
    s.last_loss = std::numeric_limits<double>::quiet_NaN();
    return false;
  }
  s.last_loss = agreed->cross_entropy;
  s.last_z_term = agreed->z_term;
  reduce_gradients(p, s, d.rank_weight);
  s.step_seconds += seconds_since(step_start);
  const bool log_now =
      (step + 1) % static_cast<std::size_t>(p.c.eval_every) == 0 || step + 1 == p.steps;
  if (log_now) record_grad_norms(p, s.norms);
  step_start = Clock::now();
  // A skipped step leaves the weights, the optimizer's state and its step count as they were; the
  // step itself (the LR schedule's, the data stream's, the dropout keys') advances.
  s.skipped = s.outliers && outlier_step(p, *s.outliers, s.last_loss);
  if (s.skipped)
    ++s.outliers->skipped;
  else
    update_weights(p);
  s.step_seconds += seconds_since(step_start);
  if (log_now && !log_step(p, s, lr)) {
    ++s.step;  // the diverged step was taken
    return false;
  }
  if (p.c.save_every > 0 && (step + 1) % static_cast<std::size_t>(p.c.save_every) == 0)
    p.saver.save(step + 1, p.backend, p.opt, p.params, p.data_rng, outlier_state(s));
  if (p.progress) report_progress(p, s, s.last_loss, lr, log_now);
  return true;
}

// The run's figures once the loop ended: steps, losses, time and throughput.
void fill_result(const RunParts& p, LoopState& s, const TaskShape& shape) {
  TrainResult& result = s.result;
  const std::size_t step = s.step;
  result.steps_done = static_cast<int>(step);
  result.steps_to_target = p.log ? p.log->steps_to_target() : -1;
  result.final_train_loss = s.last_loss;
  if (result.diverged) result.final_eval_loss = std::numeric_limits<double>::quiet_NaN();
  result.seconds = seconds_since(s.t0);
  result.device = p.backend.name();
  result.step_seconds = s.step_seconds;
  const std::size_t steps_run = step > p.start ? step - p.start : 0;
  if (steps_run > 0 && s.step_seconds > 0)
    result.tokens_per_second = static_cast<double>(steps_run * static_cast<std::size_t>(p.c.batch) *
                                                   static_cast<std::size_t>(p.c.grad_accum) *
                                                   static_cast<std::size_t>(shape.seq_len)) /
                               s.step_seconds;
  result.flops_per_token =
      transformer_flops_per_token(p.c.model, static_cast<std::size_t>(shape.seq_len));
  result.world_size = p.comm.size();
  result.batch_threads = p.backend.batch_threads();
  result.distributed = p.comm.name();
  result.skipped_steps = s.outliers ? s.outliers->skipped : 0;
  const std::vector<ParamGroupPlan> plan = plan_param_groups(p.c);  // in p.opt's group order
  for (std::size_t g = 0; g < p.opt.size(); ++g) {
    const Optimizer<float>& opt = *p.opt.group(g).optimizer;
    for (std::size_t i = 0; i < opt.parameters().size(); ++i) {
      const std::size_t n = opt.parameters()[i].param->size();
      result.param_tensors += 1;
      result.param_values += n;
      if (opt.decays(i) && plan.at(g).weight_decay > 0) {
        result.decayed_tensors += 1;
        result.decayed_values += n;
      }
    }
  }
  if (steps_run > 0)
    result.allreduce_seconds_per_step = s.allreduce_seconds / static_cast<double>(steps_run);
  if (p.c.measure_peaks && steps_run > 0 && p.context.backend == Backend::cpu &&
      p.comm.size() == 1) {
    result.fma_peak = measure_fma_peak(p.context.threads);
    result.gemm_peak_gflops = measure_gemm_peak_gflops<float>(p.context.threads);
  }
}

// The run's last checks and files: the replicas agree, the final checkpoint, and on rank 0
// OUT/attention.json and OUT/summary.json.
void finish_outputs(const RunParts& p, const LoopState& s) {
  const TrainResult& result = s.result;
  if (p.comm.size() > 1 && !result.diverged) {
    p.backend.sync_host();
    check_replicas(p.comm, p.params, s.step);
  }
  // A diverged model is never saved: its weights may hold non-finite values.
  if (!result.diverged)
    p.saver.save(s.step, p.backend, p.opt, p.params, p.data_rng, outlier_state(s));
  if (p.lead && s.st.example_tq > 0)  // "init" is this invocation's first eval (the resumed step)
    write_attention_file(p.c.out + "/attention.json", s.first_st, p.start, s.st, s.eval_step);
  if (p.lead) write_summary(p.c.out + "/summary.json", p.c, result);
}

TrainResult train_impl(const TrainConfig& config_in, const Context& context,
                       DeviceOps<float>* device_ops, Communicator& comm,
                       const std::function<void()>& setup_done) {
  const int world = comm.size(), rank = comm.rank();
  const bool lead = rank == 0;
  TrainConfig c = config_in;
  prepare_task(c);
  const bool resuming = !c.resume.empty();
  const RunMeta resumed = resuming ? check_resume(config_in, c) : RunMeta{};
  validate(c);
  validate(context, "train");
  check_memory(estimate_memory(c), "train");
  const ThreadScope threads(context.threads);  // this thread's count, for this run only
  const TaskShape shape = task_shape(c.task);
  c.model = resolve_model(c.model, shape);  // the effective config records what the task decided
  const TrainData data(c, shape);
  const Shard shard = shard_rows(static_cast<std::size_t>(c.batch), rank, world, "train: batch");
  const Shard eval_shard = shard_rows(data.eval.size(), rank, world, "train: eval_size");
  const Batch eval = shard_of(data.eval, eval_shard);

  std::unique_ptr<DeviceOps<float>> own_ops;  // a CUDA backend made for this run
  DeviceOps<float>* ops = choose_ops(context, device_ops, own_ops);
  check_arg(c.precision == GemmPrecision::fp32 || ops == &cpu_ops<float>(), "train", "precision",
            std::string(enum_name(GemmPrecision::fp32)) + " on a device backend (" +
                std::string(enum_name(c.precision)) + " runs on the CPU backend)",
            "'" + std::string(enum_name(c.precision)) + "' on " + ops->name());
  // The run's float gemms in bf16 (lib/README.md, "Mixed precision"), for this run only.
  const blas::GemmPrecisionScope precision(c.precision);
  Rng init_rng(c.seed);
  Rng data_rng(data_seed(c.seed));
  Model model(c.model, init_rng);
  ParameterList<float> params = model.parameters();
  const auto opt = std::make_unique<OptimizerGroups<float>>(make_optimizer_groups(c, params));
  const auto steps = static_cast<std::size_t>(c.steps);
  const LrSchedule schedule = make_schedule(c, steps);
  const std::size_t start = resuming ? resumed.step : 0;
  if (resuming) restore_training_state(c, resumed, params, *opt, data_rng);
  model.to(*ops);  // after the resume load (into the host copy); the optimizer follows
  TrainBackend backend(model, *opt, c.z_loss);
  backend.use_batch_threads(c.model, batch_threads(c, context, *ops, shard));

  std::optional<OutlierSkip> outliers = outlier_skip(c, resumed, resuming);
  std::optional<MetricsLog> log = open_outputs(c, model, lead, resuming, start);
  const RunSaver saver(c.out + "/model.safetensors", to_json_text(c), c.write_checkpoint && lead,
                       c.weights_only);
  const ProgressFn progress = c.progress && lead ? terminal_progress() : ProgressFn();
  const RunParts p{.c = c,
                   .context = context,
                   .comm = comm,
                   .data = data,
                   .shard = shard,
                   .eval = eval,
                   .model = model,
                   .params = params,
                   .opt = *opt,
                   .backend = backend,
                   .schedule = schedule,
                   .log = log,
                   .saver = saver,
                   .progress = progress,
                   .data_rng = data_rng,
                   .start = start,
                   .steps = steps,
                   .d_k = c.model.block.attention.head_dim_k(),
                   .lead = lead};
  setup_done();  // from here on every rank is in the run: an error is a RankFailure

  LoopState s(model.layers());
  s.outliers = std::move(outliers);
  s.t0 = Clock::now();
  first_eval(p, s, resuming);
  for (s.step = start; s.step < steps; ++s.step) {
    if (stop_before(p, s.step)) {
      s.result.interrupted = true;
      break;
    }
    if (!train_step(p, s)) break;
  }
  fill_result(p, s, shape);
  finish_outputs(p, s);
  return s.result;
}

}  // namespace

TrainResult train_model(const TrainConfig& config, const Context& context,
                        DeviceOps<float>* device_ops) {
  Communicator& comm = context.comm ? *context.comm : single_process();
  if (comm.size() == 1) return train_impl(config, context, device_ops, comm, [] {});
  bool started = false;
  try {
    return train_impl(config, context, device_ops, comm, [&] {
      agree_on_setup(comm, false, false);
      started = true;
    });
  } catch (const PeerFailure&) {
    throw;
  } catch (const ReplicaMismatch&) {
    throw;  // every rank throws it
  } catch (const std::exception& e) {
    if (started)
      throw RankFailure("rank " + std::to_string(comm.rank()) + " of " +
                        std::to_string(comm.size()) + ": " + e.what());
    agree_on_setup(comm, true, is_bad_input(e));
    throw;
  }
}

namespace {
// A saved run's config and trained model (on the CPU).
struct LoadedRun {
  RunMeta meta;
  TrainConfig config;
  std::unique_ptr<Model> model;
};
LoadedRun load_run(const std::string& run_dir) {
  const std::string path = run_dir + "/model.safetensors";
  LoadedRun r;
  r.meta = read_run_meta(path);
  read_saved_config(r.meta, path, r.config);
  check_memory(estimate_memory(r.config), "load " + path);
  Rng rng(r.config.seed);
  r.model = std::make_unique<Model>(resolve_model(r.config.model, task_shape(r.config.task)), rng);
  ParameterList<float> params = r.model->parameters();
  load_run_checkpoint(path, params, nullptr);
  return r;
}
}  // namespace

GenerateReport generate_from_run(const GenerateRequest& request, const Context& context,
                                 const std::function<void(const std::string&)>& on_text) {
  validate(context, "generate");
  check_arg(request.tokens >= 1, "generate", "tokens", ">= 1", std::to_string(request.tokens));
  const ThreadScope threads(context.threads);
  std::unique_ptr<DeviceOps<float>> own_ops;  // outlives the model on it
  if (context.backend == Backend::cuda) {
    if (!cuda_available()) {
      check_arg(
          false, "generate", "device", "a usable CUDA device for 'cuda'",
          cuda_built() ? "none (no driver or no GPU)" : "none (attnlab was built without CUDA)");
    }
    own_ops = make_cuda_device_ops<float>();
  }
  LoadedRun run = load_run(request.run_dir);
  const TrainConfig& c = run.config;
  check_arg(c.task.kind == TaskKind::text, "generate", "checkpoint",
            "a run of task text (a language model)",
            "a run of task " + std::string(to_string(c.task.kind)) + " (" + request.run_dir + ")");
  const TextVocab vocab(c.task);
  check_arg(!request.prompt.empty(), "generate", "--prompt", "at least one character", "''");
  const std::vector<int> prompt = vocab.encode(request.prompt, "--prompt");
  if (own_ops) run.model->to(*own_ops);
  Sampler sampler(request.sampler);
  GenerateReport report;
  const auto t0 = Clock::now();
  const std::vector<int> ids =
      generate(run.model->transformer(), prompt, static_cast<std::size_t>(request.tokens), sampler,
               [&](int id) {
                 const std::string piece = vocab.decode(id);
                 report.text += piece;
                 if (on_text) on_text(piece);
                 return true;
               },
               {.use_cache = request.use_cache});
  report.seconds = std::chrono::duration<double>(Clock::now() - t0).count();
  report.tokens = static_cast<int>(ids.size());
  return report;
}

EvalReport evaluate_run(const std::string& run_dir, int show, const std::string& valid_file,
                        const std::string& logits_file) {
  LoadedRun run = load_run(run_dir);
  const RunMeta& meta = run.meta;
  const TrainConfig& c = run.config;
  const TaskShape shape = task_shape(c.task);
  Model& model = *run.model;
  const std::string valid = !valid_file.empty() ? valid_file : c.valid_file;
  const bool text = c.task.kind == TaskKind::text;
  const Batch eval = text            ? text_eval_set(c, valid)
                     : valid.empty() ? eval_batch(c.task, static_cast<std::size_t>(c.eval_size))
                                     : read_data_file(valid, &shape);
  const Tensor3<float> logits = model.forward(eval);
  if (!logits_file.empty()) {
    save_safetensors(logits_file, {make_stored_tensor<float>("logits", logits)},
                     {{"format", "pt"}});
  }
  const LossResult loss = masked_cross_entropy(logits, eval.targets, false);
  const TokenIds pred = predictions(logits);
  EvalReport r;
  r.loss = loss.loss;
  r.accuracy = loss.accuracy;
  r.examples = static_cast<int>(eval.size());
  std::ostringstream os;
  os << "run " << run_dir << ": task " << to_string(c.task.kind) << ", step " << meta.step
     << ", scaling " << to_string(c.model.block.attention.sdpa.scaling) << ", d_k "
     << c.model.block.attention.head_dim_k() << "\n";
  os << "eval set ("
     << (!valid.empty() ? valid
         : text         ? "the last 10% of " + c.data_file
                        : std::string("the task's fixed eval set"))
     << "): " << eval.size() << " examples, " << loss.labelled << " labelled positions\n";
  char buf[160];
  std::snprintf(buf, sizeof buf, "loss %.4f  accuracy %.4f\n", r.loss, r.accuracy);
  os << buf;
  const std::size_t T = eval.length();
  const auto p = model.attention_weights(0);
  for (std::size_t b = 0;
       b < std::min<std::size_t>(static_cast<std::size_t>(std::max(show, 0)), eval.size()); ++b) {
    os << "\nexample " << b << ":\n";
    if (text) {
      const TextVocab vocab(c.task);
      std::string input, predicted;
      for (std::size_t t = 0; t < T; ++t) {
        input += vocab.decode(eval.fields[0](b, t));
        predicted += vocab.decode(pred(b, t));
      }
      os << "  text:       "
         << nlohmann::json(input).dump(-1, ' ', false, nlohmann::json::error_handler_t::replace)
         << "\n  next chars: "
         << nlohmann::json(predicted).dump(-1, ' ', false, nlohmann::json::error_handler_t::replace)
         << "  (the model's most likely next character at each position)\n";
    } else if (c.task.kind == TaskKind::recall) {
      os << "  pairs (key:value):";
      for (std::size_t t = 0; t + 1 < T; ++t)
        os << ' ' << eval.fields[0](b, t) << ':' << eval.fields[1](b, t);
      const int target = eval.targets(b, T - 1), guess = pred(b, T - 1);
      os << "\n  query key " << eval.fields[0](b, T - 1) << " -> predicted value " << guess
         << ", target " << target << (guess == target ? "  (right)" : "  (wrong)") << '\n';
      for (std::size_t h = 0; h < model.heads(); ++h) {
        std::vector<std::pair<float, std::size_t>> w;
        for (std::size_t j = 0; j < T; ++j) w.emplace_back(p(b, h, T - 1, j), j);
        std::sort(w.begin(), w.end(), [](auto& x, auto& y) { return x.first > y.first; });
        os << "  query attention (layer 0, head " << h << "), top keys:";
        for (std::size_t i = 0; i < std::min<std::size_t>(5, w.size()); ++i) {
          const std::size_t j = w[i].second;
          std::snprintf(buf, sizeof buf, " pos %zu (key %d%s) %.3f", j, eval.fields[0](b, j),
                        j + 1 == T ? ", the query itself" : "", static_cast<double>(w[i].first));
          os << buf << (i + 1 < std::min<std::size_t>(5, w.size()) ? "," : "");
        }
        os << '\n';
      }
    } else {
      os << "  input:    ";
      for (std::size_t t = 0; t < T; ++t) {
        for (std::size_t f = 0; f < eval.fields.size(); ++f)
          os << (f ? ":" : (t ? " " : "")) << eval.fields[f](b, t);
      }
      os << "\n  target:   ";
      for (std::size_t t = 0; t < T; ++t)
        os << (t ? " " : "")
           << (eval.targets(b, t) < 0 ? std::string("_") : std::to_string(eval.targets(b, t)));
      os << "\n  predicted:";
      for (std::size_t t = 0; t < T; ++t)
        os << ' ' << (eval.targets(b, t) < 0 ? std::string("_") : std::to_string(pred(b, t)));
      os << '\n';
    }
  }
  r.text = os.str();
  return r;
}

}  // namespace attnlab::app
