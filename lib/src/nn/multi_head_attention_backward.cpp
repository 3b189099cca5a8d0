// MultiHeadAttention's backward (attnlab/nn/multi_head_attention.hpp), the exact reverse of
// attend(): the output projection, the core, RoPE, QK-norm, the input projections. The forward, the
// KV cache and the layer's set-up are in multi_head_attention.cpp.
#include "attnlab/nn/multi_head_attention.hpp"

#include <algorithm>
#include <cassert>
#include <cmath>
#include <string>
#include <vector>

#include "../parallel_rows.hpp"

namespace attnlab {

template <class T>
Buffer<T> MultiHeadAttention<T>::backward_impl(const Buffer<T>& dy) {
  if (last_.cross()) {
    throw std::logic_error(
        "MultiHeadAttention::backward: the last forward was cross-attention; use backward_cross, "
        "which returns dx and dcontext");
  }
  return backward(last_, dy).dx;
}

// The backward, the exact reverse of attend(): the output projection, the core, RoPE, QK-norm,
// the input projections.
template <class T>
typename MultiHeadAttention<T>::Grads MultiHeadAttention<T>::backward(const Context& ctx,
                                                                      const Buffer<T>& dy) {
  if (ctx.cached_) {
    throw std::logic_error(
        "MultiHeadAttention::backward: the forward was forward_cached (decoding), which has no "
        "backward; run forward() first");
  }
  if (ctx.empty()) {
    throw std::logic_error("MultiHeadAttention::backward: the context holds no forward");
  }
  check_buffer("MultiHeadAttention::backward", "dy", dy, this->ops(),
               {static_cast<std::ptrdiff_t>(ctx.spec_.B), static_cast<std::ptrdiff_t>(ctx.spec_.Tq),
                static_cast<std::ptrdiff_t>(config_.d_model)});
  backward_core(ctx, backward_out(ctx, dy));
  backward_rope(ctx);
  backward_qk_norm(ctx);
  return backward_projections(ctx);
}

// y = merged W_o: dW_o, and dO (B,H,Tq,Dv).
template <class T>
const Buffer<T>& MultiHeadAttention<T>::backward_out(const Context& ctx, const Buffer<T>& dy) {
  DeviceOps<T>& ops = this->ops();
  const std::size_t B = ctx.spec_.B, Tq = ctx.spec_.Tq, Tk = ctx.spec_.Tk;
  const std::size_t C = config_.d_model, HDv = H_ * Dv_, Nq = B * Tq;
  Buffer<T>& dmerged = Buffer<T>::reuse(
      dmerged_, ops, {B * std::max(Tq, Tk) * std::max(H_, Hkv_) * std::max(D_, Dv_)});
  Buffer<T>& dout = Buffer<T>::reuse(dout_, ops, {B, H_, Tq, Dv_});
  ops.linear_backward(H_ == 1 ? dout.data() : dmerged.data(), w_o.grad_data(), nullptr, dy.data(),
                      ctx.merged_.data(), w_o.value_data(), Nq, HDv, C, /*w_transposed=*/false,
                      /*accumulate_dw=*/true, &ctx.keep_);
  if (H_ != 1) ops.split_heads(dout.data(), dmerged.data(), B, Tq, H_, Dv_);
  return dout;
}

// dQ, dK, dV from dO on the path the forward ran; with a learnable scale, dlog s.
template <class T>
void MultiHeadAttention<T>::backward_core(const Context& ctx, const Buffer<T>& dout) {
  DeviceOps<T>& ops = this->ops();
  const std::size_t B = ctx.spec_.B, Tq = ctx.spec_.Tq, Tk = ctx.spec_.Tk;
  Buffer<T>& dq = Buffer<T>::reuse(dq_, ops, {B, H_, Tq, D_});
  Buffer<T>& dk = Buffer<T>::reuse(dk_, ops, {B, Hkv_, Tk, D_});
  Buffer<T>& dv = Buffer<T>::reuse(dv_, ops, {B, Hkv_, Tk, Dv_});
  if (ctx.program_) {
    program_backward(ctx, dout);
  } else if (ctx.fused_) {
    ops.sdpa_fused_backward(dq.data(), dk.data(), dv.data(),
                            Buffer<T>::reuse(ds_, ops, {B * H_ * Tq}).data(), dout.data(),
                            ctx.o_.data(), ctx.lse_.data(), params(ctx));
  } else {
    ops.sdpa_reference_backward(dq.data(), dk.data(), dv.data(),
                                Buffer<T>::reuse(ds_, ops, {B * H_ * Tq * Tk}).data(), dout.data(),
                                ctx.p_.data(), params(ctx));
  }
  if (config_.learnable_scale) {
    // s = exp(log s): dL/dlog s_h = s_h · dL/ds_h = Σ q ⊙ dq over head h (as dQ = s · dS K).
    Buffer<T>& dlog = Buffer<T>::reuse(dlog_scale_, ops, {H_});
    ops.head_dot(dlog.data(), ctx.q_.data(), dq.data(), B, H_, Tq * D_);
    add_into(ops, log_scale, dlog);
  }
}

// Through RoPE: dq_ and dk_ rotated back in place (a rotation's inverse is its transpose).
template <class T>
void MultiHeadAttention<T>::backward_rope(const Context& ctx) {
  if (!config_.rope) return;
  rotate_heads(ctx, dq_.data(), H_, ctx.spec_.Tq, 0, true);
  rotate_heads(ctx, dk_.data(), Hkv_, ctx.spec_.Tk, 0, true);
}

// Through QK-norm: dq_raw_, dk_raw_ and the gains' and shifts' grads.
template <class T>
void MultiHeadAttention<T>::backward_qk_norm(const Context& ctx) {
  if (!config_.qk_norm) return;
  DeviceOps<T>& ops = this->ops();
  const std::size_t rq = ctx.spec_.B * H_ * ctx.spec_.Tq, rk = ctx.spec_.B * Hkv_ * ctx.spec_.Tk;
  Buffer<T>& dgamma = Buffer<T>::reuse(dnorm_, ops, {2 * D_});
  const Buffer<T> dbeta = Buffer<T>::view(dgamma, D_, {D_});
  const auto through = [&](Buffer<T>& draw, const Buffer<T>& d, const Buffer<T>& raw,
                           const Buffer<T>& mean, const Buffer<T>& rstd, Parameter<T>& gamma,
                           Parameter<T>& beta, std::size_t rows) {
    ops.layernorm_backward(Buffer<T>::reuse(draw, ops, d.shape()).data(), dgamma.data(),
                           dbeta.data(), d.data(), raw.data(), mean.data(), rstd.data(),
                           gamma.value_data(), rows, D_);
    ops.add(gamma.grad_data(), gamma.grad_data(), dgamma.data(), D_);
    ops.add(beta.grad_data(), beta.grad_data(), dbeta.data(), D_);
  };
  through(dq_raw_, dq_, ctx.q_raw_, ctx.q_mean_, ctx.q_rstd_, q_norm_gamma, q_norm_beta, rq);
  through(dk_raw_, dk_, ctx.k_raw_, ctx.k_mean_, ctx.k_rstd_, k_norm_gamma, k_norm_beta, rk);
}

// dcontext = (through w_k) + (through w_v); dx = (through w_q) [+ dcontext for self-attention].
template <class T>
typename MultiHeadAttention<T>::Grads MultiHeadAttention<T>::backward_projections(
    const Context& ctx) {
  DeviceOps<T>& ops = this->ops();
  const std::size_t B = ctx.spec_.B, Tq = ctx.spec_.Tq, Tk = ctx.spec_.Tk;
  const std::size_t C = config_.d_model, Cc = config_.context_dim();
  const std::size_t HD = H_ * D_, KD = Hkv_ * D_, KDv = Hkv_ * Dv_, Nq = B * Tq, Nk = B * Tk;
  const T* dq_in = config_.qk_norm ? dq_raw_.data() : dq_.data();
  const T* dk_in = config_.qk_norm ? dk_raw_.data() : dk_.data();
  // (B,H,T,·) -> (B,T,H·); with one head the layouts agree and the heads are read in place.
  const auto merged_of = [&](const T* heads, std::size_t n_heads, std::size_t Tn,
                             std::size_t d) -> const T* {
    if (n_heads == 1) return heads;
    ops.merge_heads(dmerged_.data(), heads, B, Tn, n_heads, d);
    return dmerged_.data();
  };
  Buffer<T>& dctx = Buffer<T>::reuse(dcontext_, ops, {B, Tk, Cc});
  ops.linear_backward(dctx.data(), w_k.grad_data(), nullptr, merged_of(dk_in, Hkv_, Tk, D_),
                      ctx.context_.data(), w_k.value_data(), Nk, Cc, KD, /*w_transposed=*/false,
                      /*accumulate_dw=*/true, &ctx.keep_);
  Buffer<T>& dctx_v = Buffer<T>::reuse(dcontext_v_, ops, {B, Tk, Cc});
  ops.linear_backward(dctx_v.data(), w_v.grad_data(), nullptr, merged_of(dv_.data(), Hkv_, Tk, Dv_),
                      ctx.context_.data(), w_v.value_data(), Nk, Cc, KDv, /*w_transposed=*/false,
                      /*accumulate_dw=*/true, &ctx.keep_);
  ops.add(dctx.data(), dctx.data(), dctx_v.data(), dctx.size());
  Buffer<T>& dx = Buffer<T>::reuse(dx_, ops, {B, Tq, C});
  ops.linear_backward(dx.data(), w_q.grad_data(), nullptr, merged_of(dq_in, H_, Tq, D_),
                      ctx.x_.data(), w_q.value_data(), Nq, C, HD, /*w_transposed=*/false,
                      /*accumulate_dw=*/true, &ctx.keep_);
  if (ctx.self_) {
    ops.add(dx.data(), dx.data(), dctx.data(), dx.size());
    return {dx, Buffer<T>()};
  }
  return {dx, dctx};
}

template <class T>
typename MultiHeadAttention<T>::CrossGrads MultiHeadAttention<T>::backward_cross(
    const Tensor3<T>& dy) {
  if (last_.empty()) {
    throw std::logic_error("MultiHeadAttention::backward_cross: called before forward");
  }
  if (!last_.cross()) {
    throw std::logic_error(
        "MultiHeadAttention::backward_cross: the last forward was self-attention; use backward");
  }
  const Grads g = backward(last_, to_buffer<T>(this->ops(), dy));
  return {to_tensor<T, 3>(g.dx, "MultiHeadAttention"),
          to_tensor<T, 3>(g.dcontext, "MultiHeadAttention")};
}

// The members above, for the two element types (the class itself is instantiated with the
// forward, in multi_head_attention.cpp).
template Buffer<float> MultiHeadAttention<float>::backward_impl(const Buffer<float>&);
template MultiHeadAttention<float>::Grads MultiHeadAttention<float>::backward(const Context&,
                                                                              const Buffer<float>&);
template MultiHeadAttention<float>::CrossGrads MultiHeadAttention<float>::backward_cross(
    const Tensor3<float>&);
template Buffer<double> MultiHeadAttention<double>::backward_impl(const Buffer<double>&);
template MultiHeadAttention<double>::Grads MultiHeadAttention<double>::backward(
    const Context&, const Buffer<double>&);
template MultiHeadAttention<double>::CrossGrads MultiHeadAttention<double>::backward_cross(
    const Tensor3<double>&);

}  // namespace attnlab
