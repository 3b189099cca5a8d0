#include "attnlab/nn/transformer_block.hpp"

#include "attnlab/attention/dropout.hpp"

#include <cmath>
#include <cstdint>
#include <string>

#include <algorithm>

namespace attnlab {

void BlockConfig::validate(std::string_view op, const std::string& path) const {
  if (!attn_only)
    check_arg(d_ff > 0, op, path + "d_ff", "> 0 (or attn_only)", std::to_string(d_ff));
  check_arg(dropout >= 0.0 && dropout < 1.0, op, path + "dropout", "a probability in [0, 1)",
            std::to_string(dropout));
  attention.validate(op, path + "attention.");
}

template <class T>
TransformerBlock<T>::TransformerBlock(const BlockConfig& config, Rng& rng)
    : config_((config.validate(), config)),
      norm1_(make_norm<T>(config.norm, config.attention.d_model, config.bias)),
      norm2_(config.attn_only ? nullptr
                              : make_norm<T>(config.norm, config.attention.d_model, config.bias)),
      attn_(config.attention, rng) {
  if (!config_.attn_only) {
    mlp_ = std::make_unique<FeedForward<T>>(config_.attention.d_model, config_.d_ff, rng,
                                            config_.mlp, GeluApproximation::tanh, config_.bias);
  }
  this->set_dropout_key(0, 0);  // distinct keys for the attention and the residuals
}

template <class T>
void TransformerBlock<T>::collect_parameters(const std::string& prefix, ParameterList<T>& out) {
  if (norm1_) norm1_->collect_parameters(prefix + "ln1.", out);
  attn_.collect_parameters(prefix + "attn.", out);
  if (norm2_) norm2_->collect_parameters(prefix + "ln2.", out);
  if (mlp_) mlp_->collect_parameters(prefix + "mlp.", out);
}

template <class T>
void TransformerBlock<T>::note(const Buffer<T>& t, const char* where) {
  if (!check_nonfinite_ || first_nonfinite_ || all_finite(t)) return;
  first_nonfinite_ = where;
}

template <class T>
Buffer<T> TransformerBlock<T>::run_forward(const Buffer<T>& x,
                                           const Buffer<unsigned char>* key_mask, KVCache<T>* cache,
                                           const SequenceLayout* layout) {
  DeviceOps<T>& ops = this->ops();
  first_nonfinite_.reset();
  // Residual dropout: one key per forward, a stream per branch (attention, MLP).
  residual_dropout_ = this->training() && config_.dropout > 0 && cache == nullptr;
  residual_key_ = residual_dropout_ ? this->next_dropout_key() : 0;
  const auto drop = [&](Buffer<T>& branch, std::uint32_t stream) {
    if (residual_dropout_) {
      ops.dropout(branch.data(), branch.data(), branch.size(), config_.dropout, residual_key_,
                  stream);
    }
  };
  // h = x + dropout(attn(norm1(x)))
  Buffer<T> a = norm1_ ? norm1_->forward(x) : x;
  note(a, "ln1");
  a = cache ? attn_.forward_cached(a, *cache) : attn_.forward(a, key_mask, layout);
  if (check_nonfinite_ && !first_nonfinite_ && !all_finite(a)) {
    // Name the first head whose attention weights went non-finite, if any.
    const Tensor4<T> p = attn_.attention_weights();
    const std::size_t B = p.shape()[0], H = p.shape()[1], n = p.shape()[2] * p.shape()[3];
    std::string where = "attn";
    for (std::size_t h = 0; h < H && where == "attn"; ++h) {
      for (std::size_t b = 0; b < B; ++b) {
        const T* s = p.data() + (b * H + h) * n;
        if (!std::all_of(s, s + n, [](T v) { return std::isfinite(v); })) {
          where = "attn (head " + std::to_string(h) + ")";
          break;
        }
      }
    }
    first_nonfinite_ = where;
  }
  drop(a, attention::kResidualStream);
  ops.add(a.data(), x.data(), a.data(), a.size());
  const Buffer<T> h = a;  // h = x + attn(norm1(x)), in the attention's output buffer
  if (!mlp_) return h;
  // y = h + dropout(mlp(norm2(h)))
  Buffer<T> m = norm2_ ? norm2_->forward(h) : h;
  note(m, "ln2");
  m = mlp_->forward(m);
  note(m, "mlp");
  drop(m, attention::kResidualStream + 1);
  ops.add(m.data(), h.data(), m.data(), m.size());
  return m;  // h + mlp(norm2(h))
}

template <class T>
Buffer<T> TransformerBlock<T>::forward_impl(const Buffer<T>& x) {
  return run_forward(x, nullptr);
}

template <class T>
Buffer<T> TransformerBlock<T>::forward_cached(const Buffer<T>& x, KVCache<T>& cache) {
  this->check_input(x);
  return run_forward(x, nullptr, &cache);
}

template <class T>
Buffer<T> TransformerBlock<T>::forward(const Buffer<T>& x, const Buffer<unsigned char>* key_mask,
                                       const SequenceLayout* layout) {
  this->check_input(x);
  Buffer<T> y = run_forward(x, key_mask, nullptr, layout);
  this->mark_forward(x.dim(0), x.dim(1));
  return y;
}

template <class T>
Tensor3<T> TransformerBlock<T>::forward(const Tensor3<T>& x, const KeyMask* key_mask) {
  this->check_input(x);
  Buffer<unsigned char> mask;
  if (key_mask) {
    check_shape(
        "sdpa_forward", "key_mask", *key_mask,
        {static_cast<std::ptrdiff_t>(x.shape()[0]), static_cast<std::ptrdiff_t>(x.shape()[1])});
    mask = to_byte_mask(this->ops(), *key_mask);
  }
  return to_tensor<T, 3>(forward(to_buffer<T>(this->ops(), x), key_mask ? &mask : nullptr),
                         "TransformerBlock");
}

template <class T>
Buffer<T> TransformerBlock<T>::backward_impl(const Buffer<T>& dy) {
  // Reverse of run_forward. Each residual adds both paths (written into the path's buffer).
  DeviceOps<T>& ops = this->ops();
  // The gradient into a dropped branch: g ⊙ M / (1 − p) with the forward's mask, in a scratch (g
  // itself also flows through the residual).
  const auto into_branch = [&](const Buffer<T>& g, std::uint32_t stream) {
    if (!residual_dropout_) return g;
    Buffer<T>& d = Buffer<T>::reuse(branch_grad_, ops, g.shape());
    ops.dropout(d.data(), g.data(), g.size(), config_.dropout, residual_key_, stream);
    return d;
  };
  Buffer<T> dh = dy;  // dL/dh; without an MLP, dh = dy
  if (mlp_) {
    // y = h + dropout(mlp(norm2(h)))
    Buffer<T> dm = mlp_->backward(into_branch(dy, attention::kResidualStream + 1));
    note(dm, "mlp (gradient)");
    if (norm2_) dm = norm2_->backward(dm);
    note(dm, "ln2 (gradient)");
    ops.add(dm.data(), dy.data(), dm.data(), dm.size());
    dh = dm;  // dy + dm
  }
  // h = x + dropout(attn(norm1(x)))
  Buffer<T> da = attn_.backward(into_branch(dh, attention::kResidualStream));
  note(da, "attn (gradient)");
  if (norm1_) da = norm1_->backward(da);
  note(da, "ln1 (gradient)");
  ops.add(da.data(), dh.data(), da.data(), da.size());
  return da;  // dh + da
}

template class TransformerBlock<float>;
template class TransformerBlock<double>;

}  // namespace attnlab
