#include "train_saver.hpp"

#include "attnlab/app/run_checkpoint.hpp"

namespace attnlab::app {

RunSaver::RunSaver(std::string path, std::string config_json, bool enabled, bool weights_only)
    : path_(std::move(path)),
      config_json_(std::move(config_json)),
      enabled_(enabled),
      weights_only_(weights_only) {}

void RunSaver::save(std::size_t step, TrainBackend& backend, OptimizerGroups<float>& optimizer,
                    const ParameterList<float>& params, const Rng& data_rng) const {
  if (!enabled_) return;
  backend.sync_host();
  RunMeta meta;
  meta.config_json = config_json_;
  meta.step = step;
  meta.optimizer_steps = optimizer.step_count();
  meta.data_rng = data_rng.state();
  meta.weights_only = weights_only_;
  StateTensors state;
  if (!weights_only_) {
    for (auto& t : optimizer.state_tensors()) state.emplace_back(t.first, std::move(t.second));
  }
  save_run_checkpoint(path_, params, state, meta);
}

}  // namespace attnlab::app
