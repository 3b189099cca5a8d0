// libFuzzer target: parse_safetensors on arbitrary bytes. It must either return a consistent file
// or throw CheckpointError; a consistent file must survive a write/read round trip unchanged.
// Anything else (a crash, a sanitizer report, another exception) is a bug.
#include <cstddef>
#include <cstdint>
#include <span>

#include "attnlab/io/safetensors.hpp"

namespace {

bool same(const attnlab::SafetensorsFile& a, const attnlab::SafetensorsFile& b) {
  if (a.metadata != b.metadata || a.tensors.size() != b.tensors.size()) return false;
  for (std::size_t i = 0; i < a.tensors.size(); ++i) {
    const auto &x = a.tensors[i], &y = b.tensors[i];
    if (x.name != y.name || x.dtype != y.dtype || x.shape != y.shape || x.data != y.data) {
      return false;
    }
  }
  return true;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  attnlab::SafetensorsFile file;
  try {
    file = attnlab::parse_safetensors(
        std::span<const std::byte>(reinterpret_cast<const std::byte*>(data), size), "fuzz-input");
  } catch (const attnlab::CheckpointError&) {
    return 0;  // a clean refusal
  }
  // Accepted: writing it back and reading that must give the same tensors and metadata.
  const auto bytes = attnlab::serialize_safetensors(file.tensors, file.metadata);
  const auto again = attnlab::parse_safetensors(bytes, "round-trip");
  if (!same(file, again)) __builtin_trap();
  return 0;
}
