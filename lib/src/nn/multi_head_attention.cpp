#include "attnlab/nn/multi_head_attention.hpp"

#include <algorithm>
#include <cassert>
#include <cmath>
#include <string>
#include <vector>

#include "../parallel_rows.hpp"

namespace attnlab {

void AttentionConfig::validate(std::string_view op, const std::string& path) const {
  check_arg(d_model > 0, op, path + "d_model", "> 0", std::to_string(d_model));
  check_arg(heads > 0, op, path + "heads", "> 0", std::to_string(heads));
  const std::string divisible = "divisible by heads (" + std::to_string(heads) + ") when ";
  if (d_k == 0) {
    check_arg(d_model % heads == 0, op, path + "d_model", divisible + "d_k is 0 (derived)",
              std::to_string(d_model));
  }
  if (d_v == 0) {
    check_arg(d_model % heads == 0, op, path + "d_model", divisible + "d_v is 0 (derived)",
              std::to_string(d_model));
  }
  if (kv_heads != 0) {
    check_arg(heads % kv_heads == 0, op, path + "kv_heads",
              "a divisor of heads (" + std::to_string(heads) + "), or 0 (= heads)",
              std::to_string(kv_heads));
  }
  check_arg(dropout >= 0.0 && dropout < 1.0, op, path + "dropout", "a probability in [0, 1)",
            std::to_string(dropout));
  if (rope) rope_dims(op, rope_options(), head_dim_k(), path);
  // The options' rules are resolve_sdpa's: resolve the layer's call once on its own sizes.
  resolve_sdpa(op, sdpa,
               {.B = 1,
                .H = heads,
                .Hkv = key_value_heads(),
                .Tq = 1,
                .Tk = 1,
                .D = head_dim_k(),
                .Dv = head_dim_v()},
               path + "sdpa.");
}

template <class T>
Tensor4<T> split_heads(const Tensor3<T>& x, std::size_t heads) {
  const std::size_t B = x.shape()[0], Tn = x.shape()[1], HD = x.shape()[2], D = HD / heads;
  assert(D * heads == HD);
  Tensor4<T> out({B, heads, Tn, D});
  // One (b, h) slice per task: a pure copy, so the cut does not change the result.
  detail::for_row_chunks(B * heads, Tn * D, [&](std::size_t s0, std::size_t s1, std::size_t) {
    for (std::size_t s = s0; s < s1; ++s) {
      const std::size_t b = s / heads, h = s % heads;
      for (std::size_t t = 0; t < Tn; ++t) {
        const T* src = x.data() + (b * Tn + t) * HD + h * D;  // x[b, t, h·D : (h+1)·D]
        std::copy(src, src + D, out.data() + (s * Tn + t) * D);
      }
    }
  });
  return out;
}

template <class T>
Tensor3<T> merge_heads(const Tensor4<T>& x) {
  const std::size_t B = x.shape()[0], H = x.shape()[1], Tn = x.shape()[2], D = x.shape()[3];
  Tensor3<T> out({B, Tn, H * D});
  detail::for_row_chunks(B * H, Tn * D, [&](std::size_t s0, std::size_t s1, std::size_t) {
    for (std::size_t s = s0; s < s1; ++s) {
      const std::size_t b = s / H, h = s % H;
      for (std::size_t t = 0; t < Tn; ++t) {
        const T* src = x.data() + (s * Tn + t) * D;
        std::copy(src, src + D, out.data() + (b * Tn + t) * H * D + h * D);
      }
    }
  });
  return out;
}

template <class T>
MultiHeadAttention<T>::MultiHeadAttention(const AttentionConfig& config, Rng& rng)
    : config_(config) {
  config_.validate();
  H_ = config_.heads;
  Hkv_ = config_.key_value_heads();
  D_ = config_.head_dim_k();
  Dv_ = config_.head_dim_v();
  if (config_.rope) rope_dims_ = rope_dims("MultiHeadAttention", config_.rope_options(), D_);
  const std::size_t C = config_.d_model, Cc = config_.context_dim();
  const auto fan_in_std = [](std::size_t n) { return 1.0 / std::sqrt(double(n)); };
  w_q = make_parameter<T>(randn<T, 2>({C, H_ * D_}, rng, fan_in_std(C)));
  w_k = make_parameter<T>(randn<T, 2>({Cc, Hkv_ * D_}, rng, fan_in_std(Cc)));
  w_v = make_parameter<T>(randn<T, 2>({Cc, Hkv_ * Dv_}, rng, fan_in_std(Cc)));
  w_o = make_parameter<T>(randn<T, 2>({H_ * Dv_, C}, rng, fan_in_std(H_ * Dv_)));
  if (config_.qk_norm) {
    q_norm_gamma = make_parameter<T>(xt::ones<T>({D_}));
    q_norm_beta = make_parameter<T>(xt::zeros<T>({D_}));
    k_norm_gamma = make_parameter<T>(xt::ones<T>({D_}));
    k_norm_beta = make_parameter<T>(xt::zeros<T>({D_}));
  }
  if (config_.learnable_scale) {
    // Initialised from the chosen mode (or explicit scale): log s.
    const double s = resolve_scale(config_.sdpa, D_);
    log_scale = make_parameter<T>(xt::xarray<T>(xt::ones<T>({H_}) * T(std::log(s))));
  }
}

template <class T>
void MultiHeadAttention<T>::collect_parameters(const std::string& prefix, ParameterList<T>& out) {
  out.push_back({prefix + "w_q", &w_q});
  out.push_back({prefix + "w_k", &w_k});
  out.push_back({prefix + "w_v", &w_v});
  out.push_back({prefix + "w_o", &w_o});
  if (config_.qk_norm) {
    out.push_back({prefix + "q_norm.gamma", &q_norm_gamma});
    out.push_back({prefix + "q_norm.beta", &q_norm_beta});
    out.push_back({prefix + "k_norm.gamma", &k_norm_gamma});
    out.push_back({prefix + "k_norm.beta", &k_norm_beta});
  }
  if (config_.learnable_scale) out.push_back({prefix + "log_scale", &log_scale});
  for (std::size_t k = 0; k < program_params_.size(); ++k) {
    out.push_back({prefix + "program." + program_names_[k], program_params_[k].get()});
  }
}

template <class T>
void MultiHeadAttention<T>::reset_cache() {
  SequenceModule<T>::reset_cache();
  last_ = Context();
  fixed_scale_ = alibi_ = rope_cos_ = rope_sin_ = Buffer<T>();  // uploaded again on the next
  rope_positions_ = 0;                                          // backend
}

template <class T>
SdpaOptions MultiHeadAttention<T>::layer_options() const {
  SdpaOptions options = config_.sdpa;
  if (config_.alibi) options.alibi_slopes = alibi_slopes(H_);
  return options;
}

template <class T>
SdpaOptions MultiHeadAttention<T>::sdpa_options() const {
  SdpaOptions options = layer_options();
  if (config_.learnable_scale) {
    std::vector<T> log_s(H_);
    if (log_scale.on_device()) {
      log_scale.device_value.copy_to_host(log_s.data());
    } else {
      std::copy(log_scale.value_data(), log_scale.value_data() + H_, log_s.begin());
    }
    options.head_scale.resize(H_);
    for (std::size_t h = 0; h < H_; ++h) options.head_scale[h] = std::exp(double(log_s[h]));
  }
  return options;
}

template <class T>
std::vector<double> MultiHeadAttention<T>::head_scales() const {
  const SdpaOptions options = sdpa_options();
  if (!options.head_scale.empty()) return options.head_scale;
  return std::vector<double>(H_, resolve_scale(options, D_));
}

template <class T>
SdpaOptions MultiHeadAttention<T>::options_of(const Context& ctx) const {
  SdpaOptions options = ctx.options_;
  options.dropout_p = 0;  // inspection: the weights before dropout
  options.dropout_seed = 0;
  const std::vector<T> scales = ctx.scale_.to_vector();
  options.head_scale.assign(scales.begin(), scales.end());
  return options;
}

namespace {
template <class T>
Tensor4<T> heads_to_host(const Buffer<T>& b, std::size_t B, std::size_t H, std::size_t Tn,
                         std::size_t D) {
  if (b.empty()) return Tensor4<T>();
  Tensor4<T> out({B, H, Tn, D});
  b.copy_to_host(out.data());
  return out;
}

}  // namespace

template <class T>
KeyMask MultiHeadAttention<T>::mask_to_host(const Buffer<unsigned char>& mask) {
  KeyMask out({mask.dim(0), mask.dim(1)});
  const std::vector<unsigned char> bytes = mask.to_vector();
  for (std::size_t i = 0; i < bytes.size(); ++i) out.data()[i] = bytes[i] != 0;
  return out;
}

template <class T>
Tensor4<T> MultiHeadAttention<T>::queries(const Context& ctx) const {
  return heads_to_host(ctx.q_, ctx.spec_.B, H_, ctx.spec_.Tq, D_);
}

template <class T>
Tensor4<T> MultiHeadAttention<T>::keys(const Context& ctx) const {
  return heads_to_host(ctx.k_, ctx.spec_.B, Hkv_, ctx.spec_.Tk, D_);
}

template <class T>
Tensor4<T> MultiHeadAttention<T>::attention_weights(const Context& ctx) const {
  if (ctx.empty()) return Tensor4<T>();
  if (ctx.program_ && ctx.sdpa_.has_weights()) return ctx.sdpa_.p;
  if (!ctx.fused_ && !ctx.p_.empty()) {  // kept by the reference path (a program's on a device)
    return heads_to_host(ctx.p_, ctx.spec_.B, H_, ctx.spec_.Tq, ctx.spec_.Tk);
  }
  const KeyMask mask = ctx.mask_.empty() ? KeyMask() : mask_to_host(ctx.mask_);
  return sdpa_weights<T>(queries(ctx), keys(ctx), options_of(ctx),
                         ctx.mask_.empty() ? nullptr : &mask);
}

template <class T>
Tensor4<T> MultiHeadAttention<T>::attention_scores(const Context& ctx) const {
  if (ctx.empty()) {
    throw std::logic_error("MultiHeadAttention::attention_scores: called before forward");
  }
  const KeyMask mask = ctx.mask_.empty() ? KeyMask() : mask_to_host(ctx.mask_);
  return sdpa_scores<T>(queries(ctx), keys(ctx), options_of(ctx),
                        ctx.mask_.empty() ? nullptr : &mask);
}

template <class T>
AttentionParams<T> MultiHeadAttention<T>::params(const Context& ctx) const {
  return attention_params<T>(ctx.spec_, ctx.q_.data(), ctx.k_.data(), ctx.v_.data(),
                             ctx.scale_.data(), alibi_.empty() ? nullptr : alibi_.data(),
                             ctx.mask_.empty() ? nullptr : ctx.mask_.data());
}

// The forward, step by step: resolve the call, project (and QK-normalise) q, k, v, bind the
// scales, run the core, project the heads out.
template <class T>
Buffer<T> MultiHeadAttention<T>::attend(Context& ctx, const Buffer<T>& x, const Buffer<T>& context,
                                        const Buffer<unsigned char>* key_mask, bool self,
                                        KVCache<T>* cache, const SequenceLayout* layout) {
  if (self) {
    check_arg(config_.context_dim() == config_.d_model, "MultiHeadAttention", "self-attention",
              "d_context = d_model (" + std::to_string(config_.d_model) + ")",
              std::to_string(config_.context_dim()));
  }
  check_arg(self || !config_.rope, "MultiHeadAttention", "rope",
            "self-attention (queries and keys at positions of one sequence)", "cross-attention");
  // With a cache: the Tq new tokens follow its `past` ones; their keys and values are appended.
  const std::size_t past = cache ? cache->length : 0;
  const std::size_t B = x.dim(0), Tq = x.dim(1), Tk = cache ? past + Tq : context.dim(1);
  if (key_mask) {
    check_buffer("sdpa_forward", "key_mask", *key_mask, this->ops(),
                 {static_cast<std::ptrdiff_t>(B), static_cast<std::ptrdiff_t>(Tk)});
  }
  check_arg(self || !layout, "MultiHeadAttention", "layout",
            "none for cross-attention (a layout describes one sequence)", "a layout");
  ctx.valid_ = false;  // until the forward completes
  resolve_call(ctx, B, Tq, Tk, cache, layout);
  ctx.self_ = self;
  ctx.x_ = x;
  ctx.context_ = context;
  ctx.mask_ = key_mask ? *key_mask : Buffer<unsigned char>();
  project_qkv(ctx, cache ? Tq : Tk, cache);
  bind_scales(ctx);
  core_forward(ctx);
  Buffer<T> y = project_out(ctx);
  ctx.valid_ = true;
  return y;
}

// The options of this call (the layer's, the cache's offset, dropout in training), resolved by
// the op's one translator, and the path the backend runs.
template <class T>
void MultiHeadAttention<T>::resolve_call(Context& ctx, std::size_t B, std::size_t Tq,
                                         std::size_t Tk, KVCache<T>* cache,
                                         const SequenceLayout* layout) {
  SdpaOptions options = layer_options();
  if (cache) options.query_offset += cache->length;         // bottom-right causal
  if (this->training() && config_.dropout > 0 && !cache) {  // the backward regenerates the mask
    options.dropout_p = config_.dropout;
    options.dropout_seed = this->next_dropout_key();
  }
  bind_programs(ctx, options, B, Tq, Tk, cache, layout);
  const AttentionSizes sizes{.B = B, .H = H_, .Hkv = Hkv_, .Tq = Tq, .Tk = Tk, .D = D_, .Dv = Dv_};
  if (options.block_mask) options.block_mask->check_matches(sizes, "MultiHeadAttention");
  const SdpaCall call = resolve_sdpa("sdpa_forward", options, sizes);
  ctx.options_ = options;
  ctx.spec_ = call.spec;
  ctx.cached_ = cache != nullptr;
  ctx.fused_ = call.path == SdpaPath::fused;
  if (ctx.program_) {
    // the host op's CPU paths take any head dims
  } else if (ctx.fused_ && config_.sdpa.path != SdpaPath::fused) {
    try {  // automatic: the fused path when the backend's kernels take these head dims
      this->ops().check_fused(D_, Dv_);
    } catch (const std::invalid_argument&) {
      ctx.fused_ = false;
    }
  } else if (ctx.fused_) {
    this->ops().check_fused(D_, Dv_);
  } else if (config_.sdpa.path == SdpaPath::automatic && this->ops().fused_preferred(D_, Dv_)) {
    ctx.fused_ = true;  // a backend whose fused kernels win at every length (tensor cores)
  }
  if (fixed_scale_.empty() && !config_.learnable_scale) {  // constants, uploaded once per backend
    const std::vector<T> s(call.scale.begin(), call.scale.end());
    fixed_scale_ = Buffer<T>::from_host(this->ops(), s.data(), {H_});
  }
  if (alibi_.empty() && !call.alibi.empty()) {
    const std::vector<T> slopes(call.alibi.begin(), call.alibi.end());
    alibi_ = Buffer<T>::from_host(this->ops(), slopes.data(), {H_});
  }
}

// x W_q, context W_k, context W_v split into heads (B,H,T,·), then QK-norm over D per head, then
// RoPE. With a cache, Tnew = Tq new keys and values are appended and the core reads the cache's.
template <class T>
void MultiHeadAttention<T>::project_qkv(Context& ctx, std::size_t Tnew, KVCache<T>* cache) {
  DeviceOps<T>& ops = this->ops();
  const std::size_t B = ctx.spec_.B, Tq = ctx.spec_.Tq;
  const std::size_t C = config_.d_model, Cc = config_.context_dim();
  const std::size_t Nq = B * Tq, Nk = B * Tnew;
  Buffer<T>& proj = Buffer<T>::reuse(proj_, ops, {std::max(Nq, Nk) * H_ * std::max(D_, Dv_)});
  Buffer<T>& q = Buffer<T>::reuse(ctx.q_, ops, {B, H_, Tq, D_});
  if (cache) ctx.k_ = ctx.v_ = Buffer<T>();  // they were the cache's: never write there
  Buffer<T>& k = Buffer<T>::reuse(ctx.k_, ops, {B, Hkv_, Tnew, D_});
  Buffer<T>& v = Buffer<T>::reuse(ctx.v_, ops, {B, Hkv_, Tnew, Dv_});
  const bool norm = config_.qk_norm;
  OperandKeep* keep = &ctx.keep_;  // x read once by all three projections, kept for the backward
  keep->clear();
  // x W into heads (B,H,T,·); with one head the layouts agree and the projection writes there.
  const auto project = [&](T* heads, std::size_t n_heads, const T* in, const T* w, std::size_t rows,
                           std::size_t Tn, std::size_t width_in, std::size_t d) {
    if (n_heads == 1)
      return ops.linear_forward(heads, in, w, nullptr, rows, width_in, d, false, keep);
    ops.linear_forward(proj.data(), in, w, nullptr, rows, width_in, n_heads * d, false, keep);
    ops.split_heads(heads, proj.data(), B, Tn, n_heads, d);
  };
  project(norm ? Buffer<T>::reuse(ctx.q_raw_, ops, q.shape()).data() : q.data(), H_, ctx.x_.data(),
          w_q.value_data(), Nq, Tq, C, D_);
  project(norm ? Buffer<T>::reuse(ctx.k_raw_, ops, k.shape()).data() : k.data(), Hkv_,
          ctx.context_.data(), w_k.value_data(), Nk, Tnew, Cc, D_);
  project(v.data(), Hkv_, ctx.context_.data(), w_v.value_data(), Nk, Tnew, Cc, Dv_);
  if (norm) {
    const T eps = static_cast<T>(kLayerNormEps);
    const std::size_t rq = B * H_ * Tq, rk = B * Hkv_ * Tnew;
    ops.layernorm_forward(q.data(), Buffer<T>::reuse(ctx.q_mean_, ops, {rq}).data(),
                          Buffer<T>::reuse(ctx.q_rstd_, ops, {rq}).data(), ctx.q_raw_.data(),
                          q_norm_gamma.value_data(), q_norm_beta.value_data(), rq, D_, eps);
    ops.layernorm_forward(k.data(), Buffer<T>::reuse(ctx.k_mean_, ops, {rk}).data(),
                          Buffer<T>::reuse(ctx.k_rstd_, ops, {rk}).data(), ctx.k_raw_.data(),
                          k_norm_gamma.value_data(), k_norm_beta.value_data(), rk, D_, eps);
  }
  if (config_.rope) {  // the new tokens sit at positions past .. past + T - 1
    const std::size_t past = cache ? cache->length : 0;
    rotate_heads(ctx, q.data(), H_, Tq, past, false);
    rotate_heads(ctx, k.data(), Hkv_, Tnew, past, false);
  }
  if (cache) {
    cache->append(ops, k, v);
    ctx.k_ = cache->k;
    ctx.v_ = cache->v;
  }
}

template <class T>
void MultiHeadAttention<T>::rotate(T* x, std::size_t slices, std::size_t Tn, std::size_t offset,
                                   bool inverse) {
  DeviceOps<T>& ops = this->ops();
  if (offset + Tn > rope_positions_) {  // the table's rows do not depend on its length
    const std::size_t positions = std::max(offset + Tn, 2 * rope_positions_);
    const RopeTable table = rope_table(config_.rope_options(), D_, positions);
    const std::vector<T> c(table.cos.begin(), table.cos.end());
    const std::vector<T> s(table.sin.begin(), table.sin.end());
    rope_cos_ = Buffer<T>::from_host(ops, c.data(), {positions, table.half});
    rope_sin_ = Buffer<T>::from_host(ops, s.data(), {positions, table.half});
    rope_positions_ = positions;
  }
  ops.rope(x, rope_cos_.data(), rope_sin_.data(),
           {.slices = slices,
            .Tn = Tn,
            .D = D_,
            .rot = rope_dims_,
            .offset = offset,
            .interleaved = config_.rope_interleaved,
            .inverse = inverse});
}

// The scale of each head: exp(log_scale) of this forward, or the layer's fixed one.
template <class T>
void MultiHeadAttention<T>::bind_scales(Context& ctx) {
  if (config_.learnable_scale) {
    if (ctx.scale_.data() == fixed_scale_.data()) ctx.scale_ = Buffer<T>();
    this->ops().exp(Buffer<T>::reuse(ctx.scale_, this->ops(), {H_}).data(), log_scale.value_data(),
                    H_);
  } else {
    ctx.scale_ = fixed_scale_;
  }
}

template <class T>
void MultiHeadAttention<T>::core_forward(Context& ctx) {
  DeviceOps<T>& ops = this->ops();
  const AttentionSpec& s = ctx.spec_;
  if (H_ == 1) ctx.merged_ = Buffer<T>();  // it shares o's storage: let o's buffer be reused
  Buffer<T>& o = Buffer<T>::reuse(ctx.o_, ops, {s.B, H_, s.Tq, Dv_});
  if (ctx.program_) {
    program_forward(ctx);
  } else if (ctx.fused_) {
    ctx.p_ = Buffer<T>();
    ops.sdpa_fused_forward(o.data(), Buffer<T>::reuse(ctx.lse_, ops, {s.B, H_, s.Tq}).data(),
                           params(ctx));
  } else {
    ctx.lse_ = Buffer<T>();
    ops.sdpa_reference_forward(
        o.data(), Buffer<T>::reuse(ctx.p_, ops, {s.B, H_, s.Tq, s.Tk}).data(), params(ctx));
  }
}

// (B,H,Tq,Dv) -> (B,Tq,H·Dv) x (H·Dv,C) -> (B,Tq,C)
template <class T>
Buffer<T> MultiHeadAttention<T>::project_out(Context& ctx) {
  DeviceOps<T>& ops = this->ops();
  const std::size_t B = ctx.spec_.B, Tq = ctx.spec_.Tq, HDv = H_ * Dv_;
  if (H_ == 1) {
    ctx.merged_ = ctx.o_.reshaped({B, Tq, HDv});  // one head: the same layout
  } else {
    ops.merge_heads(Buffer<T>::reuse(ctx.merged_, ops, {B, Tq, HDv}).data(), ctx.o_.data(), B, Tq,
                    H_, Dv_);
  }
  Buffer<T>& y = Buffer<T>::reuse(y_, ops, {B, Tq, config_.d_model});
  ops.linear_forward(y.data(), ctx.merged_.data(), w_o.value_data(), nullptr, B * Tq, HDv,
                     config_.d_model, /*w_transposed=*/false, &ctx.keep_);
  return y;
}

template <class T>
Buffer<unsigned char> MultiHeadAttention<T>::upload_mask(const KeyMask* key_mask, std::size_t B,
                                                         std::size_t Tk) {
  if (!key_mask) return Buffer<unsigned char>();
  check_shape("sdpa_forward", "key_mask", *key_mask,
              {static_cast<std::ptrdiff_t>(B), static_cast<std::ptrdiff_t>(Tk)});
  return to_byte_mask(this->ops(), *key_mask);
}

template <class T>
Buffer<T> MultiHeadAttention<T>::forward_impl(const Buffer<T>& x) {
  return attend(last_, x, x, nullptr, true);
}

template <class T>
Buffer<T> MultiHeadAttention<T>::forward(const Buffer<T>& x,
                                         const Buffer<unsigned char>* key_mask) {
  this->check_input(x);
  Buffer<T> y = attend(last_, x, x, key_mask, true);
  this->mark_forward(x.dim(0), x.dim(1));
  return y;
}

template <class T>
Buffer<T> MultiHeadAttention<T>::forward(const Buffer<T>& x, const Buffer<unsigned char>* key_mask,
                                         const SequenceLayout* layout) {
  this->check_input(x);
  Buffer<T> y = attend(last_, x, x, key_mask, true, nullptr, layout);
  this->mark_forward(x.dim(0), x.dim(1));
  return y;
}

template <class T>
Buffer<T> MultiHeadAttention<T>::forward(Context& ctx, const Buffer<T>& x, const Buffer<T>* context,
                                         const Buffer<unsigned char>* key_mask,
                                         const SequenceLayout* layout) {
  this->check_input(x);
  if (context) {
    check_buffer("MultiHeadAttention", "context", *context, this->ops(),
                 {static_cast<std::ptrdiff_t>(x.dim(0)), kAnyExtent,
                  static_cast<std::ptrdiff_t>(config_.context_dim())});
  }
  return attend(ctx, x, context ? *context : x, key_mask, context == nullptr, nullptr, layout);
}

template <class T>
Tensor3<T> MultiHeadAttention<T>::forward(const Tensor3<T>& x, const KeyMask* key_mask) {
  this->check_input(x);
  const Buffer<unsigned char> mask = upload_mask(key_mask, x.shape()[0], x.shape()[1]);
  return to_tensor<T, 3>(forward(to_buffer<T>(this->ops(), x), key_mask ? &mask : nullptr),
                         "MultiHeadAttention");
}

template <class T>
Buffer<T> MultiHeadAttention<T>::forward_cached(const Buffer<T>& x, KVCache<T>& cache) {
  this->check_input(x);
  check_arg(config_.sdpa.causal, "MultiHeadAttention::forward_cached", "sdpa.causal",
            "causal attention (with a KV cache, earlier tokens never see later ones)", "false");
  if (cache.length > 0) {
    check_arg(cache.k.dim(0) == x.dim(0), "MultiHeadAttention::forward_cached", "x (B, T, C)",
              "the cache's batch B = " + std::to_string(cache.k.dim(0)),
              "B = " + std::to_string(x.dim(0)));
  }
  return attend(last_, x, x, nullptr, true, &cache);
}

template <class T>
void KVCache<T>::append(DeviceOps<T>& ops, const Buffer<T>& k_new, const Buffer<T>& v_new) {
  const std::size_t B = k_new.dim(0), Hkv = k_new.dim(1), n = k_new.dim(2), D = k_new.dim(3);
  const std::size_t Dv = v_new.dim(3);
  check_arg(v_new.dim(0) == B && v_new.dim(1) == Hkv && v_new.dim(2) == n, "KVCache::append",
            "v_new", "(B, Hkv, n, Dv) with the keys' B, Hkv, n", format_shape(v_new.shape()));
  if (length > 0) {
    check_arg(k.dim(0) == B && k.dim(1) == Hkv && k.dim(3) == D && v.dim(3) == Dv,
              "KVCache::append", "k_new (B, Hkv, n, D)",
              "(" + std::to_string(k.dim(0)) + ", " + std::to_string(k.dim(1)) + ", n, " +
                  std::to_string(k.dim(3)) + ") as cached, Dv " + std::to_string(v.dim(3)),
              format_shape(k_new.shape()) + ", Dv " + std::to_string(Dv));
  }
  const std::size_t total = length + n;
  if (total > capacity_) capacity_ = std::max(total, 2 * capacity_);
  const int next = 1 - current_;
  const auto grow = [&](Buffer<T>* slots, const Buffer<T>& old, const Buffer<T>& add,
                        std::size_t d) {
    Buffer<T>& slot = Buffer<T>::reuse(slots[next], ops, {B * Hkv * capacity_ * d});
    Buffer<T> out = Buffer<T>::view(slot, 0, {B, Hkv, total, d});
    for (std::size_t bh = 0; bh < B * Hkv; ++bh) {
      if (length > 0) {
        ops.copy(out.data() + bh * total * d, old.data() + bh * length * d, length * d * sizeof(T));
      }
      ops.copy(out.data() + (bh * total + length) * d, add.data() + bh * n * d, n * d * sizeof(T));
    }
    return out;
  };
  Buffer<T> k_out = grow(slots_k_, k, k_new, D);
  Buffer<T> v_out = grow(slots_v_, v, v_new, Dv);
  k = std::move(k_out);
  v = std::move(v_out);
  current_ = next;
  length = total;
}

template <class T>
Buffer<T> MultiHeadAttention<T>::forward_cross(const Buffer<T>& x, const Buffer<T>& context,
                                               const Buffer<unsigned char>* key_mask) {
  this->check_input(x);
  check_buffer("MultiHeadAttention", "context", context, this->ops(),
               {static_cast<std::ptrdiff_t>(x.dim(0)), kAnyExtent,
                static_cast<std::ptrdiff_t>(config_.context_dim())});
  Buffer<T> y = attend(last_, x, context, key_mask, false);
  this->mark_forward(x.dim(0), x.dim(1));
  return y;
}

template <class T>
Tensor3<T> MultiHeadAttention<T>::forward_cross(const Tensor3<T>& x, const Tensor3<T>& context,
                                                const KeyMask* key_mask) {
  this->check_input(x);
  check_shape("MultiHeadAttention", "context", context,
              {static_cast<std::ptrdiff_t>(x.shape()[0]), kAnyExtent,
               static_cast<std::ptrdiff_t>(config_.context_dim())});
  const Buffer<unsigned char> mask = upload_mask(key_mask, x.shape()[0], context.shape()[1]);
  return to_tensor<T, 3>(
      forward_cross(to_buffer<T>(this->ops(), x), to_buffer<T>(this->ops(), context),
                    key_mask ? &mask : nullptr),
      "MultiHeadAttention");
}

template Tensor4<float> split_heads<float>(const Tensor3<float>&, std::size_t);
template Tensor4<double> split_heads<double>(const Tensor3<double>&, std::size_t);
template Tensor3<float> merge_heads<float>(const Tensor4<float>&);
template Tensor3<double> merge_heads<double>(const Tensor4<double>&);
template struct KVCache<float>;
template struct KVCache<double>;
template class MultiHeadAttention<float>;
template class MultiHeadAttention<double>;

}  // namespace attnlab
