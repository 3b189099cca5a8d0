// Model checkpoints: a model's named parameters, the optimizer state and the training position,
// in one safetensors file (attnlab/io/safetensors.hpp).
//
// Layout: each parameter is a tensor named by its parameter name ("blocks.0.attn.w_q"), F32 for a
// float model and F64 for a double one; optimizer state tensors are stored as "optim.<name>" (the
// API takes and returns <name> without the prefix).
// __metadata__ holds
//   format_version  "attnlab-1"
//   dtype           "F32" | "F64"
//   model_config    the model config, as JSON text (stored verbatim)
//   step            the training step, decimal
//   rng_state       the Rng state, "s0 s1 cached_bits has_cached" in decimal (absent if not saved)
// and any extra string entries of CheckpointMeta::extra.
//
// Saving is atomic and refuses non-finite values. Loading validates everything before it touches
// the model: a failed load leaves the parameters (and the optimizer state) exactly as they were.
#pragma once

// First, before any xtensor header.
#include "attnlab/xtensor_config.hpp"

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <xtensor/xarray.hpp>

#include "attnlab/io/safetensors.hpp"
#include "attnlab/nn/parameter.hpp"
#include "attnlab/random.hpp"

namespace attnlab {

inline constexpr std::string_view kCheckpointFormatVersion = "attnlab-1";
inline constexpr std::string_view kOptimizerTensorPrefix = "optim.";

// Named tensors that are not parameters, e.g. an optimizer's state ("blocks.0.attn.w_q.exp_avg",
// stored as "optim.blocks.0.attn.w_q.exp_avg").
template <class T>
using TensorList = std::vector<std::pair<std::string, xt::xarray<T>>>;

struct CheckpointMeta {
  std::string model_config;       // JSON text; stored and returned verbatim
  std::uint64_t step = 0;         // the number of optimizer steps taken
  std::optional<Rng::State> rng;  // the training Rng, to continue exactly
  // More string metadata (e.g. the task name). Must not use the reserved keys listed above.
  std::map<std::string, std::string> extra;
};

struct CheckpointLoadOptions {
  // false: a tensor in the file that is neither a parameter nor optimizer state is an error.
  // true: such tensors are skipped and listed in LoadedCheckpoint::ignored_tensors.
  bool allow_extra_tensors = false;
};

struct LoadedCheckpoint {
  CheckpointMeta meta;
  std::vector<std::string> ignored_tensors;  // present in the file, not loaded
};

// Writes params (by name) and the optimizer state (under "optim.") to `path` atomically.
// Throws CheckpointError for a non-finite value (naming the tensor and the index), a duplicate or
// reserved name, or an I/O failure (the previous file at `path` is then intact); throws
// std::invalid_argument for a null parameter pointer.
template <class T>
void save_checkpoint(const std::string& path, const ParameterList<T>& params,
                     const TensorList<T>& optimizer_state, const CheckpointMeta& meta);

// Loads a checkpoint into the values params point to. Checks, before changing anything:
//  - the file is a valid safetensors file (see load_safetensors);
//  - format_version is "attnlab-1", and step and rng_state parse;
//  - every parameter is present, with dtype F32 (float) or F64 (double), or F16 or BF16 (converted
//    exactly: half-precision weights exported from Python), and the model's shape, and finite
//    values (after conversion);
//  - optimizer_state (when not null): if it is not empty, it names the tensors expected (without
//    the prefix) and their shapes, which must all be present (pass the optimizer's current state
//    so that restoring it afterwards cannot fail: the restore is then all-or-nothing); if it is
//    empty it is filled with every "optim." tensor of the file, prefix removed;
//  - no other tensors, unless options.allow_extra_tensors.
// Only then are the parameter values (and optimizer_state) assigned; grads are left alone.
// Throws CheckpointError naming the file and the problem; params are then unchanged.
template <class T>
LoadedCheckpoint load_checkpoint(const std::string& path, const ParameterList<T>& params,
                                 TensorList<T>* optimizer_state = nullptr,
                                 const CheckpointLoadOptions& options = {});

// Rng::State as text ("s0 s1 cached_bits has_cached", decimal) and back; parse returns nullopt for
// anything else.
std::string format_rng_state(const Rng::State& state);
std::optional<Rng::State> parse_rng_state(std::string_view text);

}  // namespace attnlab
