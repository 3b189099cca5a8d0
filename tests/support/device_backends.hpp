// The DeviceOps backends that run on every machine, as types for TEST_CASE_TEMPLATE: the tests of
// device_ops.hpp and of the one model on a device run one body over each. EmulatedBackend runs the
// CUDA kernel sources on the CPU (attnlab/backends/emulated.hpp) and counts its allocations;
// CpuBackend is the CPU backend (attnlab/backends/cpu.hpp) on attnlab's CPU ops. The CUDA backend
// has its own cases (skipped without a device).
#pragma once

#include <doctest/doctest.h>

#include <memory>
#include <type_traits>

#include "attnlab/backends/cpu.hpp"
#include "attnlab/backends/emulated.hpp"

namespace attnlab::test {

struct EmulatedBackend {
  // The fused path refuses head dims whose tiles exceed an H100's shared memory, as CUDA's does.
  static constexpr bool kFusedLimited = true;
  template <class T>
  static std::unique_ptr<DeviceOps<T>> make() {
    return emulated::make_device_ops<T>();
  }
};

struct CpuBackend {
  static constexpr bool kFusedLimited = false;  // the CPU fused path takes any head dims
  template <class T>
  static std::unique_ptr<DeviceOps<T>> make() {
    return make_cpu_device_ops<T>();
  }
};

// Checks that `ops` released every allocation, where the backend counts them (the emulated one).
template <class Backend, class T>
void check_no_live_allocations(const DeviceOps<T>& ops) {
  if constexpr (std::is_same_v<Backend, EmulatedBackend>)
    CHECK(emulated::live_allocations(ops) == 0);
}

}  // namespace attnlab::test

TYPE_TO_STRING(attnlab::test::EmulatedBackend);
TYPE_TO_STRING(attnlab::test::CpuBackend);
