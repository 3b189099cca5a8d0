// Model checkpoints over safetensors; see the header for the layout.
#include "attnlab/io/checkpoint.hpp"

#include <charconv>
#include <cmath>
#include <cstdint>
#include <set>
#include <stdexcept>

#include "attnlab/tensor.hpp"

namespace attnlab {

namespace {

constexpr std::string_view kKeyFormat = "format_version";
constexpr std::string_view kKeyDtype = "dtype";
constexpr std::string_view kKeyConfig = "model_config";
constexpr std::string_view kKeyStep = "step";
constexpr std::string_view kKeyRng = "rng_state";

bool is_reserved_key(std::string_view key) {
  return key == kKeyFormat || key == kKeyDtype || key == kKeyConfig || key == kKeyStep ||
         key == kKeyRng;
}

std::string in_quotes(std::string_view s) {
  return "'" + std::string(s) + "'";
}

// Strict decimal u64: digits only, no sign, no spaces, no overflow.
std::optional<std::uint64_t> parse_u64(std::string_view text) {
  std::uint64_t v = 0;
  if (text.empty()) return std::nullopt;
  const auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), v);
  if (ec != std::errc{} || end != text.data() + text.size()) return std::nullopt;
  return v;
}

template <class T>
void check_finite(const std::string& file, const std::string& what, const xt::xarray<T>& values,
                  const char* action) {
  for (std::size_t i = 0; i < values.size(); ++i) {
    const T x = values.data()[i];
    if (!std::isfinite(x)) {
      throw CheckpointError(file, std::string(action) + ": " + what + " has the non-finite value " +
                                      std::to_string(x) + " at flat index " + std::to_string(i));
    }
  }
}

std::string joined(const std::vector<std::string>& names, std::size_t limit = 8) {
  std::string out;
  for (std::size_t i = 0; i < names.size() && i < limit; ++i) {
    if (i) out += ", ";
    out += in_quotes(names[i]);
  }
  if (names.size() > limit) out += " and " + std::to_string(names.size() - limit) + " more";
  return out;
}

// Finds `name` in the file and checks dtype, shape and values; returns its values.
template <class T>
xt::xarray<T> checked_tensor(const SafetensorsFile& file, const std::string& path,
                             const std::string& name, const std::vector<std::size_t>* shape,
                             const std::string& what) {
  const StoredTensor* t = file.find(name);
  if (!t) throw CheckpointError(path, "missing tensor " + in_quotes(name) + " (" + what + ")");
  if (!readable_as<T>(t->dtype)) {  // F16 and BF16 load into float and double models
    throw CheckpointError(path, "tensor " + in_quotes(name) + " has dtype " +
                                    std::string(to_string(t->dtype)) + ", but the model is " +
                                    std::string(to_string(dtype_of<T>())));
  }
  if (shape && t->shape != *shape) {
    throw CheckpointError(path, "tensor " + in_quotes(name) + " has shape " +
                                    format_shape(t->shape) + ", but the model's " + what +
                                    " has shape " + format_shape(*shape));
  }
  auto values = tensor_values<T>(*t, path);
  check_finite(path, "tensor " + in_quotes(name), values, "rejected");
  return values;
}

}  // namespace

std::string format_rng_state(const Rng::State& state) {
  return std::to_string(state.s0) + " " + std::to_string(state.s1) + " " +
         std::to_string(state.cached_bits) + " " + (state.has_cached ? "1" : "0");
}

std::optional<Rng::State> parse_rng_state(std::string_view text) {
  std::vector<std::uint64_t> fields;
  std::size_t start = 0;
  while (start <= text.size()) {
    const std::size_t space = std::min(text.find(' ', start), text.size());
    const auto v = parse_u64(text.substr(start, space - start));
    if (!v) return std::nullopt;
    fields.push_back(*v);
    start = space + 1;
  }
  if (fields.size() != 4 || fields[3] > 1) return std::nullopt;
  if (fields[0] == 0 && fields[1] == 0) return std::nullopt;  // xoroshiro's one invalid state
  return Rng::State{fields[0], fields[1], fields[2], fields[3] == 1};
}

template <class T>
void save_checkpoint(const std::string& path, const ParameterList<T>& params,
                     const TensorList<T>& optimizer_state, const CheckpointMeta& meta) {
  std::vector<StoredTensor> tensors;
  tensors.reserve(params.size() + optimizer_state.size());
  for (const auto& p : params) {
    check_arg(p.param != nullptr, "save_checkpoint", "parameter " + in_quotes(p.name),
              "a non-null Parameter pointer", "nullptr");
    if (p.name.starts_with(kOptimizerTensorPrefix)) {
      throw CheckpointError(path, "cannot save parameter " + in_quotes(p.name) + ": the prefix " +
                                      in_quotes(kOptimizerTensorPrefix) +
                                      " is reserved for optimizer state");
    }
    check_finite(path, "parameter " + in_quotes(p.name), p.param->value, "refusing to save");
    tensors.push_back(make_stored_tensor<T>(p.name, p.param->value));
  }
  for (const auto& [name, values] : optimizer_state) {
    const std::string stored = std::string(kOptimizerTensorPrefix) + name;
    check_finite(path, "optimizer state " + in_quotes(stored), values, "refusing to save");
    tensors.push_back(make_stored_tensor<T>(stored, values));
  }
  std::map<std::string, std::string> metadata;
  for (const auto& [key, value] : meta.extra) {
    if (is_reserved_key(key)) {
      throw CheckpointError(path, "metadata key " + in_quotes(key) + " is reserved by attnlab");
    }
    metadata[key] = value;
  }
  metadata[std::string(kKeyFormat)] = kCheckpointFormatVersion;
  metadata[std::string(kKeyDtype)] = to_string(dtype_of<T>());
  metadata[std::string(kKeyConfig)] = meta.model_config;
  metadata[std::string(kKeyStep)] = std::to_string(meta.step);
  if (meta.rng) metadata[std::string(kKeyRng)] = format_rng_state(*meta.rng);
  save_safetensors(path, tensors, metadata);
}

template <class T>
LoadedCheckpoint load_checkpoint(const std::string& path, const ParameterList<T>& params,
                                 TensorList<T>* optimizer_state,
                                 const CheckpointLoadOptions& options) {
  const SafetensorsFile file = load_safetensors(path);
  const auto& md = file.metadata;

  // ---- metadata ----
  const auto format = md.find(std::string(kKeyFormat));
  if (format == md.end()) {
    throw CheckpointError(path, "not an attnlab checkpoint: __metadata__ has no format_version");
  }
  if (format->second != kCheckpointFormatVersion) {
    throw CheckpointError(path, "unknown checkpoint format_version " + in_quotes(format->second) +
                                    " (this attnlab reads " +
                                    std::string(kCheckpointFormatVersion) + ")");
  }
  LoadedCheckpoint out;
  for (const auto& [key, value] : md) {
    if (!is_reserved_key(key)) out.meta.extra.emplace(key, value);
  }
  if (const auto it = md.find(std::string(kKeyConfig)); it != md.end()) {
    out.meta.model_config = it->second;
  }
  if (const auto it = md.find(std::string(kKeyStep)); it != md.end()) {
    const auto step = parse_u64(it->second);
    if (!step)
      throw CheckpointError(path, "metadata step " + in_quotes(it->second) + " is not a count");
    out.meta.step = *step;
  } else {
    throw CheckpointError(path, "__metadata__ has no step");
  }
  if (const auto it = md.find(std::string(kKeyRng)); it != md.end()) {
    out.meta.rng = parse_rng_state(it->second);
    if (!out.meta.rng) {
      throw CheckpointError(path, "metadata rng_state " + in_quotes(it->second) +
                                      " is not 's0 s1 cached_bits has_cached'");
    }
  }

  // ---- tensors: everything is read and checked into `staged` before the model changes ----
  std::set<std::string> used;
  std::vector<xt::xarray<T>> staged;
  staged.reserve(params.size());
  std::vector<std::string> missing;
  for (const auto& p : params) {
    check_arg(p.param != nullptr, "load_checkpoint", "parameter " + in_quotes(p.name),
              "a non-null Parameter pointer", "nullptr");
    if (!file.find(p.name)) {
      missing.push_back(p.name);
      continue;
    }
    const std::vector<std::size_t> shape(p.param->value.shape().begin(),
                                         p.param->value.shape().end());
    staged.push_back(checked_tensor<T>(file, path, p.name, &shape, "parameter"));
    used.insert(p.name);
  }
  if (!missing.empty()) {
    throw CheckpointError(path, "missing " + std::to_string(missing.size()) + " of " +
                                    std::to_string(params.size()) +
                                    " model parameters: " + joined(missing));
  }

  TensorList<T> optim;
  const std::string prefix(kOptimizerTensorPrefix);
  if (optimizer_state && !optimizer_state->empty()) {
    for (const auto& [name, expected] : *optimizer_state) {
      const std::vector<std::size_t> shape(expected.shape().begin(), expected.shape().end());
      optim.emplace_back(name,
                         checked_tensor<T>(file, path, prefix + name, &shape, "optimizer state"));
      used.insert(prefix + name);
    }
  } else if (optimizer_state) {
    for (const auto& t : file.tensors) {
      if (!t.name.starts_with(prefix)) continue;
      optim.emplace_back(t.name.substr(prefix.size()),
                         checked_tensor<T>(file, path, t.name, nullptr, "optimizer state"));
      used.insert(t.name);
    }
  }

  std::vector<std::string> extra;
  for (const auto& t : file.tensors) {
    if (used.count(t.name)) continue;
    // Optimizer state that the caller did not ask for is expected, not extra.
    if (!optimizer_state && t.name.starts_with(prefix)) {
      out.ignored_tensors.push_back(t.name);
    } else {
      extra.push_back(t.name);
    }
  }
  if (!extra.empty() && !options.allow_extra_tensors) {
    throw CheckpointError(path, std::to_string(extra.size()) +
                                    " tensors in the file are not in the model: " + joined(extra));
  }
  out.ignored_tensors.insert(out.ignored_tensors.end(), extra.begin(), extra.end());

  // ---- commit: nothing below can fail ----
  for (std::size_t i = 0; i < params.size(); ++i) params[i].param->value = std::move(staged[i]);
  if (optimizer_state) *optimizer_state = std::move(optim);
  return out;
}

template void save_checkpoint<float>(const std::string&, const ParameterList<float>&,
                                     const TensorList<float>&, const CheckpointMeta&);
template void save_checkpoint<double>(const std::string&, const ParameterList<double>&,
                                      const TensorList<double>&, const CheckpointMeta&);
template LoadedCheckpoint load_checkpoint<float>(const std::string&, const ParameterList<float>&,
                                                 TensorList<float>*, const CheckpointLoadOptions&);
template LoadedCheckpoint load_checkpoint<double>(const std::string&, const ParameterList<double>&,
                                                  TensorList<double>*,
                                                  const CheckpointLoadOptions&);

}  // namespace attnlab
