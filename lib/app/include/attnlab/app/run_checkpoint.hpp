// A training run's checkpoint, DIR/model.safetensors, on top of the checkpoint I/O of
// attnlab/io/checkpoint.hpp (atomic write, validated load): the model's parameters by name, the
// optimizer state under "optim.<param>.<slot>", and in the metadata the run's config (JSON), the
// step, the data Rng state, the format version and, with --skip-outliers, the outlier detectors'
// state.
//
// Optimizer state travels here as plain (name, tensor) pairs: the same type as
// optim/optimizer.hpp's NamedTensor<float> (what Optimizer::state_tensors() returns), spelt out so
// that this header includes neither the optimizer's headers nor the I/O ones.
#pragma once

#include <string>
#include <utility>
#include <vector>

#include <xtensor/xarray.hpp>

#include "attnlab/nn/parameter.hpp"
#include "attnlab/random.hpp"

namespace attnlab::app {

using StateTensors = std::vector<std::pair<std::string, xt::xarray<float>>>;

struct RunMeta {
  std::string config_json;  // the TrainConfig that made the run
  std::size_t step = 0;     // training steps completed
  std::size_t optimizer_steps = 0;
  Rng::State data_rng{};
  // The file holds the weights only (train --weights-only): metadata "contents" is "weights", else
  // "training state". A weights-only file is evaluated, never resumed.
  bool weights_only = false;
  // The --skip-outliers state (metadata "outliers": the detectors' windows and the skipped count,
  // as JSON text; train_saver.hpp's outlier_skip_json), "" when the run does not skip outliers.
  std::string outliers;
  // How the run was run where that changes its results (metadata "run_context", JSON text; ""
  // in checkpoints written before it was kept): RunContextRecord (attnlab/app/run_config.hpp).
  std::string run_context;
  // read_run_meta only: the names and shapes of the model's tensors (not the optimizer's), for a
  // check against the config before a model is built.
  std::vector<std::pair<std::string, std::vector<std::size_t>>> model_tensors;
};

// optimizer_state: names as Optimizer::state_tensors() gives them ("optim.<param>.<slot>"); empty
// with meta.weights_only.
void save_run_checkpoint(const std::string& path, const ParameterList<float>& params,
                         const StateTensors& optimizer_state, const RunMeta& meta);

// The metadata only (the file is still fully validated). Throws CheckpointError.
RunMeta read_run_meta(const std::string& path);

// Loads parameters (and, when optimizer_state is not null, the optimizer state: on input the
// expected names and shapes as state_tensors() gives them; on output the values). Throws
// CheckpointError naming the file and the problem; nothing is changed then. Asking a weights-only
// file for an optimizer state (a resume) says so.
RunMeta load_run_checkpoint(const std::string& path, ParameterList<float>& params,
                            StateTensors* optimizer_state);

}  // namespace attnlab::app
