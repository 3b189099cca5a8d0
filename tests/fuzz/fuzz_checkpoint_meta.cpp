// libFuzzer target: a checkpoint's model_config metadata against the tensors the file holds (those
// of a tiny sort model, fixed here), through read_saved_config: the config reader, then the check
// that the config describes those tensors, before any model is built. Accepted or refused with
// std::invalid_argument, never another exception or an allocation over -malloc_limit_mb; an
// accepted config describes exactly the file's tensors, and its memory estimate is finite.
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <stdexcept>
#include <string>

#include "attnlab/app/run_config.hpp"

namespace {

using namespace attnlab;
using namespace attnlab::app;

// The seed run's model: task sort, 6 symbols, length 5, d_model 8, 2 heads (tests/fuzz/corpus).
RunMeta tiny_meta() {
  TrainConfig c;
  c.task.kind = TaskKind::sort;
  c.task.symbols = 6;
  c.task.length = 5;
  c.model.block.attention.d_model = 8;
  c.model.block.attention.heads = 2;
  RunMeta meta;
  for (const ParameterShape& p :
       transformer_parameter_shapes(resolve_model(c.model, task_shape(c.task))))
    meta.model_tensors.emplace_back(p.name, p.shape);
  return meta;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  static const RunMeta tensors = tiny_meta();
  RunMeta meta = tensors;
  meta.config_json.assign(reinterpret_cast<const char*>(data), size);
  TrainConfig c;
  try {
    read_saved_config(meta, "fuzz.safetensors", c);
  } catch (const std::invalid_argument&) {
    return 0;
  }
  const auto want = transformer_parameter_shapes(resolve_model(c.model, task_shape(c.task)));
  if (want.size() != meta.model_tensors.size()) __builtin_trap();
  try {
    if (!std::isfinite(estimate_memory(c).total())) __builtin_trap();
  } catch (const std::invalid_argument&) {
  }
  return 0;
}
