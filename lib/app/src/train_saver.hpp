// The trainer's checkpointing: OUT/model.safetensors with the host model's parameters, the
// optimizer state, the effective config, the step and the data stream's state. Internal to the
// app (lib/app/src).
#pragma once

#include <string>

#include "attnlab/optim/param_groups.hpp"
#include "attnlab/random.hpp"
#include "train_backend.hpp"

namespace attnlab::app {

class RunSaver {
 public:
  // config_json: the effective config (to_json_text). Disabled: save() does nothing. weights_only:
  // no optimizer state in the file (train --weights-only).
  RunSaver(std::string path, std::string config_json, bool enabled, bool weights_only = false);

  // Brings the host mirror up to date from the backend, then writes atomically.
  void save(std::size_t step, TrainBackend& backend, OptimizerGroups<float>& optimizer,
            const ParameterList<float>& params, const Rng& data_rng) const;

 private:
  std::string path_, config_json_;
  bool enabled_, weights_only_;
};

}  // namespace attnlab::app
