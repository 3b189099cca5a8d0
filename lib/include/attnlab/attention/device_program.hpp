// Attention programs on the CUDA paths: the host-side declarations. A score or mask program runs
// inside the GPU kernels only as a functor compiled into them, so the kernels for a user's program
// are instantiated in the user's own translation unit: include
// attnlab/cuda_kernels/attention_program_kernels.cuh (installed; lib/backends/cuda in the source
// tree) in a .cu compiled by nvcc (or in a .cpp compiled against the CPU emulator) and call
// attnlab::cuda::device_program(score, mask). Its result, a DevicePrograms, holds launchers for
// float and double; give it in SdpaOptions::device_program next to the host programs
// (score_program, mask_program), which the CPU paths and the checks read.
//
// The functors are the CPU path's (attnlab/attention/program.hpp), marked ATTNLAB_HOST_DEVICE:
//   score  template <class S, class P> S operator()(S u, b, h, i, j, const P& params) const
//          (or without params), S being T or Dual<T>, P the device view of the captured
//          parameters (params(k, index), params.size(k), params.count());
//   mask   bool operator()(b, h, i, j) const.
// They are copied to the device by value: what they capture must be plain values or device
// pointers (a std::shared_ptr of the CPU masks is not).
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>

#include "attnlab/attention/params.hpp"

namespace attnlab::cuda {

// The first error a program raised in a kernel, in device memory; the host op throws it as the CPU
// path's std::invalid_argument. code: 0 none, 1 a non-finite score at `where` = ((b·H + h)·Tq +
// i)·Tk + j with `value`, 2 params(k, index) out of range with `where` = param_id(k, index), 3 one
// score depending on more captured elements than a Dual carries. When several positions fail at
// once, the record names one of them.
struct DeviceProgramError {
  int code = 0;
  int unused = 0;
  unsigned long long where = 0;
  double value = 0;
};

// One call's program data in device memory.
template <class T>
struct DeviceProgramArgs {
  // Captured parameters: parameter k is values[offsets[k], offsets[k + 1]), k < count.
  const T* values = nullptr;
  const std::size_t* offsets = nullptr;
  std::size_t count = 0;
  // The block mask at the kernels' tile sizes, expanded over every (b, h): for row block rb of
  // slice bh = b·H + h, entry bh·row_blocks + rb: keys [lo, hi) and the index of its first key
  // tile's state (attention::BlockState) in states. states == nullptr: no mask program.
  const std::size_t* block_lo = nullptr;
  const std::size_t* block_hi = nullptr;
  const std::size_t* block_first = nullptr;
  const unsigned char* block_states = nullptr;
  std::size_t row_blocks = 0;
  // Backward: one row of `width` parameter gradients per dK/dV block (fused path: B·Hkv·key tiles
  // rows) or per query row (reference path: B·H·Tq rows), each summed by one thread in a fixed
  // order; the rows are then summed in row order on the device (one thread per element). Null: no
  // gradients.
  T* grad_rows = nullptr;
  std::size_t width = 0;
  DeviceProgramError* error = nullptr;
};

// The launchers of one program's kernels for T (the fused path's, and the reference path's rows),
// made in the user's translation unit.
template <class T>
struct DeviceProgram {
  bool has_score = false, has_mask = false;
  // The fused kernels' tile (query rows = keys per tile) for head dims D, Dv: the block mask must
  // be built with it. Throws std::invalid_argument when no tile fits in shared memory.
  int (*fused_tile)(std::size_t D, std::size_t Dv) = nullptr;
  // The program's functors (host memory, copied into each launch's arguments), read by the
  // launchers below as their first argument.
  std::shared_ptr<const void> program;
  // out (B,H,Tq,Dv), lse (B,H,Tq); then dq, dk, dv and row_dot (B,H,Tq) scratch; device pointers.
  void (*fused_forward)(const void* program, T* out, T* lse, const AttentionParams<T>& a,
                        const DeviceProgramArgs<T>& args) = nullptr;
  void (*fused_backward)(const void* program, T* dq, T* dk, T* dv, T* row_dot, const T* dout,
                         const T* out, const T* lse, const AttentionParams<T>& a,
                         const DeviceProgramArgs<T>& args) = nullptr;
  // The reference path's row kernels (attnlab/device_ops.hpp, ReferenceRows: the same contract
  // with the program data), one thread block per row of (B,H,Tq,Tk) device arrays.
  void (*reference_softmax)(const void* program, T* scores, const AttentionParams<T>& a,
                            const DeviceProgramArgs<T>& args) = nullptr;
  void (*reference_backward)(const void* program, T* dp, const T* p, const T* dots,
                             const AttentionParams<T>& a,
                             const DeviceProgramArgs<T>& args) = nullptr;
  explicit operator bool() const { return fused_forward != nullptr; }
};

// What attnlab::cuda::device_program returns: the launchers for both element types.
struct DevicePrograms {
  DeviceProgram<float> f32;
  DeviceProgram<double> f64;
  template <class T>
  const DeviceProgram<T>& get() const {
    if constexpr (sizeof(T) == sizeof(float)) {
      return f32;
    } else {
      return f64;
    }
  }
};

}  // namespace attnlab::cuda
