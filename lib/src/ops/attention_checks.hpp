// Private to the library: the boundary checks and cache filling shared by the CPU entry points
// (lib/src/ops/attention.cpp) and the CUDA ones (lib/backends/cuda/attention_cuda.cpp), so both
// take SdpaOptions and SdpaCache with the same messages. Defined and instantiated (float, double)
// in attention.cpp.
#pragma once

#include <string_view>
#include <vector>

#include "attnlab/ops/attention.hpp"

namespace attnlab::detail {

// Checks q (B,H,Tq,D), k (B,Hkv,Tk,D), v (B,Hkv,Tk,Dv) when given, the key mask (B,Tk), the bias
// (1|B, 1|H, Tq, Tk) and the options, naming `op`; returns the call resolved by resolve_sdpa (Dv =
// 0 without v). Throws ShapeError or std::invalid_argument.
template <class T>
SdpaCall check_sdpa_inputs(std::string_view op, const Tensor4<T>& q, const Tensor4<T>& k,
                           const Tensor4<T>* v, const SdpaOptions& options, const KeyMask* key_mask,
                           const Tensor4<T>* bias);

// Fills `cache` with a resolved call's spec, per-head scales, slopes, CPU path, mask, bias and
// tiles; the saved tensors (p, or out and lse) are the forward's to set (and the GPU its path).
template <class T>
void fill_sdpa_cache(SdpaCache<T>& cache, const SdpaCall& call, const SdpaOptions& options,
                     const KeyMask* key_mask, const Tensor4<T>* bias);

// Throws std::logic_error when the cache holds no forward of its path, ShapeError when dout, q, k
// or v do not match it.
template <class T>
void check_sdpa_backward_inputs(std::string_view op, const Tensor4<T>& dout,
                                const SdpaCache<T>& cache, const Tensor4<T>& q, const Tensor4<T>& k,
                                const Tensor4<T>& v);

// Where the backward of a cache with a bias that requires a gradient writes dS (B,H,Tq,Tk), zeroed:
// g.dbias itself when the bias does not broadcast, else `scratch` (sum_to_bias_shape then gives
// g.dbias).
template <class T>
Tensor4<T>& dscores_for(SdpaGrads<T>& g, Tensor4<T>& scratch, const SdpaCache<T>& cache);

// Throws std::invalid_argument unless the options' attention programs fit the call: a score
// program without a softcap, ALiBi or a bias; a mask program without causal or a window; a block
// mask built from the mask program for these sizes; finite program parameters.
void check_sdpa_programs(std::string_view op, const SdpaOptions& options,
                         const AttentionSizes& sizes, bool has_bias);

// A cache's programs bound into the params of one CPU call (attnlab/attention/program.hpp): the
// captured parameters' pointers and the call's error status, alive while the kernel runs.
template <class T>
class ProgramBinding {
 public:
  ProgramBinding(const SdpaCache<T>& cache, AttentionParams<T>& p);
  ProgramBinding(const ProgramBinding&) = delete;
  ProgramBinding& operator=(const ProgramBinding&) = delete;
  // Σ of the parameters' sizes: the width of a row of AttentionParams::program_grads.
  std::size_t width() const { return width_; }
  // Throws std::invalid_argument "<op>: <the program's first error>" if the program raised one.
  void rethrow(std::string_view op) const;

 private:
  std::vector<const T*> values_;
  std::vector<std::size_t> sizes_;
  std::size_t width_ = 0;
  attention::ProgramStatus status_;
  attention::ProgramArgs<T> args_;
};

// g.dscale(h) = Σ_b dscale_part[b·H + h], in a fixed order.
template <class T>
void sum_dscale(SdpaGrads<T>& g, const std::vector<T>& dscale_part, std::size_t H);

}  // namespace attnlab::detail
