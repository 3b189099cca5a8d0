// The public entry points of the CPU attention op (attnlab/ops/attention.hpp): names, options, the
// checks at the boundary (shared with the CUDA entry points through attention_checks.hpp), and
// the dispatch to the reference and fused kernels (attention_kernels.hpp).
#include "attnlab/ops/attention.hpp"

#include <cmath>
#include <stdexcept>
#include <string>

#include <xtensor/xarray.hpp>
#include <xtensor/xbuilder.hpp>

#include "attention_checks.hpp"
#include "attnlab/attention/dropout.hpp"
#include "attnlab/ops/softmax.hpp"
#include "kernels/attention.hpp"

namespace attnlab {

SdpaPath resolve_sdpa_path(SdpaPath path, std::size_t Tk, bool causal) {
  if (path != SdpaPath::automatic) return path;
  return Tk >= (causal ? kSdpaFusedMinKeysCausal : kSdpaFusedMinKeys) ? SdpaPath::fused
                                                                      : SdpaPath::reference;
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
void check_scale_value(double s, std::string_view op, const std::string& name) {
  check_arg(std::isfinite(s) && s > 0, op, name, "a finite scale > 0", std::to_string(s));
}
}  // namespace

double resolve_scale(const SdpaConfig& config, std::size_t d) {
  if (config.scale) {
    check_scale_value(*config.scale, "resolve_scale", "scale");
    return *config.scale;
  }
  return scaling_factor(config.scaling, d);
}

std::vector<double> alibi_slopes(std::size_t heads) {
  check_arg(heads > 0, "alibi_slopes", "heads", "> 0", "0");
  std::vector<double> slopes(heads);
  for (std::size_t h = 0; h < heads; ++h) {
    slopes[h] = std::exp2(-8.0 * static_cast<double>(h + 1) / static_cast<double>(heads));
  }
  return slopes;
}

SdpaCall resolve_sdpa(std::string_view op, const SdpaOptions& options, const AttentionSizes& sizes,
                      const std::string& prefix) {
  const auto heads = static_cast<std::ptrdiff_t>(sizes.H);
  if (options.scale) check_scale_value(*options.scale, op, prefix + "scale");
  if (!options.head_scale.empty()) {
    check_extents(op, prefix + "head_scale", {options.head_scale.size()}, {heads});
    for (double s : options.head_scale) check_scale_value(s, op, prefix + "head_scale");
  }
  if (!options.alibi_slopes.empty()) {
    check_extents(op, prefix + "alibi_slopes", {options.alibi_slopes.size()}, {heads});
    for (double m : options.alibi_slopes) {
      check_arg(std::isfinite(m), op, prefix + "alibi_slopes", "finite slopes", std::to_string(m));
    }
  }
  SdpaCall call;
  static_cast<AttentionSizes&>(call.spec) = sizes;
  static_cast<AttentionVariant&>(call.spec) = options;
  static_cast<AttentionDropout&>(call.spec) = options;
  check_attention_spec(call.spec, std::string(op).c_str(), prefix);
  call.scale =
      options.head_scale.empty()
          ? std::vector<double>(
                sizes.H, options.scale ? *options.scale : scaling_factor(options.scaling, sizes.D))
          : options.head_scale;
  call.alibi = options.alibi_slopes;
  call.path = resolve_sdpa_path(options.path, sizes.Tk, options.causal);
  return call;
}

xt::xtensor<bool, 4> sdpa_dropout_mask(const SdpaOptions& options, std::size_t B, std::size_t H,
                                       std::size_t Tq, std::size_t Tk) {
  AttentionSizes sizes;
  sizes.B = B, sizes.H = sizes.Hkv = H, sizes.Tq = Tq, sizes.Tk = Tk, sizes.D = sizes.Dv = 1;
  const AttentionSpec s = resolve_sdpa("sdpa_dropout_mask", options, sizes).spec;
  xt::xtensor<bool, 4> mask = xt::ones<bool>({B, H, Tq, Tk});
  if (s.dropout_p == 0) return mask;
  for (std::size_t bh = 0; bh < B * H; ++bh) {
    for (std::size_t i = 0; i < Tq; ++i) {
      for (std::size_t j = 0; j < Tk; ++j) {
        mask.data()[(bh * Tq + i) * Tk + j] = attention::attention_kept(s, bh, i, j);
      }
    }
  }
  return mask;
}

namespace detail {

template <class T>
SdpaCall check_sdpa_inputs(std::string_view op, const Tensor4<T>& q, const Tensor4<T>& k,
                           const Tensor4<T>* v, const SdpaOptions& options, const KeyMask* key_mask,
                           const Tensor4<T>* bias) {
  constexpr auto any = kAnyExtent;
  const auto extent = [](std::size_t x) { return static_cast<std::ptrdiff_t>(x); };
  AttentionSpec s;
  s.B = q.shape()[0], s.H = q.shape()[1], s.Tq = q.shape()[2], s.D = q.shape()[3];
  s.Hkv = k.shape()[1];  // Hkv < H: grouped-query attention (checked by the spec below)
  check_shape(op, "k", k, {extent(s.B), extent(s.Hkv), any, extent(s.D)});
  s.Tk = k.shape()[2];
  if (v) {
    check_shape(op, "v", *v, {extent(s.B), extent(s.Hkv), extent(s.Tk), any});
    s.Dv = v->shape()[3];
  }
  check_arg(s.D > 0 && s.Tq > 0 && s.Tk > 0, op, "q, k", "non-zero Tq, Tk and D",
            format_shape_of(q.shape()) + " and " + format_shape_of(k.shape()));
  if (key_mask) check_shape(op, "key_mask", *key_mask, {extent(s.B), extent(s.Tk)});
  if (bias) {
    const auto& b = bias->shape();
    if ((b[0] != 1 && b[0] != s.B) || (b[1] != 1 && b[1] != s.H) || b[2] != s.Tq || b[3] != s.Tk) {
      throw ShapeError(op, "bias", {extent(s.B), extent(s.H), extent(s.Tq), extent(s.Tk)},
                       {b.begin(), b.end()}, "or extent 1 on the batch and head axes");
    }
  }
  check_sdpa_programs(op, options, s, bias != nullptr);
  return resolve_sdpa(op, options, s);
}

void check_sdpa_programs(std::string_view op, const SdpaOptions& options,
                         const AttentionSizes& sizes, bool has_bias) {
  if (options.score_program) {
    const bool alibi = !options.alibi_slopes.empty();
    check_arg(options.softcap == 0 && !alibi && !has_bias, op, "score_program",
              "no softcap, alibi_slopes or bias beside it (give them in the program: "
              "attnlab/attention/programs.hpp has each)",
              std::string(options.softcap != 0 ? "a softcap"
                          : alibi              ? "alibi_slopes"
                                               : "a bias") +
                  " and the program '" + options.score_program->name() + "'");
  } else {
    check_arg(options.program_params.empty(), op, "program_params", "none without a score_program",
              std::to_string(options.program_params.size()) + " parameter(s)");
  }
  for (std::size_t k = 0; k < options.program_params.size(); ++k) {
    for (double x : options.program_params[k]) {
      check_arg(std::isfinite(x), op, "program_params[" + std::to_string(k) + "]", "finite values",
                std::to_string(x));
    }
  }
  const bool mask = options.mask_program || options.block_mask;
  if (mask) {
    const std::string name =
        (options.mask_program ? *options.mask_program : options.block_mask->program()).name();
    check_arg(!options.causal && options.window == 0, op, "mask_program",
              "no causal or window beside it (give them in the mask: masks::causal, "
              "masks::sliding_window)",
              std::string(options.causal ? "causal" : "a window") + " and the mask '" + name + "'");
  }
  if (options.block_mask) {
    check_arg(!options.mask_program || options.mask_program == options.block_mask->program_ptr(),
              op, "block_mask", "one built from the call's mask_program",
              "one built from '" + options.block_mask->program().name() + "'");
    options.block_mask->check_matches(sizes, std::string(op).c_str());
  }
}

template <class T>
void fill_sdpa_cache(SdpaCache<T>& cache, const SdpaCall& call, const SdpaOptions& options,
                     const KeyMask* key_mask, const Tensor4<T>* bias) {
  cache.spec = call.spec;
  cache.scale.assign(call.scale.begin(), call.scale.end());
  cache.alibi.assign(call.alibi.begin(), call.alibi.end());
  cache.has_key_mask = key_mask != nullptr;
  cache.key_mask = key_mask ? *key_mask : KeyMask();
  cache.bias = bias ? *bias : Tensor4<T>();
  cache.bias_grad = bias != nullptr && options.bias_requires_grad;
  cache.path = call.path;
  cache.tile_rows = options.tile_rows;
  cache.tile_keys = options.tile_keys;
  cache.score_program = options.score_program;
  cache.program_params.clear();
  for (const auto& values : options.program_params) {
    cache.program_params.emplace_back(values.begin(), values.end());
  }
  cache.program_grad = options.score_program && !options.program_params.empty() &&
                       options.program_params_require_grad;
  cache.block_mask = options.block_mask;
  cache.mask_program =
      options.block_mask ? options.block_mask->program_ptr() : options.mask_program;
  if (cache.mask_program && !cache.block_mask && cache.path == SdpaPath::fused) {
    cache.block_mask = std::make_shared<const attention::BlockMask>(attention::build_block_mask(
        cache.mask_program, call.spec, options.tile_rows, options.tile_keys));
  }
}

template <class T>
ProgramBinding<T>::ProgramBinding(const SdpaCache<T>& cache, AttentionParams<T>& p) {
  if (!cache.has_program()) return;
  for (const auto& values : cache.program_params) {
    values_.push_back(values.data());
    sizes_.push_back(values.size());
    width_ += values.size();
  }
  args_ = {values_.data(), sizes_.data(), values_.size(), &status_};
  p.score_program = cache.score_program.get();
  p.mask_program = cache.mask_program.get();
  p.block_mask = cache.path == SdpaPath::fused ? cache.block_mask.get() : nullptr;
  p.program_args = &args_;
}

template <class T>
void ProgramBinding<T>::rethrow(std::string_view op) const {
  if (status_.failed()) throw std::invalid_argument(std::string(op) + ": " + status_.message());
}

template <class T>
void check_sdpa_backward_inputs(std::string_view op, const Tensor4<T>& dout,
                                const SdpaCache<T>& cache, const Tensor4<T>& q, const Tensor4<T>& k,
                                const Tensor4<T>& v) {
  const AttentionSpec& s = cache.spec;
  const bool fused = cache.path == SdpaPath::fused;
  if (s.Tq == 0 ||
      (fused ? cache.lse.size() == 0 || cache.out.size() == 0 : !cache.has_weights())) {
    throw std::logic_error(std::string(op) +
                           ": the cache is empty: call sdpa_forward or sdpa_forward_cuda first");
  }
  const auto extent = [](std::size_t x) { return static_cast<std::ptrdiff_t>(x); };
  if (cache.has_bias()) {
    const auto& b = cache.bias.shape();
    check_arg(
        (b[0] == 1 || b[0] == s.B) && (b[1] == 1 || b[1] == s.H) && b[2] == s.Tq && b[3] == s.Tk,
        op, "cache.bias", "a bias that broadcasts to the cached call", format_shape_of(b));
  }
  check_shape(op, "dout", dout, {extent(s.B), extent(s.H), extent(s.Tq), extent(s.Dv)});
  check_shape(op, "q", q, {extent(s.B), extent(s.H), extent(s.Tq), extent(s.D)});
  check_shape(op, "k", k, {extent(s.B), extent(s.Hkv), extent(s.Tk), extent(s.D)});
  check_shape(op, "v", v, {extent(s.B), extent(s.Hkv), extent(s.Tk), extent(s.Dv)});
}

template <class T>
void sum_dscale(SdpaGrads<T>& g, const std::vector<T>& dscale_part, std::size_t H) {
  g.dscale.fill(T(0));
  for (std::size_t bh = 0; bh < dscale_part.size(); ++bh) {
    g.dscale(bh % H) += dscale_part[bh];  // fixed order: deterministic
  }
}

template <class T>
Tensor4<T>& dscores_for(SdpaGrads<T>& g, Tensor4<T>& scratch, const SdpaCache<T>& cache) {
  const AttentionSpec& s = cache.spec;
  const std::array<std::size_t, 4> full{s.B, s.H, s.Tq, s.Tk};
  const bool broadcast = cache.bias.shape()[0] != s.B || cache.bias.shape()[1] != s.H;
  Tensor4<T>& ds = broadcast ? scratch : g.dbias;
  ds = xt::zeros<T>(full);  // the fused paths skip hidden tiles
  return ds;
}

}  // namespace detail

template <class T>
Tensor4<T> sum_to_bias_shape(const Tensor4<T>& dscores,
                             const std::array<std::size_t, 4>& bias_shape) {
  const auto& s = dscores.shape();
  if ((bias_shape[0] != 1 && bias_shape[0] != s[0]) ||
      (bias_shape[1] != 1 && bias_shape[1] != s[1]) || bias_shape[2] != s[2] ||
      bias_shape[3] != s[3]) {
    throw ShapeError("sum_to_bias_shape", "bias_shape",
                     {static_cast<std::ptrdiff_t>(s[0]), static_cast<std::ptrdiff_t>(s[1]),
                      static_cast<std::ptrdiff_t>(s[2]), static_cast<std::ptrdiff_t>(s[3])},
                     {bias_shape.begin(), bias_shape.end()},
                     "or extent 1 on the batch and head axes");
  }
  Tensor4<T> out = xt::zeros<T>(bias_shape);
  const std::size_t slice = s[2] * s[3];
  const bool batch = bias_shape[0] != 1, heads = bias_shape[1] != 1;
  for (std::size_t b = 0; b < s[0]; ++b) {  // fixed order: deterministic
    for (std::size_t h = 0; h < s[1]; ++h) {
      const T* src = dscores.data() + (b * s[1] + h) * slice;
      T* dst = out.data() + ((batch ? b : 0) * bias_shape[1] + (heads ? h : 0)) * slice;
      for (std::size_t e = 0; e < slice; ++e) dst[e] += src[e];
    }
  }
  return out;
}

template <class T>
Tensor4<T> sdpa_scores(const Tensor4<T>& q, const Tensor4<T>& k, const SdpaOptions& options,
                       const KeyMask* key_mask, const Tensor4<T>* bias) {
  SdpaCache<T> c;
  detail::fill_sdpa_cache(
      c, detail::check_sdpa_inputs<T>("sdpa_scores", q, k, nullptr, options, key_mask, bias),
      options, key_mask, bias);
  Tensor4<T> scores({c.spec.B, c.spec.H, c.spec.Tq, c.spec.Tk});
  c.path = SdpaPath::reference;  // no block mask: every position is scored
  AttentionParams<T> p = c.params(q.data(), k.data(), nullptr);
  const detail::ProgramBinding<T> programs(c, p);
  detail::sdpa_reference_scores(scores.data(), p);
  programs.rethrow("sdpa_scores");
  return scores;
}

template <class T>
Tensor4<T> sdpa_forward(SdpaCache<T>& cache, const Tensor4<T>& q, const Tensor4<T>& k,
                        const Tensor4<T>& v, const SdpaOptions& options, const KeyMask* key_mask,
                        const Tensor4<T>* bias) {
  const SdpaCall call =
      detail::check_sdpa_inputs<T>("sdpa_forward", q, k, &v, options, key_mask, bias);
  detail::fill_sdpa_cache(cache, call, options, key_mask, bias);
  const AttentionSpec& spec = call.spec;
  AttentionParams<T> p = cache.params(q.data(), k.data(), v.data());
  const detail::ProgramBinding<T> programs(cache, p);
  Tensor4<T> out({spec.B, spec.H, spec.Tq, spec.Dv});
  // The saved tensors keep their memory from one call to the next of the same shape.
  if (cache.path == SdpaPath::fused) {
    cache.p = Tensor4<T>();  // not materialised: has_weights() is false
    cache.lse.resize({spec.B, spec.H, spec.Tq});
    detail::sdpa_fused_forward(out.data(), cache.lse.data(), p, cache.tile_rows, cache.tile_keys);
    cache.out = out;
  } else {
    cache.out = Tensor4<T>();
    cache.lse = Tensor3<T>();
    cache.p.resize({spec.B, spec.H, spec.Tq, spec.Tk});
    detail::sdpa_reference_forward(out.data(), cache.p.data(), p);
  }
  programs.rethrow("sdpa_forward");
  return out;
}

template <class T>
Tensor4<T> sdpa_forward(SdpaCache<T>& cache, const xt::xarray<T>& q, const xt::xarray<T>& k,
                        const xt::xarray<T>& v, const SdpaOptions& options, const KeyMask* key_mask,
                        const Tensor4<T>* bias) {
  constexpr auto any = kAnyExtent;
  const auto shape_of = [](const xt::xarray<T>& t) {
    return std::vector<std::size_t>(t.shape().begin(), t.shape().end());
  };
  check_extents("sdpa_forward", "q", shape_of(q), {any, any, any, any});
  check_extents("sdpa_forward", "k", shape_of(k), {any, any, any, any});
  check_extents("sdpa_forward", "v", shape_of(v), {any, any, any, any});
  return sdpa_forward<T>(cache, Tensor4<T>(q), Tensor4<T>(k), Tensor4<T>(v), options, key_mask,
                         bias);
}

template <class T>
SdpaGrads<T> sdpa_backward(const Tensor4<T>& dout, const SdpaCache<T>& cache, const Tensor4<T>& q,
                           const Tensor4<T>& k, const Tensor4<T>& v) {
  detail::check_sdpa_backward_inputs("sdpa_backward", dout, cache, q, k, v);
  const AttentionSpec& s = cache.spec;
  AttentionParams<T> p = cache.params(q.data(), k.data(), v.data());
  SdpaGrads<T> g{Tensor4<T>({s.B, s.H, s.Tq, s.D}),
                 Tensor4<T>({s.B, s.Hkv, s.Tk, s.D}),
                 Tensor4<T>({s.B, s.Hkv, s.Tk, s.Dv}),
                 Tensor1<T>::from_shape({s.H}),
                 {},
                 {}};
  Tensor4<T> scratch;  // dS (B,H,Tq,Tk) when the bias broadcasts
  if (cache.bias_grad) p.dscores = detail::dscores_for(g, scratch, cache).data();
  const detail::ProgramBinding<T> programs(cache, p);
  std::vector<T> program_grads;  // (B·Hkv, Σ parameter sizes): one row per K/V slice
  if (cache.program_grad) {
    program_grads.assign(s.B * s.Hkv * programs.width(), T(0));
    p.program_grads = program_grads.data();
    p.program_grad_width = programs.width();
  }
  std::vector<T> dscale_part(s.B * s.H);
  if (cache.path == SdpaPath::fused) {
    detail::sdpa_fused_backward(g.dq.data(), g.dk.data(), g.dv.data(), dscale_part.data(),
                                dout.data(), cache.out.data(), cache.lse.data(), p, cache.tile_rows,
                                cache.tile_keys);
  } else {
    detail::sdpa_reference_backward(g.dq.data(), g.dk.data(), g.dv.data(), dscale_part.data(),
                                    dout.data(), cache.p.data(), p);
  }
  programs.rethrow("sdpa_backward");
  detail::sum_dscale(g, dscale_part, s.H);
  if (cache.program_grad) {  // the slices' rows in order: deterministic
    std::size_t offset = 0;
    for (const auto& values : cache.program_params) {
      Tensor1<T> grad = Tensor1<T>::from_shape({values.size()});
      grad.fill(T(0));
      for (std::size_t slice = 0; slice < s.B * s.Hkv; ++slice) {
        const T* row = program_grads.data() + slice * programs.width() + offset;
        for (std::size_t e = 0; e < values.size(); ++e) grad(e) += row[e];
      }
      g.dprogram.push_back(std::move(grad));
      offset += values.size();
    }
  }
  if (scratch.size() != 0) {
    const auto& b = cache.bias.shape();
    g.dbias = sum_to_bias_shape(scratch, {b[0], b[1], b[2], b[3]});
  }
  return g;
}

template <class T>
Tensor4<T> sdpa_weights(const Tensor4<T>& q, const Tensor4<T>& k, const SdpaOptions& options,
                        const KeyMask* key_mask, const Tensor4<T>* bias) {
  Tensor4<T> p = sdpa_scores(q, k, options, key_mask, bias);  // hidden positions at -inf
  const std::size_t Tk = p.shape()[3];
  softmax_rows_forward(p.data(), p.data(), p.size() / Tk, Tk);  // P = softmax(S), in place
  return p;
}

#define ATTNLAB_INSTANTIATE_SDPA(T)                                                                \
  template Tensor4<T> sdpa_scores<T>(const Tensor4<T>&, const Tensor4<T>&, const SdpaOptions&,     \
                                     const KeyMask*, const Tensor4<T>*);                           \
  template Tensor4<T> sdpa_forward<T>(SdpaCache<T>&, const Tensor4<T>&, const Tensor4<T>&,         \
                                      const Tensor4<T>&, const SdpaOptions&, const KeyMask*,       \
                                      const Tensor4<T>*);                                          \
  template Tensor4<T> sdpa_forward<T>(SdpaCache<T>&, const xt::xarray<T>&, const xt::xarray<T>&,   \
                                      const xt::xarray<T>&, const SdpaOptions&, const KeyMask*,    \
                                      const Tensor4<T>*);                                          \
  template Tensor4<T> sdpa_weights<T>(const Tensor4<T>&, const Tensor4<T>&, const SdpaOptions&,    \
                                      const KeyMask*, const Tensor4<T>*);                          \
  template Tensor4<T> sum_to_bias_shape<T>(const Tensor4<T>&, const std::array<std::size_t, 4>&);  \
  template Tensor4<T>& detail::dscores_for<T>(SdpaGrads<T>&, Tensor4<T>&, const SdpaCache<T>&);    \
  template SdpaGrads<T> sdpa_backward<T>(const Tensor4<T>&, const SdpaCache<T>&,                   \
                                         const Tensor4<T>&, const Tensor4<T>&, const Tensor4<T>&); \
  template SdpaCall detail::check_sdpa_inputs<T>(                                                  \
      std::string_view, const Tensor4<T>&, const Tensor4<T>&, const Tensor4<T>*,                   \
      const SdpaOptions&, const KeyMask*, const Tensor4<T>*);                                      \
  template void detail::fill_sdpa_cache<T>(SdpaCache<T>&, const SdpaCall&, const SdpaOptions&,     \
                                           const KeyMask*, const Tensor4<T>*);                     \
  template void detail::check_sdpa_backward_inputs<T>(std::string_view, const Tensor4<T>&,         \
                                                      const SdpaCache<T>&, const Tensor4<T>&,      \
                                                      const Tensor4<T>&, const Tensor4<T>&);       \
  template void detail::sum_dscale<T>(SdpaGrads<T>&, const std::vector<T>&, std::size_t);          \
  template class detail::ProgramBinding<T>;
ATTNLAB_INSTANTIATE_SDPA(float)
ATTNLAB_INSTANTIATE_SDPA(double)
#undef ATTNLAB_INSTANTIATE_SDPA

}  // namespace attnlab
