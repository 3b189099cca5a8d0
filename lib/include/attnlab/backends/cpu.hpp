// The CPU backend: DeviceOps (attnlab/device_ops.hpp) whose "device" is the host. Memory is aligned
// host memory, copies are memcpy, and every kernel is one of attnlab's CPU ops on raw pointers (the
// row kernels of the norms, softmax and cross-entropy, the vectorised GELU, blas::gemm for the
// linear layers and attention, the CPU attention paths over AttentionParams), with the optimizer
// updates the CUDA kernels run too (kernel_math::adamw_element, ...), so the arithmetic is that of
// the CPU Modules and optimizers.
// Work is cut over rows / (b, h) slices for the calling thread's num_threads()
// (attnlab/threads.hpp) as the ops do: results are deterministic for a fixed thread count. Calls
// are synchronous.
//
// Every Module starts on cpu_ops<T>() (attnlab/nn/module.hpp).
#pragma once

#include <memory>

#include "attnlab/device_ops.hpp"

namespace attnlab {

// A new CPU backend; T is float or double. One instance serves one calling thread at a time (it
// keeps small scratch buffers between calls).
template <class T>
std::unique_ptr<DeviceOps<T>> make_cpu_device_ops();

// The CPU backend every Module starts on: one immortal instance per element type, safe to call
// from any number of threads at once (its scratch is per thread).
template <class T>
DeviceOps<T>& cpu_ops();

}  // namespace attnlab
