#include "attnlab/app/run_checkpoint.hpp"

#include <charconv>

#include "attnlab/io/checkpoint.hpp"

namespace attnlab::app {

namespace {

constexpr const char* kRunKind = "attnlab-train-run";

std::string strip_prefix(const std::string& name) {
  const std::string prefix(kOptimizerTensorPrefix);
  return name.starts_with(prefix) ? name.substr(prefix.size()) : name;
}

RunMeta to_run_meta(const std::string& path, const CheckpointMeta& m) {
  RunMeta r;
  r.config_json = m.model_config;
  r.step = m.step;
  if (!m.rng) throw CheckpointError(path, "no rng_state in the metadata: not a training run");
  r.data_rng = *m.rng;
  const auto kind = m.extra.find("kind");
  if (kind == m.extra.end() || kind->second != kRunKind)
    throw CheckpointError(path, "metadata 'kind' is not '" + std::string(kRunKind) +
                                    "': not a checkpoint written by attnlab train");
  const auto it = m.extra.find("optimizer_steps");
  if (it == m.extra.end()) throw CheckpointError(path, "metadata lacks 'optimizer_steps'");
  const char* end = it->second.data() + it->second.size();
  const auto [ptr, ec] = std::from_chars(it->second.data(), end, r.optimizer_steps);
  if (ec != std::errc() || ptr != end)
    throw CheckpointError(path, "metadata 'optimizer_steps' is not a number: '" + it->second + "'");
  const auto contents = m.extra.find("contents");  // absent before --weights-only existed
  r.weights_only = contents != m.extra.end() && contents->second == "weights";
  const auto outliers = m.extra.find("outliers");  // only in runs with --skip-outliers
  if (outliers != m.extra.end()) r.outliers = outliers->second;
  const auto run_context = m.extra.find("run_context");  // absent before it was kept
  if (run_context != m.extra.end()) r.run_context = run_context->second;
  return r;
}

CheckpointMeta parse_meta(const std::string& path, const SafetensorsFile& file) {
  const auto get = [&](const char* key) -> const std::string& {
    const auto it = file.metadata.find(key);
    if (it == file.metadata.end())
      throw CheckpointError(path, std::string("metadata lacks '") + key + "'");
    return it->second;
  };
  if (get("format_version") != kCheckpointFormatVersion)
    throw CheckpointError(path, "unknown format_version '" + get("format_version") + "'");
  CheckpointMeta m;
  m.model_config = get("model_config");
  const std::string& step = get("step");
  const auto [ptr, ec] = std::from_chars(step.data(), step.data() + step.size(), m.step);
  if (ec != std::errc() || ptr != step.data() + step.size())
    throw CheckpointError(path, "metadata 'step' is not a number: '" + step + "'");
  m.rng = parse_rng_state(get("rng_state"));
  for (const auto& [k, v] : file.metadata)
    if (k == "kind" || k == "optimizer_steps" || k == "contents" || k == "outliers" ||
        k == "run_context")
      m.extra[k] = v;
  return m;
}

}  // namespace

void save_run_checkpoint(const std::string& path, const ParameterList<float>& params,
                         const StateTensors& optimizer_state, const RunMeta& meta) {
  TensorList<float> state;
  for (const auto& [name, values] : optimizer_state) state.emplace_back(strip_prefix(name), values);
  CheckpointMeta m;
  m.model_config = meta.config_json;
  m.step = meta.step;
  m.rng = meta.data_rng;
  m.extra["kind"] = kRunKind;
  m.extra["optimizer_steps"] = std::to_string(meta.optimizer_steps);
  m.extra["contents"] = meta.weights_only ? "weights" : "training state";
  if (!meta.outliers.empty()) m.extra["outliers"] = meta.outliers;
  if (!meta.run_context.empty()) m.extra["run_context"] = meta.run_context;
  if (meta.weights_only) state.clear();
  save_checkpoint<float>(path, params, state, m);
}

RunMeta read_run_meta(const std::string& path) {
  const SafetensorsFile file = load_safetensors(path);
  RunMeta meta = to_run_meta(path, parse_meta(path, file));
  for (const StoredTensor& t : file.tensors)
    if (!t.name.starts_with(kOptimizerTensorPrefix))
      meta.model_tensors.emplace_back(t.name, t.shape);
  return meta;
}

RunMeta load_run_checkpoint(const std::string& path, ParameterList<float>& params,
                            StateTensors* optimizer_state) {
  if (optimizer_state && read_run_meta(path).weights_only) {
    throw CheckpointError(path,
                          "holds the weights only (written by train --weights-only): there is no "
                          "optimizer state to resume from; evaluate it instead");
  }
  TensorList<float> state;
  if (optimizer_state)
    for (const auto& [name, values] : *optimizer_state)
      state.emplace_back(strip_prefix(name), values);
  // Without optimizer_state the file's optimizer tensors are skipped (eval needs only the model).
  const LoadedCheckpoint loaded =
      load_checkpoint<float>(path, params, optimizer_state ? &state : nullptr);
  const RunMeta meta = to_run_meta(path, loaded.meta);
  if (optimizer_state) {
    optimizer_state->clear();
    for (auto& [name, values] : state)
      optimizer_state->emplace_back(std::string(kOptimizerTensorPrefix) + name, std::move(values));
  }
  return meta;
}

}  // namespace attnlab::app
