// The explicit run context of the training application: what a run takes from its surroundings,
// passed in instead of read from globals. attnlab keeps no mutable state shared between threads;
// each run (a training run, a study job) gets its own Context. The library itself takes none of
// it: its ops read the calling thread's count (attnlab/threads.hpp) and a Model is moved to its
// backend by the app.
//   threads  the worker-thread count of the parallel loops. The ops read the CALLING thread's count
//            (threads.hpp); a run installs its context's count on its own thread with a
//            ThreadScope, so two runs on two std::threads never share a variable.
//   stop     a stop flag the application owns, e.g. set by its SIGINT handler (a lock-free
//            std::atomic<bool> store is async-signal-safe; std::stop_source::request_stop is not
//            promised to be). The trainer only reads it, between steps. Null: never stops.
//   backend  where a run's training step runs. The CUDA backend object is made by
//            make_cuda_device_ops (device_ops.hpp) and owned by the run that made it, unless
//   device   (with backend cuda) names one the caller owns: the tests pass the emulated device.
//   comm     the processes a run is split across (distributed.hpp; made once per process by
//            init_distributed and owned by main). Null: this process trains alone.
#pragma once

#include <atomic>
#include <string>

#include "attnlab/enum_table.hpp"
#include "attnlab/threads.hpp"

namespace attnlab {
class Communicator;
template <class T>
class DeviceOps;
}  // namespace attnlab

namespace attnlab::app {
enum class Backend { cpu, cuda };
}  // namespace attnlab::app

template <>
struct attnlab::EnumTable<attnlab::app::Backend> {
  static constexpr EnumEntry<app::Backend> entries[] = {
      {app::Backend::cpu, "cpu", ""},
      {app::Backend::cuda, "cuda", "on the GPU (needs a build with the CUDA backend and a device)"},
  };
  static constexpr EnumParseText parse = {"parse_backend", "backend", NameList::quoted_or, true};
};

namespace attnlab::app {

// The names of EnumTable<Backend>; parse throws std::invalid_argument naming `op` and `arg` for
// another name.
inline std::string backend_name(Backend backend) {
  return std::string(enum_name(backend));
}
inline Backend parse_backend(const std::string& name, const char* op = "parse_backend",
                             const char* arg = "backend") {
  return parse_enum<Backend>(name, op, arg);
}

struct Context {
  int threads = default_num_threads();
  const std::atomic<bool>* stop = nullptr;
  Backend backend = Backend::cpu;
  DeviceOps<float>* device = nullptr;
  Communicator* comm = nullptr;

  // True once the application has set its stop flag.
  bool stop_requested() const noexcept {
    return stop != nullptr && stop->load(std::memory_order_relaxed);
  }
};

// Throws std::invalid_argument naming `op` when threads < 1.
void validate(const Context& context, const char* op = "Context");

}  // namespace attnlab::app
