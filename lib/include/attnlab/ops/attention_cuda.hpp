// Scaled dot-product attention on the GPU, over the CPU op's host tensors: each call copies its
// inputs to the device, runs the CUDA kernels (attnlab/cuda_attention.hpp) and copies the results
// back. For tests, comparisons with the CPU op and small-scale use; device-resident code calls the
// launchers directly.
//
// Same contract as attnlab/ops/attention.hpp: S = s · Q Kᵀ, P = softmax(S) over visible keys,
// O = P V; scale from the mode (none | sqrt_dk | dk), an explicit scale, or one scale per head;
// causal is top-left aligned; the key mask (B, Tk) has true = may attend (PyTorch SDPA polarity);
// a query row with no visible key gives P = 0, O = 0 and zero gradients.
//
// Without the CUDA backend, or without a device, every function throws CudaError.
#pragma once

#include <string_view>

#include "attnlab/ops/attention.hpp"
#include "attnlab/tensor.hpp"

namespace attnlab {

// reference: cuBLAS GEMMs around softmax kernels, stores P (B,H,Tq,Tk).
// fused: tiled online softmax (FlashAttention-2 style), stores O and the row log-sum-exp only.
enum class SdpaCudaPath { reference, fused };

std::string_view to_string(SdpaCudaPath path);
// "reference" | "fused"; throws std::invalid_argument naming the value it got.
SdpaCudaPath parse_sdpa_cuda_path(std::string_view text);

// What the GPU backward needs besides q, k and v (host copies).
template <class T>
struct SdpaCudaCache {
  SdpaCudaPath path = SdpaCudaPath::fused;
  std::size_t B = 0, H = 0, Tq = 0, Tk = 0, D = 0, Dv = 0;
  std::vector<T> scale;  // (H,) the scale used by each head
  bool causal = false;
  bool has_key_mask = false;
  KeyMask key_mask;  // (B, Tk), true = may attend; empty when has_key_mask is false
  Tensor4<T> p;      // (B,H,Tq,Tk) attention weights: reference path only (empty for fused)
  Tensor3<T> lse;    // (B,H,Tq) log Σ exp(S) per row, -inf for an empty row: fused path only
  Tensor4<T> out;    // (B,H,Tq,Dv) the forward's output: fused path only (for rowsum(dO ⊙ O))
};

// q: (B,H,Tq,D), k: (B,H,Tk,D), v: (B,H,Tk,Dv); key_mask: (B,Tk) or nullptr.
// Returns O (B,H,Tq,Dv) and fills `cache`. Throws ShapeError on any shape mismatch (the CPU op's
// messages), std::invalid_argument on a bad scale, CudaError without a device.
template <class T>
Tensor4<T> sdpa_forward_cuda(SdpaCudaCache<T>& cache, const Tensor4<T>& q, const Tensor4<T>& k,
                             const Tensor4<T>& v, const SdpaOptions& options = {},
                             const KeyMask* key_mask = nullptr,
                             SdpaCudaPath path = SdpaCudaPath::fused);

// dout: (B,H,Tq,Dv) = dL/dO; q, k, v: the forward's inputs. Returns fresh gradients (assigns),
// dscale included (computed on the host as ⟨dQ, Q⟩ / s per head). Throws std::logic_error for an
// empty cache, ShapeError on mismatch.
template <class T>
SdpaGrads<T> sdpa_backward_cuda(const Tensor4<T>& dout, const SdpaCudaCache<T>& cache,
                                const Tensor4<T>& q, const Tensor4<T>& k, const Tensor4<T>& v);

}  // namespace attnlab
