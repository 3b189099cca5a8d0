// The host side of the GPU attention op (attnlab/ops/attention_cuda.hpp): the CPU op's checks and
// cache (lib/src/ops/attention_checks.hpp), device copies, and the CUDA backend's DeviceOps
// (attnlab/device_ops.hpp), whose attention calls are the GPU paths. Part of the CUDA backend, but
// compiled by the C++ compiler into the library in every build (lib/CMakeLists.txt): it names no
// CUDA type, and without the backend its calls throw as make_cuda_device_ops does
// (without_cuda.cpp), so the op needs no stub.
#include "attnlab/ops/attention_cuda.hpp"

#include <memory>
#include <stdexcept>
#include <vector>

#include "attnlab/cuda.hpp"
#include "attnlab/device_ops.hpp"
#include "ops/attention_checks.hpp"

namespace attnlab {

namespace {

using cuda::DeviceArray;

// The process's CUDA backend for this op, made on first use (after require_device). DeviceOps
// instances hold no state the op depends on, so one serves every thread.
template <class T>
DeviceOps<T>& gpu() {
  static const std::unique_ptr<DeviceOps<T>> ops = make_cuda_device_ops<T>();
  return *ops;
}

// The device copies of one call's inputs and the launch parameters pointing at them.
template <class T>
struct DeviceInputs {
  DeviceArray<T> q, k, v, scale, alibi, bias;
  DeviceArray<unsigned char> key_mask;
  AttentionParams<T> params;

  DeviceInputs(const SdpaCache<T>& c, const Tensor4<T>& q_host, const Tensor4<T>& k_host,
               const Tensor4<T>& v_host)
      : q(q_host.data(), q_host.size()),
        k(k_host.data(), k_host.size()),
        v(v_host.data(), v_host.size()),
        scale(c.scale.data(), c.scale.size()) {
    params = c.params(q.data(), k.data(), v.data());
    params.scale = scale.data();
    if (!c.alibi.empty()) {
      alibi = DeviceArray<T>(c.alibi.data(), c.alibi.size());
      params.alibi_slopes = alibi.data();
    }
    if (c.has_bias()) {
      bias = DeviceArray<T>(c.bias.data(), c.bias.size());
      params.bias = bias.data();
    }
    params.key_mask = nullptr;
    if (c.has_key_mask) {
      const std::vector<unsigned char> mask(c.key_mask.begin(), c.key_mask.end());
      key_mask = DeviceArray<unsigned char>(mask.data(), mask.size());
      params.key_mask = key_mask.data();
    }
  }
};

// A device output of `count` elements, poisoned with NaN so that an element no kernel wrote shows.
template <class T>
DeviceArray<T> poisoned(std::size_t count) {
  DeviceArray<T> a(count);
  a.poison();
  return a;
}

// `automatic` on the GPU: the fused path when its tiles fit in shared memory for D and Dv.
template <class T>
SdpaPath resolve_cuda_path(SdpaPath path, std::size_t D, std::size_t Dv) {
  if (path != SdpaPath::automatic) return path;
  try {
    gpu<T>().check_fused(D, Dv);
    return SdpaPath::fused;
  } catch (const std::invalid_argument&) {
    return SdpaPath::reference;
  }
}

}  // namespace

template <class T>
Tensor4<T> sdpa_forward_cuda(SdpaCache<T>& cache, const Tensor4<T>& q, const Tensor4<T>& k,
                             const Tensor4<T>& v, const SdpaOptions& options,
                             const KeyMask* key_mask, const Tensor4<T>* bias) {
  const char* op = "sdpa_forward_cuda";
  const SdpaCall call = detail::check_sdpa_inputs<T>(op, q, k, &v, options, key_mask, bias);
  const AttentionSpec& spec = call.spec;
  check_arg(!options.score_program && !options.mask_program && !options.block_mask, op,
            "score_program, mask_program and block_mask",
            "none: attention programs run on the CPU paths (sdpa_forward) in this version",
            "a program");
  cuda::require_device(op);
  SdpaCache<T> c;
  detail::fill_sdpa_cache(c, call, options, key_mask, bias);
  c.path = resolve_cuda_path<T>(options.path, spec.D, spec.Dv);

  DeviceInputs<T> in(c, q, k, v);
  Tensor4<T> out({spec.B, spec.H, spec.Tq, spec.Dv});
  auto out_d = poisoned<T>(out.size());
  if (c.path == SdpaPath::reference) {
    c.p = Tensor4<T>({spec.B, spec.H, spec.Tq, spec.Tk});
    auto p_d = poisoned<T>(c.p.size());
    gpu<T>().sdpa_reference_forward(out_d.data(), p_d.data(), in.params);
    cuda::synchronize();
    p_d.download(c.p.data());
  } else {
    c.lse = Tensor3<T>({spec.B, spec.H, spec.Tq});
    auto lse_d = poisoned<T>(c.lse.size());
    gpu<T>().sdpa_fused_forward(out_d.data(), lse_d.data(), in.params);
    cuda::synchronize();
    lse_d.download(c.lse.data());
  }
  out_d.download(out.data());
  if (c.path == SdpaPath::fused) c.out = out;
  cache = std::move(c);
  return out;
}

template <class T>
SdpaGrads<T> sdpa_backward_cuda(const Tensor4<T>& dout, const SdpaCache<T>& cache,
                                const Tensor4<T>& q, const Tensor4<T>& k, const Tensor4<T>& v) {
  const char* op = "sdpa_backward_cuda";
  detail::check_sdpa_backward_inputs(op, dout, cache, q, k, v);
  cuda::require_device(op);
  const AttentionSpec& s = cache.spec;

  DeviceInputs<T> in(cache, q, k, v);
  DeviceArray<T> dout_d(dout.data(), dout.size());
  SdpaGrads<T> g{Tensor4<T>({s.B, s.H, s.Tq, s.D}),
                 Tensor4<T>({s.B, s.Hkv, s.Tk, s.D}),
                 Tensor4<T>({s.B, s.Hkv, s.Tk, s.Dv}),
                 Tensor1<T>::from_shape({s.H}),
                 {},
                 {}};
  Tensor4<T> scratch;  // dS (B,H,Tq,Tk) when the bias broadcasts
  Tensor4<T>* dscores = cache.bias_grad ? &detail::dscores_for(g, scratch, cache) : nullptr;
  DeviceArray<T> dscores_d;
  if (dscores) {
    dscores_d = DeviceArray<T>(dscores->data(), dscores->size());  // zeroed
    in.params.dscores = dscores_d.data();
  }
  auto dq_d = poisoned<T>(g.dq.size());
  auto dk_d = poisoned<T>(g.dk.size());
  auto dv_d = poisoned<T>(g.dv.size());
  if (cache.path == SdpaPath::reference) {
    DeviceArray<T> p_d(cache.p.data(), cache.p.size());
    auto ds_d = poisoned<T>(cache.p.size());
    gpu<T>().sdpa_reference_backward(dq_d.data(), dk_d.data(), dv_d.data(), ds_d.data(),
                                     dout_d.data(), p_d.data(), in.params);
  } else {
    DeviceArray<T> out_d(cache.out.data(), cache.out.size());
    DeviceArray<T> lse_d(cache.lse.data(), cache.lse.size());
    auto row_dot_d = poisoned<T>(cache.lse.size());
    gpu<T>().sdpa_fused_backward(dq_d.data(), dk_d.data(), dv_d.data(), row_dot_d.data(),
                                 dout_d.data(), out_d.data(), lse_d.data(), in.params);
  }
  cuda::synchronize();
  dq_d.download(g.dq.data());
  dk_d.download(g.dk.data());
  dv_d.download(g.dv.data());
  if (dscores) {
    dscores_d.download(dscores->data());
    if (scratch.size() != 0) {
      const auto& b = cache.bias.shape();
      g.dbias = sum_to_bias_shape(scratch, {b[0], b[1], b[2], b[3]});
    }
  }
  // dL/ds_h = Σ dS ⊙ (Q Kᵀ) = ⟨dQ, Q⟩ / s_h, per (b, h) slice, then summed over the batch.
  std::vector<T> dscale_part(s.B * s.H);
  const std::size_t slice = s.Tq * s.D;
  for (std::size_t bh = 0; bh < s.B * s.H; ++bh) {
    T acc = 0;
    for (std::size_t i = 0; i < slice; ++i) {
      acc += g.dq.data()[bh * slice + i] * q.data()[bh * slice + i];
    }
    dscale_part[bh] = acc / cache.scale[bh % s.H];
  }
  detail::sum_dscale(g, dscale_part, s.H);
  return g;
}

#define ATTNLAB_INSTANTIATE_SDPA_CUDA(T)                                                          \
  template Tensor4<T> sdpa_forward_cuda<T>(SdpaCache<T>&, const Tensor4<T>&, const Tensor4<T>&,   \
                                           const Tensor4<T>&, const SdpaOptions&, const KeyMask*, \
                                           const Tensor4<T>*);                                    \
  template SdpaGrads<T> sdpa_backward_cuda<T>(const Tensor4<T>&, const SdpaCache<T>&,             \
                                              const Tensor4<T>&, const Tensor4<T>&,               \
                                              const Tensor4<T>&);
ATTNLAB_INSTANTIATE_SDPA_CUDA(float)
ATTNLAB_INSTANTIATE_SDPA_CUDA(double)
#undef ATTNLAB_INSTANTIATE_SDPA_CUDA

}  // namespace attnlab
