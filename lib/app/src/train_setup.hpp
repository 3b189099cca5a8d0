// The trainer's set-up (lib/app/src/trainer.cpp runs it): the data, resuming, the backend, the
// schedule, the outputs and the summary, and the ranks' agreement that each one set up. Internal to
// the app (lib/app/src).
#pragma once

#include <chrono>
#include <cstdint>
#include <exception>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "attnlab/app/data_file.hpp"
#include "attnlab/app/model.hpp"
#include "attnlab/app/run_checkpoint.hpp"
#include "attnlab/app/text.hpp"
#include "attnlab/app/trainer.hpp"
#include "attnlab/distributed.hpp"
#include "attnlab/optim/param_groups.hpp"
#include "attnlab/optim/schedule.hpp"
#include "attnlab/random.hpp"
#include "train_metrics.hpp"
#include "train_saver.hpp"

namespace attnlab::app {

using TrainClock = std::chrono::steady_clock;

// The data stream's seed: derived from the run seed only (splitmix64 of seed ^ a constant).
std::uint64_t data_seed(std::uint64_t seed);

Parameter<float>* find_param(const ParameterList<float>& params, const std::string& name);

// OUT/summary.json: the config, the result, the kernels and the thread split.
void write_summary(const std::string& path, const TrainConfig& c, const TrainResult& r);

// Resume: checks config_in against the run saved in config_in.resume (see train_model), sets c's
// resolved model and default out, and returns the checkpoint's metadata.
RunMeta check_resume(const TrainConfig& config_in, TrainConfig& c);

// With pack_documents: the documents of a char or byte text's tokens (its delimiter encoded by
// vocab); std::nullopt without. Throws std::invalid_argument naming pack_documents for a
// delimiter outside the vocabulary, and, with require, for one that never occurs in `tokens`
// (`source` names the file).
std::optional<DocumentBounds> text_documents(const TrainConfig& c, const TextVocab& vocab,
                                             const std::vector<int>& tokens,
                                             const std::string& source, bool require,
                                             const char* op);

// A text task's eval set: eval_size fixed blocks of the validation tokens, which are the last 10%
// of data_file, or the whole of valid_file when given; the training tokens into train_tokens. `op`
// names the caller in errors.
Batch text_eval_set(const TrainConfig& c, const std::string& valid_file,
                    std::vector<int>* train_tokens = nullptr, const char* op = "train");

// The training data: batches generated from the data Rng, or drawn (by the same Rng) from a file;
// the eval set fixed by the task, or read from a file.
class TokenFile;

struct TrainData {
  TrainData(const TrainConfig& c, const TaskShape& shape);
  Batch next(std::size_t batch, Rng& rng) const;
  TaskConfig task;
  std::optional<Batch> file;
  std::vector<int> text;                    // task text: the training part's tokens
  std::shared_ptr<const TokenFile> tokens;  // task text, vocab bpe: the memory-mapped train.bin
  std::optional<DocumentBounds> docs;       // task text with pack_documents: the training part's
  Batch eval;
};

// The labelled positions (targets != kIgnoreIndex) of rows [begin, end) of `targets`.
std::size_t labelled_rows(const TokenIds& targets, std::size_t begin, std::size_t end);
// Rows [begin, end) of a batch.
Batch shard_of(const Batch& batch, const Shard& shard);
bool is_bad_input(const std::exception& e);
// The ranks' agreement that each one set up (see PeerFailure). `failed`: this rank's setup threw
// (the caller rethrows its own error when this returns).
void agree_on_setup(Communicator& comm, bool failed, bool bad_input);
double seconds_since(TrainClock::time_point t);
// The backend, chosen once, the one way train and generate pick it (a CUDA backend made for this
// run goes to own_ops, which the caller makes before the model, whose buffers it must outlive).
// `op` names the caller in the error for a missing device.
// context.device, when not null, is the CUDA backend to use.
DeviceOps<float>* choose_ops(const Context& context, std::unique_ptr<DeviceOps<float>>& own_ops,
                             const char* op = "train");
// The batch-parallel step's thread count (TrainConfig::thread_split).
int batch_threads(const TrainConfig& c, const Context& context, DeviceOps<float>& ops,
                  const Shard& shard);
LrSchedule make_schedule(const TrainConfig& c, std::size_t steps);
// A resumed run's weights, optimizer state and data stream position.
void restore_training_state(const TrainConfig& c, const RunMeta& resumed,
                            ParameterList<float>& params, OptimizerGroups<float>& opt,
                            Rng& data_rng);
// --skip-outliers' detectors (nullopt when off): empty, or a resumed run's from its checkpoint.
std::optional<OutlierSkip> outlier_skip(const TrainConfig& c, const RunMeta& resumed,
                                        bool resuming);
// Rank 0's outputs from the start (other ranks: nullopt).
std::optional<MetricsLog> open_outputs(const TrainConfig& c, const Model& model, bool lead,
                                       bool resuming, std::size_t start);

}  // namespace attnlab::app
