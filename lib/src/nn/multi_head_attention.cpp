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
  if (sdpa.scale) {
    check_arg(std::isfinite(*sdpa.scale) && *sdpa.scale > 0, op, path + "sdpa.scale",
              "a finite value > 0", std::to_string(*sdpa.scale));
  }
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

namespace {
// With one head (B,T,D) and (B,1,T,D) share a memory layout: reshape by moving the buffer.
template <class T>
Tensor4<T> split_heads_of(Tensor3<T>&& x, std::size_t heads) {
  if (heads != 1) return split_heads<T>(x, heads);
  const std::size_t B = x.shape()[0], Tn = x.shape()[1], D = x.shape()[2];
  typename Tensor4<T>::inner_shape_type shape{B, 1, Tn, D};
  typename Tensor4<T>::inner_strides_type strides;
  xt::compute_strides(shape, xt::layout_type::row_major, strides);
  return Tensor4<T>(std::move(x.storage()), std::move(shape), std::move(strides));
}

template <class T>
Tensor3<T> merge_heads_of(Tensor4<T>&& x) {
  if (x.shape()[1] != 1) return merge_heads<T>(x);
  const std::size_t B = x.shape()[0], Tn = x.shape()[2], D = x.shape()[3];
  typename Tensor3<T>::inner_shape_type shape{B, Tn, D};
  typename Tensor3<T>::inner_strides_type strides;
  xt::compute_strides(shape, xt::layout_type::row_major, strides);
  return Tensor3<T>(std::move(x.storage()), std::move(shape), std::move(strides));
}
}  // namespace

template <class T>
MultiHeadAttention<T>::MultiHeadAttention(const AttentionConfig& config, Rng& rng)
    : config_(config) {
  config_.validate();
  H_ = config_.heads;
  D_ = config_.head_dim_k();
  Dv_ = config_.head_dim_v();
  const std::size_t C = config_.d_model, Cc = config_.context_dim();
  const auto fan_in_std = [](std::size_t n) { return 1.0 / std::sqrt(double(n)); };
  w_q = make_parameter<T>(randn<T, 2>({C, H_ * D_}, rng, fan_in_std(C)));
  w_k = make_parameter<T>(randn<T, 2>({Cc, H_ * D_}, rng, fan_in_std(Cc)));
  w_v = make_parameter<T>(randn<T, 2>({Cc, H_ * Dv_}, rng, fan_in_std(Cc)));
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
SdpaOptions MultiHeadAttention<T>::sdpa_options() const {
  SdpaOptions options = config_.sdpa;
  if (config_.learnable_scale) {
    options.head_scale.resize(H_);
    for (std::size_t h = 0; h < H_; ++h) {
      options.head_scale[h] = std::exp(static_cast<double>(log_scale.value(h)));
    }
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
Tensor4<T> MultiHeadAttention<T>::attention_weights() const {
  if (sdpa_cache_.has_weights() || q_.size() == 0) return sdpa_cache_.p;
  SdpaOptions options = config_.sdpa;
  options.head_scale.assign(sdpa_cache_.scale.begin(), sdpa_cache_.scale.end());
  return sdpa_weights<T>(q_, k_, options,
                         sdpa_cache_.has_key_mask ? &sdpa_cache_.key_mask : nullptr);
}

template <class T>
Tensor4<T> MultiHeadAttention<T>::attention_scores() const {
  if (q_.size() == 0) {
    throw std::logic_error("MultiHeadAttention::attention_scores: called before forward");
  }
  SdpaOptions options = config_.sdpa;
  options.head_scale.assign(sdpa_cache_.scale.begin(), sdpa_cache_.scale.end());
  return sdpa_scores<T>(q_, k_, options,
                        sdpa_cache_.has_key_mask ? &sdpa_cache_.key_mask : nullptr);
}

template <class T>
Tensor3<T> MultiHeadAttention<T>::attend(const Tensor3<T>& x, const Tensor3<T>& context,
                                         const KeyMask* key_mask, bool self) {
  if (self) {
    check_arg(config_.context_dim() == config_.d_model, "MultiHeadAttention", "self-attention",
              "d_context = d_model (" + std::to_string(config_.d_model) + ")",
              std::to_string(config_.context_dim()));
  }
  self_ = self;
  detail::assign_snapshot(wq_used_, w_q.value);
  detail::assign_snapshot(wk_used_, w_k.value);
  detail::assign_snapshot(wv_used_, w_v.value);
  detail::assign_snapshot(wo_used_, w_o.value);
  q_ = split_heads_of<T>(linear_forward<T, 3>(q_proj_, x, wq_used_),
                         H_);  // (B,Tq,H·D) -> (B,H,Tq,D)
  k_ = split_heads_of<T>(linear_forward<T, 3>(k_proj_, context, wk_used_), H_);  // (B,H,Tk,D)
  v_ = split_heads_of<T>(linear_forward<T, 3>(v_proj_, context, wv_used_), H_);  // (B,H,Tk,Dv)
  if (config_.qk_norm) {
    q_gamma_used_ = tensor_of<T, 1>(q_norm_gamma.value);
    k_gamma_used_ = tensor_of<T, 1>(k_norm_gamma.value);
    q_ = layernorm_forward<T, 4>(q_norm_, q_, q_gamma_used_, tensor_of<T, 1>(q_norm_beta.value));
    k_ = layernorm_forward<T, 4>(k_norm_, k_, k_gamma_used_, tensor_of<T, 1>(k_norm_beta.value));
  }
  Tensor4<T> o = sdpa_forward<T>(sdpa_cache_, q_, k_, v_, sdpa_options(), key_mask);
  // (B,H,Tq,Dv) -> (B,Tq,H·Dv) x (H·Dv,C) -> (B,Tq,C)
  return linear_forward<T, 3>(o_proj_, merge_heads_of<T>(std::move(o)), wo_used_);
}

template <class T>
Tensor3<T> MultiHeadAttention<T>::forward_impl(const Tensor3<T>& x) {
  return attend(x, x, nullptr, true);
}

template <class T>
Tensor3<T> MultiHeadAttention<T>::forward(const Tensor3<T>& x, const KeyMask* key_mask) {
  this->check_input(x);
  Tensor3<T> y = attend(x, x, key_mask, true);
  this->mark_forward(x.shape()[0], x.shape()[1]);
  return y;
}

template <class T>
Tensor3<T> MultiHeadAttention<T>::forward_cross(const Tensor3<T>& x, const Tensor3<T>& context,
                                                const KeyMask* key_mask) {
  this->check_input(x);
  check_shape("MultiHeadAttention", "context", context,
              {static_cast<std::ptrdiff_t>(x.shape()[0]), kAnyExtent,
               static_cast<std::ptrdiff_t>(config_.context_dim())});
  Tensor3<T> y = attend(x, context, key_mask, false);
  this->mark_forward(x.shape()[0], x.shape()[1]);
  return y;
}

template <class T>
Tensor3<T> MultiHeadAttention<T>::backward_impl(const Tensor3<T>& dy) {
  // Exact reverse of attend().
  auto go = linear_backward<T, 3>(dy, o_proj_, wo_used_, false);  // y = merged W_o
  add_into(w_o.grad, go.dw);
  const Tensor4<T> dout = split_heads_of<T>(std::move(go.dx), H_);  // (B,Tq,H·Dv) -> (B,H,Tq,Dv)
  SdpaGrads<T> g = sdpa_backward<T>(dout, sdpa_cache_, q_, k_, v_);
  if (config_.learnable_scale) {
    // s = exp(log s): dL/dlog s = s · dL/ds.
    for (std::size_t h = 0; h < H_; ++h) log_scale.grad(h) += sdpa_cache_.scale[h] * g.dscale(h);
  }
  if (config_.qk_norm) {
    auto gq = layernorm_backward<T, 4>(g.dq, q_norm_, q_gamma_used_);
    auto gk = layernorm_backward<T, 4>(g.dk, k_norm_, k_gamma_used_);
    add_into(q_norm_gamma.grad, gq.dgamma);
    add_into(q_norm_beta.grad, gq.dbeta);
    add_into(k_norm_gamma.grad, gk.dgamma);
    add_into(k_norm_beta.grad, gk.dbeta);
    g.dq = std::move(gq.dx);
    g.dk = std::move(gk.dx);
  }
  auto gq = linear_backward<T, 3>(merge_heads_of<T>(std::move(g.dq)), q_proj_, wq_used_, false);
  auto gk = linear_backward<T, 3>(merge_heads_of<T>(std::move(g.dk)), k_proj_, wk_used_, false);
  auto gv = linear_backward<T, 3>(merge_heads_of<T>(std::move(g.dv)), v_proj_, wv_used_, false);
  add_into(w_q.grad, gq.dw);
  add_into(w_k.grad, gk.dw);
  add_into(w_v.grad, gv.dw);
  Tensor3<T> dcontext = std::move(gk.dx);  // (B,Tk,Cc)
  detail::add_elements(dcontext.data(), dcontext.data(), gv.dx.data(), dcontext.size());
  if (self_) {
    detail::add_elements(gq.dx.data(), gq.dx.data(), dcontext.data(), dcontext.size());
    dcontext_ = Tensor3<T>();
  } else {
    dcontext_ = std::move(dcontext);
  }
  return std::move(gq.dx);
}

template <class T>
typename MultiHeadAttention<T>::CrossGrads MultiHeadAttention<T>::backward_cross(
    const Tensor3<T>& dy) {
  if (q_.size() == 0) {
    throw std::logic_error("MultiHeadAttention::backward_cross: called before forward");
  }
  if (self_) {
    throw std::logic_error(
        "MultiHeadAttention::backward_cross: the last forward was self-attention; use backward");
  }
  CrossGrads out;
  out.dx = this->backward(dy);
  out.dcontext = std::move(dcontext_);
  dcontext_ = Tensor3<T>();
  return out;
}

template Tensor4<float> split_heads<float>(const Tensor3<float>&, std::size_t);
template Tensor4<double> split_heads<double>(const Tensor3<double>&, std::size_t);
template Tensor3<float> merge_heads<float>(const Tensor4<float>&);
template Tensor3<double> merge_heads<double>(const Tensor4<double>&);
template class MultiHeadAttention<float>;
template class MultiHeadAttention<double>;

}  // namespace attnlab
