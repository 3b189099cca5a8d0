// The emulated device backend: DeviceOps (attnlab/device_ops.hpp) whose kernels are the CUDA kernel
// sources of lib/backends/cuda, run on the CPU by an emulator of the CUDA thread model
// (attnlab/backends/cuda_emulator.hpp), with attnlab's CPU BLAS for the GEMMs. It lets every build
// check the device code paths (any Module moved to it, `train --device cuda`) against the CPU on a
// machine without a GPU: the kernels' indexing, masking and arithmetic, not their speed. "Device"
// memory is host memory, filled with 0xFF bytes (NaN) when allocated. As on a GPU, the pointers
// given to kernels, GEMMs and copies must lie in that memory: a host address throws
// std::logic_error (on a GPU it faults), unless the device was made with Pointers::host_allowed.
//
// Target attnlab_emulated (built with the tests; not installed). The kernels compile once, in
// lib/backends/emulated/src/emulated.cpp, for float and double.
#pragma once

#include <cstddef>
#include <memory>

#include "attnlab/device_ops.hpp"

namespace attnlab::emulated {

// Which pointers the device's operations accept: device_only (the default) those inside its live
// allocations, or null; host_allowed any, for tests that run the kernels on host tensors directly.
enum class Pointers { device_only, host_allowed };

// A new emulated device; T is float or double.
template <class T>
std::unique_ptr<DeviceOps<T>> make_device_ops(Pointers pointers = Pointers::device_only);

// The allocations of `ops` not yet released (for leak tests). Throws std::invalid_argument unless
// `ops` came from make_device_ops.
template <class T>
std::size_t live_allocations(const DeviceOps<T>& ops);

// The bytes `ops` copied from the host (upload) and to the host (download) since it was made, for
// tests that a device path keeps its data on the device. Throws as live_allocations.
struct Transfers {
  std::size_t uploaded = 0, downloaded = 0;
};
template <class T>
Transfers transfers(const DeviceOps<T>& ops);

}  // namespace attnlab::emulated
