// Scaled dot-product attention on the GPU, over the CPU op's host tensors, options and cache: each
// call copies its inputs to the device, runs the CUDA kernels (the CUDA backend's DeviceOps,
// attnlab/device_ops.hpp) and copies the results back. For tests, comparisons with the CPU op and
// small-scale use; device-resident code calls DeviceOps directly.
//
// Same contract, options and checks as attnlab/ops/attention.hpp (S = s · Q Kᵀ, P = softmax(S)
// over visible keys, O = P V; scale modes, explicit and per-head scales; causal with a query
// offset; the key mask (B, Tk) with true = may attend; a query row with no visible key gives P = 0,
// O = 0 and zero gradients). SdpaOptions::path picks the GPU path: `reference` (cuBLAS GEMMs
// around softmax kernels, keeps P in cache.p), `fused` (tiled online softmax, keeps O and the row
// log-sum-exp), `automatic` (fused when its tiles fit the device's shared memory for D and Dv,
// reference otherwise). The CPU tile options are ignored. The cache is the CPU op's: a forward on
// one side may be followed by the backward on the other.
//
// Attention programs (SdpaOptions::score_program, mask_program) run on both GPU paths, with the
// launchers of their kernels in SdpaOptions::device_program (attnlab/attention/
// device_program.hpp); a program without launchers is refused.
//
// Without the CUDA backend, or without a device, every function throws CudaError. The overloads
// taking a DeviceOps run the same op on that device: the CUDA backend's, or the emulated device
// (attnlab/backends/emulated.hpp) that runs the same kernels on the CPU.
#pragma once

#include <vector>

#include "attnlab/device_ops.hpp"
#include "attnlab/ops/attention.hpp"
#include "attnlab/tensor.hpp"

namespace attnlab {

// q: (B,H,Tq,D), k: (B,Hkv,Tk,D), v: (B,Hkv,Tk,Dv); key_mask: (B,Tk) or nullptr; bias:
// (1|B, 1|H, Tq, Tk) or nullptr, as sdpa_forward.
// Returns O (B,H,Tq,Dv) and fills `cache`. Throws ShapeError on any shape mismatch and
// std::invalid_argument on a bad option (the CPU op's messages, naming sdpa_forward_cuda),
// CudaError without a device.
template <class T>
Tensor4<T> sdpa_forward_cuda(SdpaCache<T>& cache, const Tensor4<T>& q, const Tensor4<T>& k,
                             const Tensor4<T>& v, const SdpaOptions& options = {},
                             const KeyMask* key_mask = nullptr, const Tensor4<T>* bias = nullptr);

// dout: (B,H,Tq,Dv) = dL/dO; q, k, v: the forward's inputs. Returns fresh gradients (assigns),
// dbias (as sdpa_backward) and dscale included (computed on the host as ⟨dQ, Q⟩ / s per head). Runs
// the path the forward ran. Throws std::logic_error for an empty cache, ShapeError on mismatch.
template <class T>
SdpaGrads<T> sdpa_backward_cuda(const Tensor4<T>& dout, const SdpaCache<T>& cache,
                                const Tensor4<T>& q, const Tensor4<T>& k, const Tensor4<T>& v);

// The same on `device` (device.check_fused decides `automatic`).
template <class T>
Tensor4<T> sdpa_forward_cuda(DeviceOps<T>& device, SdpaCache<T>& cache, const Tensor4<T>& q,
                             const Tensor4<T>& k, const Tensor4<T>& v,
                             const SdpaOptions& options = {}, const KeyMask* key_mask = nullptr,
                             const Tensor4<T>* bias = nullptr);
template <class T>
SdpaGrads<T> sdpa_backward_cuda(DeviceOps<T>& device, const Tensor4<T>& dout,
                                const SdpaCache<T>& cache, const Tensor4<T>& q, const Tensor4<T>& k,
                                const Tensor4<T>& v);

// An attention program's GPU paths on device memory, for device-resident code (a layer on a device
// backend runs them over its own buffers: no host copies). The op above is a copy in, these, and a
// copy out.
//   sdpa_program_cache: the cache of such a call, from the call resolve_sdpa made of `options` (a
//     program with its launchers in options.device_program; std::invalid_argument without them),
//     its path resolved on `device` as the op resolves it. No tensors: the cache keeps none.
//   sdpa_program_forward_device: `a` points into device memory (q, k, v, the head scales, the key
//     mask, ALiBi's slopes; dropout and the variant from the spec). Writes out (B,H,Tq,Dv) and aux:
//     the log-sum-exp (B,H,Tq) on the fused path, P (B,H,Tq,Tk) on the reference path. Keeps in
//     the cache the block mask the fused kernels used.
//   sdpa_program_backward_device: assigns dq, dk, dv from dout and the forward's out and aux (out
//     is read on the fused path only); scratch is (B,H,Tq) on the fused path, (B,H,Tq,Tk) on the
//     reference path. Returns the captured parameters' gradients summed in a fixed order (none
//     unless cache.program_grad).
// A program's error throws the CPU op's std::invalid_argument.
template <class T>
SdpaCache<T> sdpa_program_cache(DeviceOps<T>& device, const SdpaCall& call,
                                const SdpaOptions& options);
template <class T>
void sdpa_program_forward_device(DeviceOps<T>& device, SdpaCache<T>& cache,
                                 const AttentionParams<T>& a, T* out, T* aux);
template <class T>
std::vector<std::vector<T>> sdpa_program_backward_device(DeviceOps<T>& device,
                                                         const SdpaCache<T>& cache,
                                                         const AttentionParams<T>& a, const T* dout,
                                                         const T* out, const T* aux, T* dq, T* dk,
                                                         T* dv, T* scratch);

}  // namespace attnlab
