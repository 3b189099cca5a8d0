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
// Attention programs (SdpaOptions::score_program, mask_program) run on the fused GPU path, with
// the launchers of their kernels in SdpaOptions::device_program (attnlab/attention/
// device_program.hpp); a program without launchers, or on the reference path, is refused.
//
// Without the CUDA backend, or without a device, every function throws CudaError. The overloads
// taking a DeviceOps run the same op on that device: the CUDA backend's, or the emulated device
// (attnlab/backends/emulated.hpp) that runs the same kernels on the CPU.
#pragma once

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

}  // namespace attnlab
