#include "attnlab/ops/attention.hpp"

#include <cmath>
#include <limits>
#include <string>

#include <xtensor/xarray.hpp>

#include "attention_fused.hpp"
#include "attnlab/blas.hpp"
#include "attnlab/ops/softmax.hpp"
#include "attnlab/threads.hpp"

namespace attnlab {

std::string_view to_string(Scaling mode) {
  switch (mode) {
    case Scaling::none:
      return "none";
    case Scaling::sqrt_dk:
      return "sqrt_dk";
    case Scaling::dk:
      return "dk";
  }
  return "?";
}

Scaling parse_scaling(std::string_view text) {
  if (text == "none") return Scaling::none;
  if (text == "sqrt_dk") return Scaling::sqrt_dk;
  if (text == "dk") return Scaling::dk;
  throw std::invalid_argument("parse_scaling: mode expected none|sqrt_dk|dk, got '" +
                              std::string(text) + "'");
}

std::string_view to_string(SdpaPath path) {
  switch (path) {
    case SdpaPath::reference:
      return "reference";
    case SdpaPath::fused:
      return "fused";
    case SdpaPath::automatic:
      return "auto";
  }
  return "?";
}

SdpaPath parse_sdpa_path(std::string_view text) {
  if (text == "reference") return SdpaPath::reference;
  if (text == "fused") return SdpaPath::fused;
  if (text == "auto") return SdpaPath::automatic;
  throw std::invalid_argument("parse_sdpa_path: path expected reference|fused|auto, got '" +
                              std::string(text) + "'");
}

SdpaPath resolve_sdpa_path(SdpaPath path, std::size_t Tk) {
  if (path != SdpaPath::automatic) return path;
  return Tk >= kSdpaFusedMinKeys ? SdpaPath::fused : SdpaPath::reference;
}

double scaling_factor(Scaling mode, std::size_t d) {
  switch (mode) {
    case Scaling::none:
      return 1.0;
    case Scaling::sqrt_dk:
      return 1.0 / std::sqrt(static_cast<double>(d));
    case Scaling::dk:
      return 1.0 / static_cast<double>(d);
  }
  return 1.0;
}

namespace {
void check_scale_value(double s, std::string_view name) {
  check_arg(std::isfinite(s) && s > 0, "sdpa_forward", name, "a finite scale > 0",
            std::to_string(s));
}
}  // namespace

double resolve_scale(const SdpaOptions& options, std::size_t d) {
  if (options.scale) {
    check_scale_value(*options.scale, "scale");
    return *options.scale;
  }
  return scaling_factor(options.scaling, d);
}

namespace {

struct SdpaDims {
  std::size_t B, H, Tq, Tk, D, Dv;
};

// Checks q, k, v, the mask and the per-head scales at the public boundary.
template <class T>
SdpaDims check_sdpa_inputs(std::string_view op, const Tensor4<T>& q, const Tensor4<T>& k,
                           const Tensor4<T>* v, const SdpaOptions& options,
                           const KeyMask* key_mask) {
  constexpr auto any = kAnyExtent;
  const auto e = [](std::size_t x) { return static_cast<std::ptrdiff_t>(x); };
  SdpaDims dims{q.shape()[0], q.shape()[1], q.shape()[2], 0, q.shape()[3], 0};
  check_shape(op, "k", k, {e(dims.B), e(dims.H), any, e(dims.D)});
  dims.Tk = k.shape()[2];
  if (v) {
    check_shape(op, "v", *v, {e(dims.B), e(dims.H), e(dims.Tk), any});
    dims.Dv = v->shape()[3];
  }
  check_arg(dims.D > 0 && dims.Tq > 0 && dims.Tk > 0, op, "q, k", "non-zero Tq, Tk and D",
            format_shape_of(q.shape()) + " and " + format_shape_of(k.shape()));
  if (key_mask) check_shape(op, "key_mask", *key_mask, {e(dims.B), e(dims.Tk)});
  if (!options.head_scale.empty()) {
    check_extents(op, "head_scale", {options.head_scale.size()}, {e(dims.H)});
    for (double s : options.head_scale) check_scale_value(s, "head_scale");
  }
  return dims;
}

template <class T>
std::vector<T> head_scales(const SdpaOptions& options, std::size_t H, std::size_t D) {
  std::vector<T> scale(H, static_cast<T>(resolve_scale(options, D)));
  for (std::size_t h = 0; h < options.head_scale.size(); ++h) {
    scale[h] = static_cast<T>(options.head_scale[h]);
  }
  return scale;
}

// One (b, h) slice of S = s · Q Kᵀ with hidden positions set to -inf.
template <class T>
void scores_slice(T* sp, const T* qp, const T* kp, std::size_t b, const SdpaDims& dims, T scale,
                  bool causal, const KeyMask* key_mask) {
  const int m = static_cast<int>(dims.Tq), n = static_cast<int>(dims.Tk),
            d = static_cast<int>(dims.D);
  //                                                    (Tq,D) x (D,Tk) -> (Tq,Tk)
  blas::gemm<T>(false, true, m, n, d, scale, qp, d, kp, d, T(0), sp, n);
  if (!causal && !key_mask) return;
  constexpr T hidden = -std::numeric_limits<T>::infinity();  // excluded from the softmax
  for (std::size_t i = 0; i < dims.Tq; ++i) {
    T* row = sp + i * dims.Tk;
    for (std::size_t j = 0; j < dims.Tk; ++j) {
      const bool visible = (!causal || j <= i) && (!key_mask || (*key_mask)(b, j));
      if (!visible) row[j] = hidden;
    }
  }
}

}  // namespace

template <class T>
Tensor4<T> sdpa_scores(const Tensor4<T>& q, const Tensor4<T>& k, const SdpaOptions& options,
                       const KeyMask* key_mask) {
  const SdpaDims dims = check_sdpa_inputs<T>("sdpa_scores", q, k, nullptr, options, key_mask);
  const std::vector<T> scale = head_scales<T>(options, dims.H, dims.D);
  Tensor4<T> scores({dims.B, dims.H, dims.Tq, dims.Tk});
  const auto bh_count = static_cast<std::ptrdiff_t>(dims.B * dims.H);
#pragma omp parallel for num_threads(num_threads()) schedule(static)
  for (std::ptrdiff_t bh = 0; bh < bh_count; ++bh) {
    const std::size_t b = static_cast<std::size_t>(bh) / dims.H,
                      h = static_cast<std::size_t>(bh) % dims.H;
    scores_slice(scores.data() + bh * dims.Tq * dims.Tk, q.data() + bh * dims.Tq * dims.D,
                 k.data() + bh * dims.Tk * dims.D, b, dims, scale[h], options.causal, key_mask);
  }
  return scores;
}

template <class T>
Tensor4<T> sdpa_forward(SdpaCache<T>& cache, const Tensor4<T>& q, const Tensor4<T>& k,
                        const Tensor4<T>& v, const SdpaOptions& options, const KeyMask* key_mask) {
  const SdpaDims dims = check_sdpa_inputs<T>("sdpa_forward", q, k, &v, options, key_mask);
  const auto [B, H, Tq, Tk, D, Dv] = dims;
  cache.B = B, cache.H = H, cache.Tq = Tq, cache.Tk = Tk, cache.D = D, cache.Dv = Dv;
  cache.scale = head_scales<T>(options, H, D);
  cache.causal = options.causal;
  cache.has_key_mask = key_mask != nullptr;
  cache.key_mask = key_mask ? *key_mask : KeyMask();
  cache.path = resolve_sdpa_path(options.path, Tk);
  Tensor4<T> out({B, H, Tq, Dv});
  if (cache.path == SdpaPath::fused) {
    cache.p = Tensor4<T>();  // not materialised: has_weights() is false
    detail::sdpa_fused_forward(out, cache, q, k, v);
    return out;
  }
  cache.out = Tensor4<T>();
  cache.lse = Tensor3<T>();
  cache.p.resize({B, H, Tq, Tk});

  const int m = static_cast<int>(Tq), n = static_cast<int>(Tk), dv = static_cast<int>(Dv);
  const auto bh_count = static_cast<std::ptrdiff_t>(B * H);
#pragma omp parallel for num_threads(num_threads()) schedule(static)
  for (std::ptrdiff_t bh = 0; bh < bh_count; ++bh) {
    const std::size_t b = static_cast<std::size_t>(bh) / H, h = static_cast<std::size_t>(bh) % H;
    T* pp = cache.p.data() + bh * Tq * Tk;
    // S = s · Q Kᵀ, hidden positions at -inf             (Tq,D) x (D,Tk) -> (Tq,Tk)
    scores_slice(pp, q.data() + bh * Tq * D, k.data() + bh * Tk * D, b, dims, cache.scale[h],
                 options.causal, key_mask);
    softmax_rows_forward(pp, pp, Tq, Tk);  // P = softmax(S), in place
    // O = P V                                           (Tq,Tk) x (Tk,Dv) -> (Tq,Dv)
    blas::gemm<T>(false, false, m, dv, n, T(1), pp, n, v.data() + bh * Tk * Dv, dv, T(0),
                  out.data() + bh * Tq * Dv, dv);
  }
  return out;
}

template <class T>
Tensor4<T> sdpa_forward(SdpaCache<T>& cache, const xt::xarray<T>& q, const xt::xarray<T>& k,
                        const xt::xarray<T>& v, const SdpaOptions& options,
                        const KeyMask* key_mask) {
  constexpr auto any = kAnyExtent;
  const auto shape_of = [](const xt::xarray<T>& t) {
    return std::vector<std::size_t>(t.shape().begin(), t.shape().end());
  };
  check_extents("sdpa_forward", "q", shape_of(q), {any, any, any, any});
  check_extents("sdpa_forward", "k", shape_of(k), {any, any, any, any});
  check_extents("sdpa_forward", "v", shape_of(v), {any, any, any, any});
  return sdpa_forward<T>(cache, Tensor4<T>(q), Tensor4<T>(k), Tensor4<T>(v), options, key_mask);
}

namespace {

// The reference backward on the materialised P: assigns g.dq, g.dk, g.dv and dscale_part (B·H).
template <class T>
void reference_backward(SdpaGrads<T>& g, std::vector<T>& dscale_part, const Tensor4<T>& dout,
                        const SdpaCache<T>& cache, const Tensor4<T>& q, const Tensor4<T>& k,
                        const Tensor4<T>& v) {
  const std::size_t B = cache.B, H = cache.H, Tq = cache.Tq, Tk = cache.Tk, D = cache.D,
                    Dv = cache.Dv;
  const int m = static_cast<int>(Tq), n = static_cast<int>(Tk), d = static_cast<int>(D),
            dv = static_cast<int>(Dv);
  const auto bh_count = static_cast<std::ptrdiff_t>(B * H);
#pragma omp parallel num_threads(num_threads())
  {
    std::vector<T> ds(Tq * Tk);  // per-thread scratch: dP, then dS in place
#pragma omp for schedule(static)
    for (std::ptrdiff_t bh = 0; bh < bh_count; ++bh) {
      const std::size_t h = static_cast<std::size_t>(bh) % H;
      const T s = cache.scale[h];
      const T* pp = cache.p.data() + bh * Tq * Tk;
      const T* dop = dout.data() + bh * Tq * Dv;
      const T* qp = q.data() + bh * Tq * D;
      const T* kp = k.data() + bh * Tk * D;
      const T* vp = v.data() + bh * Tk * Dv;
      T* dqp = g.dq.data() + bh * Tq * D;
      T* dkp = g.dk.data() + bh * Tk * D;
      T* dvp = g.dv.data() + bh * Tk * Dv;
      // dV = Pᵀ dO                                     (Tk,Tq) x (Tq,Dv) -> (Tk,Dv)
      blas::gemm<T>(true, false, n, dv, m, T(1), pp, n, dop, dv, T(0), dvp, dv);
      // dP = dO Vᵀ                                     (Tq,Dv) x (Dv,Tk) -> (Tq,Tk)
      blas::gemm<T>(false, true, m, n, dv, T(1), dop, dv, vp, dv, T(0), ds.data(), n);
      // dS = P ⊙ (dP − rowsum(dP ⊙ P)); hidden positions have P = 0, hence dS = 0 there.
      softmax_rows_backward(ds.data(), ds.data(), pp, Tq, Tk);
      // dQ = s · dS K                                  (Tq,Tk) x (Tk,D) -> (Tq,D)
      blas::gemm<T>(false, false, m, d, n, s, ds.data(), n, kp, d, T(0), dqp, d);
      // dK = s · dSᵀ Q                                 (Tk,Tq) x (Tq,D) -> (Tk,D)
      blas::gemm<T>(true, false, n, d, m, s, ds.data(), n, qp, d, T(0), dkp, d);
      // dL/ds = Σ dS ⊙ (Q Kᵀ) = ⟨dS K, Q⟩ = ⟨dQ, Q⟩ / s
      T acc = 0;
      for (std::size_t i = 0; i < Tq * D; ++i) acc += dqp[i] * qp[i];
      dscale_part[bh] = acc / s;
    }
  }
}

}  // namespace

template <class T>
SdpaGrads<T> sdpa_backward(const Tensor4<T>& dout, const SdpaCache<T>& cache, const Tensor4<T>& q,
                           const Tensor4<T>& k, const Tensor4<T>& v) {
  const std::size_t B = cache.B, H = cache.H, Tq = cache.Tq, Tk = cache.Tk, D = cache.D,
                    Dv = cache.Dv;
  const bool fused = cache.path == SdpaPath::fused;
  if (fused ? cache.lse.size() == 0 || cache.lse.shape()[2] != Tq
            : cache.p.size() == 0 || cache.p.shape()[2] != Tq) {
    throw std::logic_error("sdpa_backward: the cache is empty: call sdpa_forward first");
  }
  const auto e = [](std::size_t x) { return static_cast<std::ptrdiff_t>(x); };
  check_shape("sdpa_backward", "dout", dout, {e(B), e(H), e(Tq), e(Dv)});
  check_shape("sdpa_backward", "q", q, {e(B), e(H), e(Tq), e(D)});
  check_shape("sdpa_backward", "k", k, {e(B), e(H), e(Tk), e(D)});
  check_shape("sdpa_backward", "v", v, {e(B), e(H), e(Tk), e(Dv)});

  SdpaGrads<T> g{Tensor4<T>({B, H, Tq, D}), Tensor4<T>({B, H, Tk, D}), Tensor4<T>({B, H, Tk, Dv}),
                 Tensor1<T>::from_shape({H})};
  std::vector<T> dscale_part(B * H);
  if (fused) {
    detail::sdpa_fused_backward(g, dscale_part, dout, cache, q, k, v);
  } else {
    reference_backward(g, dscale_part, dout, cache, q, k, v);
  }
  g.dscale.fill(T(0));
  for (std::size_t bh = 0; bh < B * H; ++bh) g.dscale(bh % H) += dscale_part[bh];  // fixed order
  return g;
}

template <class T>
Tensor4<T> sdpa_weights(const Tensor4<T>& q, const Tensor4<T>& k, const SdpaOptions& options,
                        const KeyMask* key_mask) {
  Tensor4<T> p = sdpa_scores(q, k, options, key_mask);  // hidden positions at -inf
  const std::size_t Tk = p.shape()[3];
  softmax_rows_forward(p.data(), p.data(), p.size() / Tk, Tk);  // P = softmax(S), in place
  return p;
}

#define ATTNLAB_INSTANTIATE_SDPA(T)                                                              \
  template Tensor4<T> sdpa_scores<T>(const Tensor4<T>&, const Tensor4<T>&, const SdpaOptions&,   \
                                     const KeyMask*);                                            \
  template Tensor4<T> sdpa_forward<T>(SdpaCache<T>&, const Tensor4<T>&, const Tensor4<T>&,       \
                                      const Tensor4<T>&, const SdpaOptions&, const KeyMask*);    \
  template Tensor4<T> sdpa_forward<T>(SdpaCache<T>&, const xt::xarray<T>&, const xt::xarray<T>&, \
                                      const xt::xarray<T>&, const SdpaOptions&, const KeyMask*); \
  template Tensor4<T> sdpa_weights<T>(const Tensor4<T>&, const Tensor4<T>&, const SdpaOptions&,  \
                                      const KeyMask*);                                           \
  template SdpaGrads<T> sdpa_backward<T>(const Tensor4<T>&, const SdpaCache<T>&,                 \
                                         const Tensor4<T>&, const Tensor4<T>&, const Tensor4<T>&);
ATTNLAB_INSTANTIATE_SDPA(float)
ATTNLAB_INSTANTIATE_SDPA(double)
#undef ATTNLAB_INSTANTIATE_SDPA

}  // namespace attnlab
