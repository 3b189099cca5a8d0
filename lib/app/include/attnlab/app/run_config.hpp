// The run config of `attnlab train` (and of every run of a study): task + model + optimizer +
// schedule + run control, one plain struct like the model's TransformerConfig, which it nests.
//
// JSON: every field by name (the model nested as in io/config_json.hpp). Reading overlays a file
// on the value it is read into, so a config file names only what differs from the defaults; a key
// that is not a field is an error naming it. Every run writes its effective config to
// OUT/config.json, and that file is accepted back by `attnlab train --config`.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "attnlab/app/context.hpp"
#include "attnlab/app/run_checkpoint.hpp"
#include "attnlab/app/tasks.hpp"
#include "attnlab/blas.hpp"
#include "attnlab/enum_table.hpp"
#include "attnlab/io/config_json.hpp"
#include "attnlab/nn/transformer.hpp"
#include "attnlab/optim/muon.hpp"
#include "attnlab/optim/param_groups.hpp"
#include "attnlab/optim/schedule.hpp"

namespace attnlab::app {

// How a CPU run's threads share a training step (TrainConfig::thread_split).
enum class ThreadSplit { batch, ops };

}  // namespace attnlab::app

namespace attnlab {
template <>
struct EnumTable<app::ThreadSplit> {
  static constexpr EnumEntry<app::ThreadSplit> entries[] = {
      {app::ThreadSplit::batch, "batch",
       "each thread trains its part of the batch through the whole model, one parallel region per "
       "step"},
      {app::ThreadSplit::ops, "ops", "every op splits its own work"},
  };
  static constexpr EnumParseText parse = {"train", "thread_split", NameList::or_words, true};
};
}  // namespace attnlab

namespace attnlab::app {

// The JSON of the app's table enums (TaskKind, VocabKind, ...): their names, as the library's
// (attnlab/io/config_json.hpp); argument-dependent lookup looks for them here.
using attnlab::from_json;
using attnlab::to_json;

// The app's model defaults: C 64, one head, one attention-only layer, learned positions, d_ff 0
// (4 · C). vocab_sizes, max_len and out_vocab are decided by the task (resolve_model).
TransformerConfig default_model();

// The delimiter of packed documents when --pack-documents names none: a blank line.
inline constexpr const char* kDefaultDocumentDelimiter = "\n\n";

struct TrainConfig {
  TaskConfig task;
  std::string data_file;   // train on this file instead of generated batches ("" = generate)
  std::string valid_file;  // eval on this file ("" = the task's fixed eval set)
  // Packed documents (text task; attnlab/app/text.hpp): the delimiter text that ends a document in
  // a char or byte corpus ("" = no packing; the CLI's default is a blank line, "\n\n"). A BPE
  // token directory uses its own document starts and takes only the default. Attention stays
  // within documents (the CPU paths only) and no target crosses a boundary.
  std::string pack_documents;
  // With pack_documents: RoPE positions restart at 0 at each document (needs positions = rope).
  bool pack_rope_restart = false;
  TransformerConfig model = default_model();
  // EnumTable<OptimizerKind>. OptimizerKind::muon is the hybrid of the Muon recipes
  // (attnlab/optim/muon.hpp): Muon for the hidden matrices (the group named after it: blocks.*,
  // rank 2, at muon_lr) and AdamW (lr, beta1, beta2) for the rest (embeddings, head, norms,
  // biases, scales).
  OptimizerKind optimizer = OptimizerKind::adamw;
  double lr = 3e-3;
  double beta1 = 0.9, beta2 = 0.95;
  double momentum = 0.9;  // sgd
  // Muon (optimizer muon, or a param_groups entry with optimizer muon): its base lr (the schedule
  // scales it as it scales lr: the group runs at lr · muon_lr / lr), momentum, Nesterov, Newton–
  // Schulz steps and update scale (EnumTable<MuonScale>), named as in muon.py.
  double muon_lr = 0.02;
  double muon_momentum = 0.95;
  bool muon_nesterov = true;
  int muon_ns_steps = 5;
  MuonScale muon_scale = MuonScale::spectral;
  double weight_decay = 0;
  // Which parameters weight_decay applies to (EnumTable<DecayParams>). Recorded in the
  // checkpoint, so a resume keeps it.
  DecayParams decay_params = DecayParams::all;
  // How weight_decay scales with the LR (EnumTable<WeightDecayMode>, attnlab/optim/optimizer.hpp;
  // AdamW and Muon only: SGD's is coupled L2 and keeps the default). Recorded in the checkpoint,
  // so a resume keeps it.
  WeightDecayMode decay = WeightDecayMode::decoupled;
  // Parameter groups (config file only; lib/README.md, "Parameter groups"): a parameter joins the
  // first group whose match selects it and is updated by that group's optimizer (an
  // OptimizerKind name; "" this config's), at lr · lr_mult, with the group's weight_decay (none:
  // this config's); the rest form the group "default" with the fields above. decay_params applies
  // within every group. Empty: one group, as before. Recorded in the checkpoint, so a resume forms
  // the same groups.
  std::vector<ParamGroupSpec> param_groups;
  double clip = 0;  // 0: no clipping
  // PaLM's z-loss: z · (log Z)² per labelled position added to the loss, log Z the logsumexp of
  // its (softcapped) logits (Wortsman et al. 2023: 1e-4). 0: none.
  double z_loss = 0;
  // Skip the update of a step whose loss or global gradient norm has a z-score above this over
  // the last 128 steps (llm.c's -sl / -sg; attnlab/optim/outlier.hpp, lib/README.md). 0: off.
  double skip_outliers = 0;
  LrScheduleKind schedule = LrScheduleKind::warmup_cosine;  // EnumTable<LrScheduleKind>
  double min_lr = 0;  // cosine and wsd: the LR they decay to (nanoGPT: lr / 10)
  // wsd: the fraction of the steps whose LR decays linearly to min_lr, at the end (nanochat's
  // warmdown_ratio, 0.65 by default there too). In [0, 1].
  double warmdown = 0.65;
  int warmup = 0;
  int steps = 1000;
  int batch = 32;
  // Gradient accumulation: a step trains on grad_accum micro-batches of `batch` rows (an
  // effective batch of grad_accum · batch) with the gradient of their mean loss (lib/README.md).
  int grad_accum = 1;
  // The arithmetic of the model's float GEMMs (attnlab/blas.hpp, EnumTable<GemmPrecision>): as
  // stored, or bf16 mixed precision (GEMM operands rounded to bfloat16, products summed in fp32;
  // the weights, gradients, optimizer state, softmax, norms and loss stay fp32). bf16 is fast only
  // where the CPU has AMX (BlasInfo::bf16_engine); elsewhere it is emulated, slower than fp32. CPU
  // only.
  GemmPrecision precision = GemmPrecision::fp32;
  std::uint64_t seed = 0;
  int eval_every = 50;
  int eval_size = 512;
  // Rows per eval forward: the eval set runs in chunks of this many rows (0: --batch), so its
  // memory does not grow with eval_size. The figures do not depend on it beyond rounding.
  int eval_batch = 0;
  // Run control: may differ when a run is resumed (see train_model). The thread count, the stop
  // flag and the backend are not in the config: they travel in the Context given to train_model
  // (attnlab/app/context.hpp), so a run may be resumed with another thread count or on the other
  // device.
  std::string out = "runs/train";
  int save_every = 0;  // 0: only at the end
  // Checkpoints hold the weights and the config only (no optimizer state): smaller files to share
  // and evaluate, which cannot be resumed.
  bool weights_only = false;
  // Not part of the config file (one-off controls of this invocation):
  std::string resume;    // a run directory to continue from
  int stop_after = 0;    // > 0: stop after this step with a checkpoint, as if interrupted
  bool progress = true;  // live bar on a TTY, plain lines otherwise (false: silent)
  bool write_checkpoint = true;
  // A CPU run of one process measures the cores' FMA peak and the sgemm peak at its thread count
  // once the steps are done, for the utilisation in TrainResult and summary.json (about 0.3 s).
  // The CLI's train sets it; a study leaves it off (its jobs share the cores).
  bool measure_peaks = false;
  // How a CPU run's threads share a training step (lib/README.md, "Threads in the training step"):
  // ThreadSplit::batch: each thread trains its contiguous part of every micro-batch through the
  // whole model, every op on its own thread, in one parallel region per micro-batch, and the
  // parts' gradients are summed in thread order (the step then equals grad_accum · threads
  // micro-batches at one thread, to rounding); ThreadSplit::ops: every op splits its own work
  // across the threads (a parallel region per op). Either way the bits depend only on the thread
  // count. Device backends always split the ops. Not part of the config file: like the thread
  // count, it may differ on resume.
  ThreadSplit thread_split = ThreadSplit::batch;
};

// The model the task's data needs: vocab_sizes, max_len and out_vocab from the task shape (a
// value already set must agree: std::invalid_argument naming the field), d_ff 0 -> 4 · d_model.
// The result is validated (TransformerConfig::validate).
TransformerConfig resolve_model(const TransformerConfig& model, const TaskShape& shape);

// Throws std::invalid_argument naming the field (the model's rules are TransformerConfig's).
// Call prepare_task first.
void validate(const TrainConfig& config);

// What a task learns from its data before it can be validated: for a character-level text task
// without a vocabulary yet, reads data_file and sets task.chars to its characters (DataFileError
// for an unreadable, empty or non-UTF-8 file). Does nothing otherwise.
void prepare_task(TrainConfig& config);

// nlohmann-json (de)serialisers (reading overlays; see io/config_json.hpp). The enum fields
// are their names; a name that is not one is refused in the words validate() used when they were
// strings: "config key 'schedule': train: schedule expected constant|cosine|wsd, got linear".
void to_json(nlohmann::json& j, const TaskConfig& v);
void from_json(const nlohmann::json& j, TaskConfig& v);
void to_json(nlohmann::json& j, const TrainConfig& v);
void from_json(const nlohmann::json& j, TrainConfig& v);

// The JSON text of a config (what OUT/config.json and the checkpoint metadata hold).
std::string to_json_text(const TrainConfig& config);
// Overlays JSON text on `config` (ConfigError naming the key on an unknown key or a bad value).
// Also reads the flat layout that checkpoints written before the nested config hold.
void read_json_text(const std::string& text, TrainConfig& config);
// The same, from a file (std::invalid_argument naming the file when it cannot be read or parsed).
void read_config_file(const std::string& path, TrainConfig& config);
// Writes OUT/config.json-style files atomically.
void write_config_file(const std::string& path, const TrainConfig& config);
// Overlays the config saved in a run directory's checkpoint (DIR/model.safetensors) on `config`.
void read_run_config(const std::string& run_dir, TrainConfig& config);

// Overlays a checkpoint's model_config (meta, read from `path` by read_run_meta) on `config`, then
// checks that the model it describes is the one the file's tensors hold (names and shapes), before
// anything is allocated for it: std::invalid_argument "PATH: model_config: ..." naming the key or
// the first tensor that differs.
void read_saved_config(const RunMeta& meta, const std::string& path, TrainConfig& config);

// The run context a checkpoint keeps, so that a resumed run goes on as the uninterrupted one
// would: the thread count, how the threads share a step, and the device (each changes the last
// digits of the results).
struct RunContextRecord {
  int threads = 1;
  ThreadSplit thread_split = ThreadSplit::batch;
  Backend device = Backend::cpu;
};
// {"threads": N, "thread_split": "...", "device": "..."}.
std::string run_context_json(const RunContextRecord& record);
// The record of meta.run_context; nullopt when the checkpoint has none. Throws CheckpointError
// naming `path` for a record that does not parse.
std::optional<RunContextRecord> read_run_context(const RunMeta& meta, const std::string& path);

// What a training run allocates, in bytes, estimated from its config before anything is built (the
// model's float parameters are exact; activations are an upper estimate of what a step keeps).
struct MemoryEstimate {
  double parameters = 0;   // the weights and their gradients
  double optimizer = 0;    // AdamW's two moments, SGD's momentum
  double activations = 0;  // one training step (batch) or the eval set, whichever is larger
  double total() const { return parameters + optimizer + activations; }
};
// Validates the config first (its task must be prepared: prepare_task).
MemoryEstimate estimate_memory(const TrainConfig& config);
// The rows of one eval forward: eval_batch, or batch when it is 0, at most eval_size.
std::size_t eval_rows(const TrainConfig& config);

// The memory a run may use, in bytes, and where that figure came from: ATTNLAB_MEMORY_LIMIT when
// set (bytes, or with a K, M, G or T suffix, binary; "none" turns the check off), else the smaller
// of /proc/meminfo's MemAvailable and the address space that ulimit -v leaves this process.
// nullopt: no limit known.
struct MemoryLimit {
  double bytes = 0;
  std::string source;
};
std::optional<MemoryLimit> memory_limit();

// Throws std::invalid_argument "<what>: ..." naming the estimate (times `copies`, the runs that
// will be in memory at once) and the limit when it exceeds the limit.
void check_memory(const MemoryEstimate& estimate, std::string_view what, double copies = 1);

}  // namespace attnlab::app
