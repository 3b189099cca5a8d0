// Task data files (format in data/README.md): one example per line,
//
//   <position> <position> ... | <target> <target> ...
//
// where a position is its field ids joined by ':' ("3:17"), '_' marks an absent field or an
// unlabelled target, and lines starting with '#' (and blank lines) are ignored. Every example in a
// file has the same number of positions and fields. Windows line endings are accepted.
#pragma once

#include <stdexcept>
#include <string>

#include "attnlab/app/tasks.hpp"

namespace attnlab::app {

// Every problem with a data file: the message is "FILE:LINE: what was wrong" (or "FILE: what").
class DataFileError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

inline constexpr std::size_t kMaxDataLineBytes = 1 << 20;

// Parses a data file. With `expect`, also checks the number of fields and positions and that
// every id is inside its vocabulary. Throws DataFileError.
Batch read_data_file(const std::string& path, const TaskShape* expect = nullptr);

// Writes a batch in the line format, with a header comment naming the task. Written to a temp
// file in the same directory, then renamed. Throws DataFileError if the file cannot be written.
void write_data_file(const std::string& path, const Batch& batch, std::string_view task);

// One example as a line of the format (no newline).
std::string format_example(const Batch& batch, std::size_t row);

}  // namespace attnlab::app
