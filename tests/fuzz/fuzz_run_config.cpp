// libFuzzer target: a run config's JSON (what train --config reads, and what a checkpoint's
// model_config holds) through the whole reader: the strict parse, the checked conversions, the
// bounds table, validate() and the memory estimate. Each input is accepted or refused with
// std::invalid_argument (ConfigError is one); any other exception escapes and counts as a crash, as
// does an allocation over -malloc_limit_mb. An accepted config reads back from its own JSON to the
// same config, and its memory estimate is a finite number of bytes.
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <stdexcept>
#include <string>

#include "attnlab/app/run_config.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  using namespace attnlab::app;
  const std::string text(reinterpret_cast<const char*>(data), size);
  TrainConfig c;
  try {
    read_json_text(text, c);
  } catch (const std::invalid_argument&) {
    return 0;
  }
  const std::string written = to_json_text(c);
  TrainConfig back;
  read_json_text(written, back);  // must not throw: what we write, we read
  if (to_json_text(back) != written) __builtin_trap();
  try {
    validate(c);
    const MemoryEstimate e = estimate_memory(c);
    if (!std::isfinite(e.total()) || e.parameters <= 0 || e.activations <= 0) __builtin_trap();
  } catch (const std::invalid_argument&) {
  }
  return 0;
}
