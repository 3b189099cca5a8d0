#include "attnlab/nn/multi_head_attention.hpp"

#include <algorithm>
#include <cassert>
#include <cmath>
#include <string>

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
  if (sdpa.scale) {
    check_arg(std::isfinite(*sdpa.scale) && *sdpa.scale > 0, op, path + "sdpa.scale",
              "a finite value > 0", std::to_string(*sdpa.scale));
  }
  if (sdpa.window != 0) {
    check_arg(sdpa.causal, op, path + "sdpa.window",
              "0 without causal (a window bounds causal keys)", std::to_string(sdpa.window));
  }
  check_arg(sdpa.alibi_slopes.empty(), op, path + "sdpa.alibi_slopes",
            "empty (use alibi for the paper's slopes)",
            std::to_string(sdpa.alibi_slopes.size()) + " entries");
  check_arg(dropout >= 0.0 && dropout < 1.0, op, path + "dropout", "a probability in [0, 1)",
            std::to_string(dropout));
  check_arg(sdpa.dropout_p == 0.0, op, path + "sdpa.dropout_p",
            "0 (use dropout: it applies in training mode only)", std::to_string(sdpa.dropout_p));
  check_arg(sdpa.head_scale.empty(), op, path + "sdpa.head_scale",
            "empty (use learnable_scale for per-head scales)",
            std::to_string(sdpa.head_scale.size()) + " entries");
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
}

template <class T>
void MultiHeadAttention<T>::reset_cache() {
  SequenceModule<T>::reset_cache();
  has_forward_ = false;
  x_ = context_ = q_ = k_ = v_ = o_ = p_ = lse_ = scale_ = alibi_ = dcontext_ = Buffer<T>();
  mask_ = Buffer<unsigned char>();
}

template <class T>
SdpaOptions MultiHeadAttention<T>::sdpa_options() const {
  SdpaOptions options = config_.sdpa;
  if (config_.alibi) options.alibi_slopes = alibi_slopes(H_);
  if (config_.learnable_scale) {
    std::vector<T> log_s(H_);
    if (log_scale.on_device()) {
      log_scale.device_value.copy_to_host(log_s.data());
    } else {
      std::copy(log_scale.value.data(), log_scale.value.data() + H_, log_s.begin());
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
SdpaOptions MultiHeadAttention<T>::used_options() const {
  SdpaOptions options = config_.sdpa;
  if (config_.alibi) options.alibi_slopes = alibi_slopes(H_);
  const std::vector<T> scales = scale_.to_vector();
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

KeyMask mask_to_host(const Buffer<unsigned char>& mask) {
  KeyMask out({mask.dim(0), mask.dim(1)});
  const std::vector<unsigned char> bytes = mask.to_vector();
  for (std::size_t i = 0; i < bytes.size(); ++i) out.data()[i] = bytes[i] != 0;
  return out;
}
}  // namespace

template <class T>
Tensor4<T> MultiHeadAttention<T>::queries() const {
  return heads_to_host(q_, spec_.B, H_, spec_.Tq, D_);
}

template <class T>
Tensor4<T> MultiHeadAttention<T>::keys() const {
  return heads_to_host(k_, spec_.B, Hkv_, spec_.Tk, D_);
}

template <class T>
Tensor4<T> MultiHeadAttention<T>::attention_weights() const {
  if (!has_forward_) return Tensor4<T>();
  if (!fused_) return heads_to_host(p_, spec_.B, H_, spec_.Tq, spec_.Tk);
  const KeyMask mask = mask_.empty() ? KeyMask() : mask_to_host(mask_);
  return sdpa_weights<T>(queries(), keys(), used_options(), mask_.empty() ? nullptr : &mask);
}

template <class T>
Tensor4<T> MultiHeadAttention<T>::attention_scores() const {
  if (!has_forward_) {
    throw std::logic_error("MultiHeadAttention::attention_scores: called before forward");
  }
  const KeyMask mask = mask_.empty() ? KeyMask() : mask_to_host(mask_);
  return sdpa_scores<T>(queries(), keys(), used_options(), mask_.empty() ? nullptr : &mask);
}

template <class T>
AttentionParams<T> MultiHeadAttention<T>::params() const {
  AttentionParams<T> a;
  static_cast<AttentionSpec&>(a) = spec_;
  a.q = q_.data();
  a.k = k_.data();
  a.v = v_.data();
  a.scale = scale_.data();
  a.key_mask = mask_.empty() ? nullptr : mask_.data();
  a.alibi_slopes = alibi_.empty() ? nullptr : alibi_.data();
  return a;
}

template <class T>
Buffer<T> MultiHeadAttention<T>::attend(const Buffer<T>& x, const Buffer<T>& context,
                                        const Buffer<unsigned char>* key_mask, bool self,
                                        KVCache<T>* cache) {
  if (self) {
    check_arg(config_.context_dim() == config_.d_model, "MultiHeadAttention", "self-attention",
              "d_context = d_model (" + std::to_string(config_.d_model) + ")",
              std::to_string(config_.context_dim()));
  }
  DeviceOps<T>& ops = this->ops();
  // With a cache: the Tq new tokens follow its `past` ones; their keys and values are appended.
  const std::size_t past = cache ? cache->length : 0;
  const std::size_t B = x.dim(0), Tq = x.dim(1), Tk = cache ? past + Tq : context.dim(1);
  const std::size_t Tnew = cache ? Tq : Tk;  // the keys and values this call projects
  const std::size_t C = config_.d_model, Cc = config_.context_dim();
  if (key_mask) {
    check_buffer("sdpa_forward", "key_mask", *key_mask, ops,
                 {static_cast<std::ptrdiff_t>(B), static_cast<std::ptrdiff_t>(Tk)});
  }
  SdpaOptions options = config_.sdpa;
  if (cache) options.query_offset += static_cast<std::ptrdiff_t>(past);  // bottom-right causal
  spec_ =
      make_attention_spec("sdpa_forward", options,
                          {.B = B, .H = H_, .Hkv = Hkv_, .Tq = Tq, .Tk = Tk, .D = D_, .Dv = Dv_});
  cached_ = cache != nullptr;
  if (this->training() && config_.dropout > 0 &&
      !cache) {  // the backward regenerates the mask from spec_
    spec_.dropout_p = config_.dropout;
    spec_.dropout_seed = this->next_dropout_key();
  }
  fused_ = resolve_sdpa_path(config_.sdpa.path, Tk, config_.sdpa.causal) == SdpaPath::fused;
  if (fused_ && config_.sdpa.path != SdpaPath::fused) {
    try {  // automatic: the fused path when the backend's kernels take these head dims
      ops.check_fused(D_, Dv_);
    } catch (const std::invalid_argument&) {
      fused_ = false;
    }
  } else if (fused_) {
    ops.check_fused(D_, Dv_);
  }
  self_ = self;
  x_ = x;
  context_ = context;
  mask_ = key_mask ? *key_mask : Buffer<unsigned char>();
  const std::size_t HD = H_ * D_, HDv = H_ * Dv_, Nq = B * Tq, Nk = B * Tnew;
  // Projections, split into heads (B,H,T,·); QK-norm over D per head. With a cache, k and v hold
  // the new tokens' keys and values until they are appended to it.
  Buffer<T>& proj = Buffer<T>::reuse(proj_, ops, {std::max(Nq, Nk) * std::max(HD, HDv)});
  Buffer<T>& q = Buffer<T>::reuse(q_, ops, {B, H_, Tq, D_});
  if (cache) k_ = v_ = Buffer<T>();  // they were the cache's: never write there
  Buffer<T>& k = Buffer<T>::reuse(k_, ops, {B, Hkv_, Tnew, D_});
  Buffer<T>& v = Buffer<T>::reuse(v_, ops, {B, Hkv_, Tnew, Dv_});
  const bool norm = config_.qk_norm;
  // x W into heads (B,H,T,·); with one head the layouts agree and the projection writes there.
  const auto project = [&](T* heads, std::size_t n_heads, const T* in, const T* w, std::size_t rows,
                           std::size_t Tn, std::size_t width_in, std::size_t d) {
    if (n_heads == 1) return ops.linear_forward(heads, in, w, nullptr, rows, width_in, d);
    ops.linear_forward(proj.data(), in, w, nullptr, rows, width_in, n_heads * d);
    ops.split_heads(heads, proj.data(), B, Tn, n_heads, d);
  };
  project(norm ? Buffer<T>::reuse(q_raw_, ops, q.shape()).data() : q.data(), H_, x.data(),
          w_q.value_data(), Nq, Tq, C, D_);
  project(norm ? Buffer<T>::reuse(k_raw_, ops, k.shape()).data() : k.data(), Hkv_, context.data(),
          w_k.value_data(), Nk, Tnew, Cc, D_);
  project(v.data(), Hkv_, context.data(), w_v.value_data(), Nk, Tnew, Cc, Dv_);
  if (norm) {
    const T eps = static_cast<T>(kLayerNormEps);
    const std::size_t rq = B * H_ * Tq, rk = B * Hkv_ * Tnew;
    ops.layernorm_forward(q.data(), Buffer<T>::reuse(q_mean_, ops, {rq}).data(),
                          Buffer<T>::reuse(q_rstd_, ops, {rq}).data(), q_raw_.data(),
                          q_norm_gamma.value_data(), q_norm_beta.value_data(), rq, D_, eps);
    ops.layernorm_forward(k.data(), Buffer<T>::reuse(k_mean_, ops, {rk}).data(),
                          Buffer<T>::reuse(k_rstd_, ops, {rk}).data(), k_raw_.data(),
                          k_norm_gamma.value_data(), k_norm_beta.value_data(), rk, D_, eps);
  }
  if (cache) {
    cache->append(ops, k, v);
    k_ = cache->k;
    v_ = cache->v;
  }
  // The scale of each head: exp(log_scale), or the fixed one (uploaded once per backend).
  if (config_.learnable_scale) {
    ops.exp(Buffer<T>::reuse(scale_, ops, {H_}).data(), log_scale.value_data(), H_);
  } else if (scale_.empty()) {
    const std::vector<T> s(H_, static_cast<T>(resolve_scale(config_.sdpa, D_)));
    scale_ = Buffer<T>::from_host(ops, s.data(), {H_});
  }
  if (config_.alibi && alibi_.empty()) {  // the slopes, uploaded once per backend
    const std::vector<double> slopes = alibi_slopes(H_);
    const std::vector<T> values(slopes.begin(), slopes.end());
    alibi_ = Buffer<T>::from_host(ops, values.data(), {H_});
  }
  if (H_ == 1) merged_ = Buffer<T>();  // it shares o's storage: let o's buffer be reused
  Buffer<T>& o = Buffer<T>::reuse(o_, ops, {B, H_, Tq, Dv_});
  if (fused_) {
    p_ = Buffer<T>();
    ops.sdpa_fused_forward(o.data(), Buffer<T>::reuse(lse_, ops, {B, H_, Tq}).data(), params());
  } else {
    lse_ = Buffer<T>();
    ops.sdpa_reference_forward(o.data(), Buffer<T>::reuse(p_, ops, {B, H_, Tq, Tk}).data(),
                               params());
  }
  // (B,H,Tq,Dv) -> (B,Tq,H·Dv) x (H·Dv,C) -> (B,Tq,C)
  if (H_ == 1) {
    merged_ = o.reshaped({B, Tq, HDv});  // one head: the same layout
  } else {
    ops.merge_heads(Buffer<T>::reuse(merged_, ops, {B, Tq, HDv}).data(), o.data(), B, Tq, H_, Dv_);
  }
  const Buffer<T>& merged = merged_;
  Buffer<T>& y = Buffer<T>::reuse(y_, ops, {B, Tq, C});
  ops.linear_forward(y.data(), merged.data(), w_o.value_data(), nullptr, Nq, HDv, C);
  has_forward_ = true;
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
  return attend(x, x, nullptr, true);
}

template <class T>
Buffer<T> MultiHeadAttention<T>::forward(const Buffer<T>& x,
                                         const Buffer<unsigned char>* key_mask) {
  this->check_input(x);
  Buffer<T> y = attend(x, x, key_mask, true);
  this->mark_forward(x.dim(0), x.dim(1));
  return y;
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
  return attend(x, x, nullptr, true, &cache);
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
  Buffer<T> y = attend(x, context, key_mask, false);
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

template <class T>
Buffer<T> MultiHeadAttention<T>::backward_impl(const Buffer<T>& dy) {
  // Exact reverse of attend().
  if (cached_) {
    throw std::logic_error(
        "MultiHeadAttention::backward: the last forward was forward_cached (decoding), which has "
        "no backward; run forward() first");
  }
  DeviceOps<T>& ops = this->ops();
  const std::size_t B = spec_.B, Tq = spec_.Tq, Tk = spec_.Tk;
  const std::size_t C = config_.d_model, Cc = config_.context_dim();
  const std::size_t HD = H_ * D_, HDv = H_ * Dv_, Nq = B * Tq, Nk = B * Tk;
  const auto add_weight_grad = [&](Parameter<T>& p) { add_into(ops, p, dw_); };
  // y = merged W_o
  Buffer<T>& dmerged = Buffer<T>::reuse(dmerged_, ops, {std::max(Nq, Nk) * std::max(HD, HDv)});
  Buffer<T>& dout = Buffer<T>::reuse(dout_, ops, {B, H_, Tq, Dv_});
  ops.linear_backward(H_ == 1 ? dout.data() : dmerged.data(),
                      Buffer<T>::reuse(dw_, ops, {HDv * C}).data(), nullptr, dy.data(),
                      merged_.data(), w_o.value_data(), Nq, HDv, C);
  add_weight_grad(w_o);
  if (H_ != 1) ops.split_heads(dout.data(), dmerged.data(), B, Tq, H_, Dv_);
  Buffer<T>& dq = Buffer<T>::reuse(dq_, ops, {B, H_, Tq, D_});
  Buffer<T>& dk = Buffer<T>::reuse(dk_, ops, {B, Hkv_, Tk, D_});
  Buffer<T>& dv = Buffer<T>::reuse(dv_, ops, {B, Hkv_, Tk, Dv_});
  if (fused_) {
    ops.sdpa_fused_backward(dq.data(), dk.data(), dv.data(),
                            Buffer<T>::reuse(ds_, ops, {B * H_ * Tq}).data(), dout.data(),
                            o_.data(), lse_.data(), params());
  } else {
    ops.sdpa_reference_backward(dq.data(), dk.data(), dv.data(),
                                Buffer<T>::reuse(ds_, ops, {B * H_ * Tq * Tk}).data(), dout.data(),
                                p_.data(), params());
  }
  if (config_.learnable_scale) {
    // s = exp(log s): dL/dlog s_h = s_h · dL/ds_h = Σ q ⊙ dq over head h (as dQ = s · dS K).
    Buffer<T>& dlog = Buffer<T>::reuse(dlog_scale_, ops, {H_});
    ops.head_dot(dlog.data(), q_.data(), dq.data(), B, H_, Tq * D_);
    add_into(ops, log_scale, dlog);
  }
  const T* dq_in = dq.data();
  const T* dk_in = dk.data();
  if (config_.qk_norm) {
    const std::size_t rq = B * H_ * Tq, rk = B * Hkv_ * Tk;
    Buffer<T>& dgamma = Buffer<T>::reuse(dnorm_, ops, {2 * D_});
    const Buffer<T> dbeta = Buffer<T>::view(dgamma, D_, {D_});
    ops.layernorm_backward(Buffer<T>::reuse(dq_raw_, ops, dq.shape()).data(), dgamma.data(),
                           dbeta.data(), dq.data(), q_raw_.data(), q_mean_.data(), q_rstd_.data(),
                           q_norm_gamma.value_data(), rq, D_);
    ops.add(q_norm_gamma.grad_data(), q_norm_gamma.grad_data(), dgamma.data(), D_);
    ops.add(q_norm_beta.grad_data(), q_norm_beta.grad_data(), dbeta.data(), D_);
    ops.layernorm_backward(Buffer<T>::reuse(dk_raw_, ops, dk.shape()).data(), dgamma.data(),
                           dbeta.data(), dk.data(), k_raw_.data(), k_mean_.data(), k_rstd_.data(),
                           k_norm_gamma.value_data(), rk, D_);
    ops.add(k_norm_gamma.grad_data(), k_norm_gamma.grad_data(), dgamma.data(), D_);
    ops.add(k_norm_beta.grad_data(), k_norm_beta.grad_data(), dbeta.data(), D_);
    dq_in = dq_raw_.data();
    dk_in = dk_raw_.data();
  }
  // dcontext = (through w_k) + (through w_v); dx = (through w_q) [+ dcontext for self-attention]
  Buffer<T>& dctx = Buffer<T>::reuse(dcontext_, ops, {B, Tk, Cc});
  // (B,H,T,·) -> (B,T,H·); with one head the layouts agree and the heads are read in place.
  const auto merged_of = [&](const T* heads, std::size_t n_heads, std::size_t Tn,
                             std::size_t d) -> const T* {
    if (n_heads == 1) return heads;
    ops.merge_heads(dmerged.data(), heads, B, Tn, n_heads, d);
    return dmerged.data();
  };
  const std::size_t KD = Hkv_ * D_, KDv = Hkv_ * Dv_;  // the K/V projections' widths
  ops.linear_backward(dctx.data(), Buffer<T>::reuse(dw_, ops, {Cc * KD}).data(), nullptr,
                      merged_of(dk_in, Hkv_, Tk, D_), context_.data(), w_k.value_data(), Nk, Cc,
                      KD);
  add_weight_grad(w_k);
  Buffer<T>& dctx_v = Buffer<T>::reuse(dcontext_v_, ops, {B, Tk, Cc});
  ops.linear_backward(dctx_v.data(), Buffer<T>::reuse(dw_, ops, {Cc * KDv}).data(), nullptr,
                      merged_of(dv.data(), Hkv_, Tk, Dv_), context_.data(), w_v.value_data(), Nk,
                      Cc, KDv);
  add_weight_grad(w_v);
  ops.add(dctx.data(), dctx.data(), dctx_v.data(), dctx.size());
  Buffer<T>& dx = Buffer<T>::reuse(dx_, ops, {B, Tq, C});
  ops.linear_backward(dx.data(), Buffer<T>::reuse(dw_, ops, {C * HD}).data(), nullptr,
                      merged_of(dq_in, H_, Tq, D_), x_.data(), w_q.value_data(), Nq, C, HD);
  add_weight_grad(w_q);
  if (self_) ops.add(dx.data(), dx.data(), dctx.data(), dx.size());
  return dx;
}

template <class T>
typename MultiHeadAttention<T>::CrossGrads MultiHeadAttention<T>::backward_cross(
    const Tensor3<T>& dy) {
  if (!has_forward_) {
    throw std::logic_error("MultiHeadAttention::backward_cross: called before forward");
  }
  if (self_) {
    throw std::logic_error(
        "MultiHeadAttention::backward_cross: the last forward was self-attention; use backward");
  }
  CrossGrads out;
  out.dx = this->backward(dy);
  out.dcontext = to_tensor<T, 3>(dcontext_, "MultiHeadAttention");
  return out;
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
