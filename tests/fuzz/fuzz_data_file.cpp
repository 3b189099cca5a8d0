// libFuzzer target: read_data_file of arbitrary bytes, without and with a task shape (two fields
// of vocabulary 10, output vocabulary 10, 4 positions). It must either return a consistent batch
// or throw DataFileError naming the file; an accepted batch must survive format_example and a
// second read unchanged. Anything else is a bug.
#include <sys/mman.h>
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <string>

#include "attnlab/app/data_file.hpp"

namespace {

// A memory-backed file holding `bytes`; returns its path.
std::string as_file(int fd, const void* bytes, std::size_t size) {
  if (::ftruncate(fd, 0) != 0) __builtin_trap();
  if (size && ::pwrite(fd, bytes, size, 0) != static_cast<ssize_t>(size)) __builtin_trap();
  return "/proc/self/fd/" + std::to_string(fd);
}

void check_consistent(const attnlab::app::Batch& batch, const attnlab::app::TaskShape* expect) {
  if (batch.size() == 0 || batch.length() == 0 || batch.fields.empty()) __builtin_trap();
  for (const auto& f : batch.fields) {
    if (f.shape() != batch.targets.shape()) __builtin_trap();
  }
  if (!expect) return;
  if (batch.fields.size() != expect->field_vocab.size()) __builtin_trap();
  if (batch.length() != static_cast<std::size_t>(expect->seq_len)) __builtin_trap();
  for (std::size_t f = 0; f < batch.fields.size(); ++f) {
    for (const int id : batch.fields[f]) {
      if (id >= expect->field_vocab[f] || id < attnlab::app::kAbsent) __builtin_trap();
    }
  }
  for (const int id : batch.targets) {
    if (id >= expect->output_vocab) __builtin_trap();
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  using namespace attnlab::app;
  static const int input_fd = ::memfd_create("fuzz-data", 0);
  static const int again_fd = ::memfd_create("fuzz-data-again", 0);
  if (input_fd < 0 || again_fd < 0) __builtin_trap();
  const std::string path = as_file(input_fd, data, size);

  const TaskShape shape{{10, 10}, 10, 4};
  for (const TaskShape* expect : {static_cast<const TaskShape*>(nullptr), &shape}) {
    Batch batch;
    try {
      batch = read_data_file(path, expect);
    } catch (const DataFileError& e) {
      if (std::string(e.what()).rfind(path, 0) != 0) __builtin_trap();  // must name the file
      continue;
    }
    check_consistent(batch, expect);
    std::string text;
    for (std::size_t row = 0; row < batch.size(); ++row) text += format_example(batch, row) + "\n";
    const Batch again = read_data_file(as_file(again_fd, text.data(), text.size()), expect);
    if (again.targets != batch.targets || again.fields.size() != batch.fields.size()) {
      __builtin_trap();
    }
    for (std::size_t f = 0; f < batch.fields.size(); ++f) {
      if (again.fields[f] != batch.fields[f]) __builtin_trap();
    }
  }
  return 0;
}
