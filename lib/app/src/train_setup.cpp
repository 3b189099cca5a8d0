#include "train_setup.hpp"

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
#include "attnlab/app/token_file.hpp"
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

// The run's recipe as JSON: every field but the run control that a resumed run may change.
json recipe_json(const TrainConfig& c) {
  json j = c;
  for (const char* k : {"out", "save_every", "steps", "eval_batch"}) j.erase(k);
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

}  // namespace

// The data stream's seed: derived from the run seed only (splitmix64 of seed ^ a constant).
std::uint64_t data_seed(std::uint64_t seed) {
  std::uint64_t z = seed ^ 0xda7a5eedULL;
  z += 0x9e3779b97f4a7c15ULL;
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  return z ^ (z >> 31);
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
  if (c.task.kind == TaskKind::text)  // bits per byte of the text: compares across vocabularies
    j["final_eval_bpb"] = std::isfinite(r.final_eval_bpb) ? json(r.final_eval_bpb) : json(nullptr);
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
                {"wk_norm", num(z.wk_norm)},
                {"q_norm", num(z.q_norm)},
                {"k_norm", num(z.k_norm)},
                {"qk_cos", num(z.qk_cos)},
                {"wq_sigma1", num(z.wq_sigma1)},
                {"wk_sigma1", num(z.wk_sigma1)},
                {"ln_gain_max", num(z.ln_gain_max)},
                {"qn_gamma_max", num(z.qn_gamma_max)},
                {"qn_beta_norm", num(z.qn_beta_norm)},
                {"kn_gamma_max", num(z.kn_gamma_max)},
                {"kn_beta_norm", num(z.kn_beta_norm)}};
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
    if (r.amx_peak.gflops > 0) {  // a bf16 run where AMX is usable
      j["utilisation"]["amx_peak_gflops"] = r.amx_peak.gflops;
      j["utilisation"]["of_amx_peak"] = gflops / r.amx_peak.gflops;
    }
  }
  j["device"] = r.device;
  j["blas_core"] = blas_info().core;
  j["gemm_engine"] = blas_info().engine_name;  // the float gemms'
  j["gemm_precision"] = c.precision;
  if (c.precision == GemmPrecision::bf16 && r.device == "cpu") {
    j["bf16_gemm"] = blas_info().bf16_engine_name;
  }
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
  saved.task.tokenizer = c.resume + "/" + kTokenizerModel;  // a BPE run's own copy
  read_saved_config(resumed, resume_path, saved);
  // The saved config is the recipe; only run control and steps may differ (both resolved, so a
  // run saved before the model recorded its vocabularies compares equal).
  const TaskShape saved_shape = task_shape(saved.task);
  saved.model = resolve_model(saved.model, saved_shape);
  TrainConfig given = config_in;
  given.task.tokenizer = c.task.tokenizer;  // the token directory's (prepare_token_task)
  given.task.tokenizer_hash = c.task.tokenizer_hash;
  given.model = resolve_model(given.model, task_shape(given.task));
  const json want = recipe_json(saved), got = recipe_json(given);
  const std::string diff = first_difference(want, got);
  if (!diff.empty())
    check_arg(false, "train", "resume: " + diff,
              at_path(want, diff).dump() +
                  " (the saved run's; only steps, out, save_every and eval_batch (and the "
                  "--threads/--device of the run context) may change)",
              at_path(got, diff).dump());
  check_arg(config_in.steps >= static_cast<int>(resumed.step), "train", "steps",
            ">= the saved step " + std::to_string(resumed.step) + " when resuming",
            std::to_string(config_in.steps));
  c.model = given.model;
  if (config_in.out == TrainConfig{}.out) c.out = c.resume;
  return resumed;
}

namespace {
// A delimiter as one line of an error message: newlines, tabs, returns and backslashes escaped.
std::string escaped(const std::string& text) {
  std::string out;
  for (char ch : text) {
    if (ch == '\n')
      out += "\\n";
    else if (ch == '\t')
      out += "\\t";
    else if (ch == '\r')
      out += "\\r";
    else if (ch == '\\')
      out += "\\\\";
    else
      out += ch;
  }
  return out;
}
}  // namespace

std::optional<DocumentBounds> text_documents(const TrainConfig& c, const TextVocab& vocab,
                                             const std::vector<int>& tokens,
                                             const std::string& source, bool require,
                                             const char* op) {
  if (c.pack_documents.empty()) return std::nullopt;
  const char* field = "pack_documents (--pack-documents)";
  std::vector<int> delimiter;
  try {
    delimiter = vocab.encode(c.pack_documents, "the delimiter");
  } catch (const DataFileError& e) {
    check_arg(false, op, field, "a delimiter made of the text's characters",
              "'" + escaped(c.pack_documents) + "' (" + e.what() + ")");
  }
  DocumentBounds docs = find_documents(tokens, delimiter);
  docs.restart_positions = c.pack_rope_restart;
  if (require) {
    check_arg(!docs.delimiters.empty(), op, field,
              "a delimiter that occurs in the training text of " + source,
              "'" + escaped(c.pack_documents) + "', found 0 times");
  }
  return docs;
}

// A text task's eval set: eval_size fixed blocks of the validation tokens, which are the last 10%
// of data_file, or the whole of valid_file when given.
Batch text_eval_set(const TrainConfig& c, const std::string& valid_file,
                    std::vector<int>* train_tokens, const char* op) {
  if (c.task.vocab == VocabKind::bpe) {
    check_arg(valid_file.empty(), op, "valid_file",
              "none for a BPE run (its eval set is the token directory's val.bin)", valid_file);
    return token_eval_set(c);
  }
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
  check_arg(valid.size() > block, op, "valid_file",
            "a text of at least block + 1 = " + std::to_string(block + 1) + " tokens",
            std::to_string(valid.size()) + " tokens");
  const std::optional<DocumentBounds> docs =
      text_documents(c, vocab, valid, valid_file.empty() ? c.data_file : valid_file, false, op);
  return text_eval_batch(valid, block, static_cast<std::size_t>(c.eval_size),
                         docs ? &*docs : nullptr);
}

TrainData::TrainData(const TrainConfig& c, const TaskShape& shape) : task(c.task) {
  if (c.task.kind == TaskKind::text && c.task.vocab == VocabKind::bpe) {
    eval = text_eval_set(c, c.valid_file, nullptr);
    tokens = std::make_shared<const TokenFile>(c.data_file, check_token_dir(c), kTrainBin);
    if (!c.pack_documents.empty()) docs = token_documents(*tokens, c.pack_rope_restart);
    return;
  }
  if (c.task.kind == TaskKind::text) {
    eval = text_eval_set(c, c.valid_file, &text);
    docs = text_documents(c, TextVocab(c.task), text, c.data_file, true, "train");
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

Batch TrainData::next(std::size_t batch, Rng& rng) const {
  const DocumentBounds* packed = docs ? &*docs : nullptr;
  if (tokens) return token_batch(*tokens, static_cast<std::size_t>(task.block), batch, rng, packed);
  if (task.kind == TaskKind::text)
    return text_batch(text, static_cast<std::size_t>(task.block), batch, rng, packed);
  if (!file) return generate_batch(task, batch, rng);
  std::vector<std::size_t> rows(batch);
  for (auto& r : rows) r = rng.below(file->size());
  return gather_batch(*file, rows);
}

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

double seconds_since(TrainClock::time_point t) {
  return std::chrono::duration<double>(TrainClock::now() - t).count();
}

// The backend, chosen once: the model moves there (its optimizer follows), and the loop runs the
// same code whatever it is. A CUDA backend made for this run goes to own_ops, which the caller
// makes before the model, whose buffers it must outlive.
DeviceOps<float>* choose_ops(const Context& context, std::unique_ptr<DeviceOps<float>>& own_ops,
                             const char* op) {
  DeviceOps<float>* ops = &cpu_ops<float>();
  if (context.backend == Backend::cuda) {
    DeviceOps<float>* device_ops = context.device;
    if (!device_ops) {
      if (!cuda_available()) {
        check_arg(
            false, op, "device", "a usable CUDA device for 'cuda'",
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
    if (c.task.kind == TaskKind::text && c.task.vocab == VocabKind::bpe) copy_tokenizer(c, c.out);
    log.emplace(c.out + "/metrics.csv", model.layers(), model.heads(),
                c.task.kind == TaskKind::recall, resuming ? c.resume + "/metrics.csv" : "", start,
                c.z_loss > 0, c.skip_outliers > 0, c.task.kind == TaskKind::text,
                c.model.block.attention.qk_norm);
  }
  return log;
}

}  // namespace attnlab::app
