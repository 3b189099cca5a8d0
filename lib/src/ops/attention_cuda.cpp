#include "attnlab/ops/attention_cuda.hpp"

#include <cmath>
#include <stdexcept>
#include <string>
#include <vector>

#include "attnlab/cuda.hpp"
#include "attnlab/cuda_attention.hpp"

namespace attnlab {

std::string_view to_string(SdpaCudaPath path) {
  return path == SdpaCudaPath::reference ? "reference" : "fused";
}

SdpaCudaPath parse_sdpa_cuda_path(std::string_view text) {
  if (text == "reference") return SdpaCudaPath::reference;
  if (text == "fused") return SdpaCudaPath::fused;
  throw std::invalid_argument("parse_sdpa_cuda_path: path expected reference|fused, got '" +
                              std::string(text) + "'");
}

namespace {

using cuda::DeviceArray;

std::ptrdiff_t extent(std::size_t x) {
  return static_cast<std::ptrdiff_t>(x);
}

// The CPU op's boundary checks (attention.cpp), with this op's name in the messages.
template <class T>
void check_inputs(SdpaCudaCache<T>& dims, const char* op, const Tensor4<T>& q, const Tensor4<T>& k,
                  const Tensor4<T>& v, const SdpaOptions& options, const KeyMask* key_mask) {
  constexpr auto any = kAnyExtent;
  dims.B = q.shape()[0], dims.H = q.shape()[1], dims.Tq = q.shape()[2], dims.D = q.shape()[3];
  check_shape(op, "k", k, {extent(dims.B), extent(dims.H), any, extent(dims.D)});
  dims.Tk = k.shape()[2];
  check_shape(op, "v", v, {extent(dims.B), extent(dims.H), extent(dims.Tk), any});
  dims.Dv = v.shape()[3];
  check_arg(dims.D > 0 && dims.Tq > 0 && dims.Tk > 0, op, "q, k", "non-zero Tq, Tk and D",
            format_shape_of(q.shape()) + " and " + format_shape_of(k.shape()));
  if (key_mask) check_shape(op, "key_mask", *key_mask, {extent(dims.B), extent(dims.Tk)});
  if (!options.head_scale.empty()) {
    check_extents(op, "head_scale", {options.head_scale.size()}, {extent(dims.H)});
    for (double s : options.head_scale) {
      check_arg(std::isfinite(s) && s > 0, op, "head_scale", "a finite scale > 0",
                std::to_string(s));
    }
  }
}

// The device copies of one call's inputs and the launch arguments pointing at them.
template <class T>
struct DeviceInputs {
  DeviceArray<T> q, k, v, scale;
  DeviceArray<unsigned char> key_mask;
  cuda::SdpaDeviceArgs<T> args;

  DeviceInputs(const SdpaCudaCache<T>& c, const Tensor4<T>& q_host, const Tensor4<T>& k_host,
               const Tensor4<T>& v_host)
      : q(q_host.data(), q_host.size()),
        k(k_host.data(), k_host.size()),
        v(v_host.data(), v_host.size()),
        scale(c.scale.data(), c.scale.size()) {
    if (c.has_key_mask) {
      const std::vector<unsigned char> mask(c.key_mask.begin(), c.key_mask.end());
      key_mask = DeviceArray<unsigned char>(mask.data(), mask.size());
    }
    args.B = c.B, args.H = c.H, args.Tq = c.Tq, args.Tk = c.Tk, args.D = c.D, args.Dv = c.Dv;
    args.q = q.data(), args.k = k.data(), args.v = v.data(), args.scale = scale.data();
    args.key_mask = c.has_key_mask ? key_mask.data() : nullptr;
    args.causal = c.causal;
  }
};

// A device output of `count` elements, poisoned with NaN so that an element no kernel wrote shows.
template <class T>
DeviceArray<T> poisoned(std::size_t count) {
  DeviceArray<T> a(count);
  a.poison();
  return a;
}

}  // namespace

template <class T>
Tensor4<T> sdpa_forward_cuda(SdpaCudaCache<T>& cache, const Tensor4<T>& q, const Tensor4<T>& k,
                             const Tensor4<T>& v, const SdpaOptions& options,
                             const KeyMask* key_mask, SdpaCudaPath path) {
  SdpaCudaCache<T> c;
  check_inputs(c, "sdpa_forward_cuda", q, k, v, options, key_mask);
  c.path = path;
  c.scale.assign(c.H, static_cast<T>(resolve_scale(options, c.D)));
  for (std::size_t h = 0; h < options.head_scale.size(); ++h) {
    c.scale[h] = static_cast<T>(options.head_scale[h]);
  }
  c.causal = options.causal;
  c.has_key_mask = key_mask != nullptr;
  if (key_mask) c.key_mask = *key_mask;
  cuda::require_device("sdpa_forward_cuda");

  DeviceInputs<T> in(c, q, k, v);
  Tensor4<T> out({c.B, c.H, c.Tq, c.Dv});
  auto out_d = poisoned<T>(out.size());
  if (path == SdpaCudaPath::reference) {
    c.p = Tensor4<T>({c.B, c.H, c.Tq, c.Tk});
    auto p_d = poisoned<T>(c.p.size());
    cuda::sdpa_reference_forward(out_d.data(), p_d.data(), in.args);
    cuda::synchronize();
    p_d.download(c.p.data());
  } else {
    c.lse = Tensor3<T>({c.B, c.H, c.Tq});
    auto lse_d = poisoned<T>(c.lse.size());
    cuda::sdpa_fused_forward(out_d.data(), lse_d.data(), in.args);
    cuda::synchronize();
    lse_d.download(c.lse.data());
  }
  out_d.download(out.data());
  if (path == SdpaCudaPath::fused) c.out = out;
  cache = std::move(c);
  return out;
}

template <class T>
SdpaGrads<T> sdpa_backward_cuda(const Tensor4<T>& dout, const SdpaCudaCache<T>& cache,
                                const Tensor4<T>& q, const Tensor4<T>& k, const Tensor4<T>& v) {
  const auto& c = cache;
  if (c.Tq == 0 || (c.path == SdpaCudaPath::reference ? c.p.size() == 0 : c.lse.size() == 0)) {
    throw std::logic_error("sdpa_backward_cuda: the cache is empty: call sdpa_forward_cuda first");
  }
  const char* op = "sdpa_backward_cuda";
  check_shape(op, "dout", dout, {extent(c.B), extent(c.H), extent(c.Tq), extent(c.Dv)});
  check_shape(op, "q", q, {extent(c.B), extent(c.H), extent(c.Tq), extent(c.D)});
  check_shape(op, "k", k, {extent(c.B), extent(c.H), extent(c.Tk), extent(c.D)});
  check_shape(op, "v", v, {extent(c.B), extent(c.H), extent(c.Tk), extent(c.Dv)});
  cuda::require_device(op);

  DeviceInputs<T> in(c, q, k, v);
  DeviceArray<T> dout_d(dout.data(), dout.size());
  SdpaGrads<T> g{Tensor4<T>({c.B, c.H, c.Tq, c.D}), Tensor4<T>({c.B, c.H, c.Tk, c.D}),
                 Tensor4<T>({c.B, c.H, c.Tk, c.Dv}), Tensor1<T>::from_shape({c.H})};
  auto dq_d = poisoned<T>(g.dq.size());
  auto dk_d = poisoned<T>(g.dk.size());
  auto dv_d = poisoned<T>(g.dv.size());
  if (c.path == SdpaCudaPath::reference) {
    DeviceArray<T> p_d(c.p.data(), c.p.size());
    auto ds_d = poisoned<T>(c.p.size());
    cuda::sdpa_reference_backward(dq_d.data(), dk_d.data(), dv_d.data(), ds_d.data(), dout_d.data(),
                                  p_d.data(), in.args);
  } else {
    DeviceArray<T> out_d(c.out.data(), c.out.size());
    DeviceArray<T> lse_d(c.lse.data(), c.lse.size());
    auto row_dot_d = poisoned<T>(c.lse.size());
    cuda::sdpa_fused_backward(dq_d.data(), dk_d.data(), dv_d.data(), row_dot_d.data(),
                              dout_d.data(), out_d.data(), lse_d.data(), in.args);
  }
  cuda::synchronize();
  dq_d.download(g.dq.data());
  dk_d.download(g.dk.data());
  dv_d.download(g.dv.data());
  // dL/ds_h = Σ dS ⊙ (Q Kᵀ) = ⟨dQ, Q⟩ / s_h, summed over the batch in a fixed order.
  g.dscale.fill(T(0));
  const std::size_t slice = c.Tq * c.D;
  for (std::size_t bh = 0; bh < c.B * c.H; ++bh) {
    T acc = 0;
    for (std::size_t i = 0; i < slice; ++i)
      acc += g.dq.data()[bh * slice + i] * q.data()[bh * slice + i];
    g.dscale(bh % c.H) += acc / c.scale[bh % c.H];
  }
  return g;
}

#define ATTNLAB_INSTANTIATE_SDPA_CUDA(T)                                                      \
  template Tensor4<T> sdpa_forward_cuda<T>(SdpaCudaCache<T>&, const Tensor4<T>&,              \
                                           const Tensor4<T>&, const Tensor4<T>&,              \
                                           const SdpaOptions&, const KeyMask*, SdpaCudaPath); \
  template SdpaGrads<T> sdpa_backward_cuda<T>(const Tensor4<T>&, const SdpaCudaCache<T>&,     \
                                              const Tensor4<T>&, const Tensor4<T>&,           \
                                              const Tensor4<T>&);
ATTNLAB_INSTANTIATE_SDPA_CUDA(float)
ATTNLAB_INSTANTIATE_SDPA_CUDA(double)
#undef ATTNLAB_INSTANTIATE_SDPA_CUDA

}  // namespace attnlab
