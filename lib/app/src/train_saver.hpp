// The trainer's checkpointing: OUT/model.safetensors with the host model's parameters, the
// optimizer state, the effective config, the step and the data stream's state. Internal to the
// app (lib/app/src).
#pragma once

#include <string>

#include "attnlab/optim/outlier.hpp"
#include "attnlab/optim/param_groups.hpp"
#include "attnlab/random.hpp"
#include "train_backend.hpp"

namespace attnlab::app {

// --skip-outliers (TrainConfig::skip_outliers): the z-score detectors of the steps' losses and of
// their global gradient norms, and how many steps' updates were skipped so far (a resumed run's
// earlier ones included). The checkpoint keeps all of it, so a resumed run decides as an unbroken
// one would.
struct OutlierSkip {
  OutlierDetector loss, grad_norm;
  int skipped = 0;
};

// The checkpoint metadata's "outliers" entry: {"window": N, "skipped_steps": k, "loss": {"values":
// [...], "position": p}, "grad_norm": {...}}, the doubles written so that they read back exactly.
std::string outlier_skip_json(const OutlierSkip& skip);
// Restores what outlier_skip_json wrote into `skip` (detectors of the same window). Throws
// CheckpointError naming `path` and the problem (not JSON, a missing or mistyped key, another
// window, a state the detectors refuse); `skip` is unchanged then.
void read_outlier_skip(const std::string& text, const std::string& path, OutlierSkip& skip);

class RunSaver {
 public:
  // config_json: the effective config (to_json_text). Disabled: save() does nothing. weights_only:
  // no optimizer state in the file (train --weights-only).
  // run_context: run_context_json of the run (kept for a resume).
  RunSaver(std::string path, std::string config_json, bool enabled, bool weights_only = false,
           std::string run_context = "");

  // Brings the host mirror up to date from the backend, then writes atomically. `outliers`: the
  // run's --skip-outliers state (null when off).
  void save(std::size_t step, TrainBackend& backend, OptimizerGroups<float>& optimizer,
            const ParameterList<float>& params, const Rng& data_rng,
            const OutlierSkip* outliers = nullptr) const;

 private:
  std::string path_, config_json_;
  bool enabled_, weights_only_;
  std::string run_context_;
};

}  // namespace attnlab::app
