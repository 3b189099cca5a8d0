#include "train_saver.hpp"

#include <nlohmann/json.hpp>

#include "attnlab/app/run_checkpoint.hpp"
#include "attnlab/io/safetensors.hpp"

namespace attnlab::app {

namespace {

nlohmann::json detector_json(const OutlierDetector& d) {
  const OutlierDetector::State state = d.state();
  return {{"values", state.values}, {"position", state.position}};
}

OutlierDetector::State detector_state(const nlohmann::json& j) {
  OutlierDetector::State state;
  j.at("values").get_to(state.values);
  j.at("position").get_to(state.position);
  return state;
}

}  // namespace

std::string outlier_skip_json(const OutlierSkip& skip) {
  // nlohmann writes a double in the shortest form that reads back to the same double.
  const nlohmann::json j = {{"window", skip.loss.window()},
                            {"skipped_steps", skip.skipped},
                            {"loss", detector_json(skip.loss)},
                            {"grad_norm", detector_json(skip.grad_norm)}};
  return j.dump();
}

void read_outlier_skip(const std::string& text, const std::string& path, OutlierSkip& skip) {
  OutlierSkip read = skip;
  try {
    const nlohmann::json j = nlohmann::json::parse(text);
    const auto window = j.at("window").get<std::size_t>();
    if (window != skip.loss.window())
      throw std::invalid_argument("window " + std::to_string(window) + ", expected " +
                                  std::to_string(skip.loss.window()));
    read.skipped = j.at("skipped_steps").get<int>();
    if (read.skipped < 0) throw std::invalid_argument("skipped_steps below 0");
    read.loss.set_state(detector_state(j.at("loss")));
    read.grad_norm.set_state(detector_state(j.at("grad_norm")));
  } catch (const std::exception& e) {  // nlohmann's parse and type errors, set_state's
    throw CheckpointError(
        path, std::string("metadata 'outliers' is not a --skip-outliers state: ") + e.what());
  }
  skip = std::move(read);
}

RunSaver::RunSaver(std::string path, std::string config_json, bool enabled, bool weights_only,
                   std::string run_context)
    : path_(std::move(path)),
      config_json_(std::move(config_json)),
      enabled_(enabled),
      weights_only_(weights_only),
      run_context_(std::move(run_context)) {}

void RunSaver::save(std::size_t step, TrainBackend& backend, OptimizerGroups<float>& optimizer,
                    const ParameterList<float>& params, const Rng& data_rng,
                    const OutlierSkip* outliers) const {
  if (!enabled_) return;
  backend.sync_host();
  RunMeta meta;
  meta.config_json = config_json_;
  meta.step = step;
  meta.optimizer_steps = optimizer.step_count();
  meta.data_rng = data_rng.state();
  meta.weights_only = weights_only_;
  if (outliers) meta.outliers = outlier_skip_json(*outliers);
  meta.run_context = run_context_;
  StateTensors state;
  if (!weights_only_) {
    for (auto& t : optimizer.state_tensors()) state.emplace_back(t.first, std::move(t.second));
  }
  save_run_checkpoint(path_, params, state, meta);
}

}  // namespace attnlab::app
