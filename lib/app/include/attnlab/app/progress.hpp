// Progress of a long job, reported through one callback type: the trainer reports steps, the study
// reports finished runs, and the CLI's terminal reporter prints both the same way.
#pragma once

#include <cstddef>
#include <functional>
#include <string>

namespace attnlab::app {

struct ProgressUpdate {
  const char* unit = "step";  // what is counted: "step", "run"
  std::size_t start = 0;      // done when this job began (a resumed run starts at its saved step)
  std::size_t done = 0;
  std::size_t total = 0;
  double seconds = 0;      // elapsed since the job began
  std::string detail;      // e.g. "loss 0.4210 acc 0.950"
  bool milestone = false;  // a logged step or a finished run: worth a line of its own
};

using ProgressFn = std::function<void(const ProgressUpdate&)>;

// A live bar on a TTY (every update, redrawn in place), one line per milestone otherwise.
// Not thread-safe: a caller reporting from several threads serialises the calls.
ProgressFn terminal_progress();

// "42s", "3m07s", "1h05m"; "?" for a negative or non-finite time.
std::string format_duration(double seconds);

}  // namespace attnlab::app
