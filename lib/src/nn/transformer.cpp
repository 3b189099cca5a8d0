#include "attnlab/nn/transformer.hpp"

#include <cmath>
#include <string>

namespace attnlab {

void TransformerConfig::validate() const {
  constexpr std::string_view op = "TransformerConfig";
  check_arg(!vocab_sizes.empty(), op, "vocab_sizes", "at least one field", "none");
  for (std::size_t i = 0; i < vocab_sizes.size(); ++i) {
    check_arg(vocab_sizes[i] > 0, op, "vocab_sizes[" + std::to_string(i) + "]", "> 0", "0");
  }
  check_arg(max_len > 0, op, "max_len", "> 0", std::to_string(max_len));
  check_arg(d_model > 0, op, "d_model", "> 0", std::to_string(d_model));
  check_arg(heads > 0, op, "heads", "> 0", std::to_string(heads));
  check_arg(layers > 0, op, "layers", "> 0", std::to_string(layers));
  check_arg(out_vocab > 0, op, "out_vocab", "> 0", std::to_string(out_vocab));
  if (!attn_only) check_arg(d_ff > 0, op, "d_ff", "> 0 (or attn_only)", std::to_string(d_ff));
  const std::string divisible = "divisible by heads (" + std::to_string(heads) + ") when ";
  if (d_k == 0) {
    check_arg(d_model % heads == 0, op, "d_model", divisible + "d_k is 0 (derived)",
              std::to_string(d_model));
  }
  if (d_v == 0) {
    check_arg(d_model % heads == 0, op, "d_model", divisible + "d_v is 0 (derived)",
              std::to_string(d_model));
  }
  if (attention.scale) {
    check_arg(std::isfinite(*attention.scale) && *attention.scale > 0, op, "attention.scale",
              "a finite value > 0", std::to_string(*attention.scale));
  }
  check_arg(attention.head_scale.empty(), op, "attention.head_scale",
            "empty (use learnable_scale for per-head scales)",
            std::to_string(attention.head_scale.size()) + " entries");
}

AttentionConfig TransformerConfig::attention_config() const {
  AttentionConfig a;
  a.d_model = d_model;
  a.heads = heads;
  a.d_k = d_k;
  a.d_v = d_v;
  a.sdpa = attention;
  a.qk_norm = qk_norm;
  a.learnable_scale = learnable_scale;
  return a;
}

BlockConfig TransformerConfig::block_config() const {
  BlockConfig b;
  b.attention = attention_config();
  b.d_ff = d_ff;
  b.attn_only = attn_only;
  b.norm = norm;
  return b;
}

template <class T>
Transformer<T>::Transformer(const TransformerConfig& config, Rng& rng)
    : config_((config.validate(), config)),
      embed_(config.vocab_sizes, config.d_model, rng),
      pos_(config.positions, config.max_len, config.d_model, rng),
      blocks_([&] {
        std::vector<std::unique_ptr<TransformerBlock<T>>> blocks;
        for (std::size_t l = 0; l < config.layers; ++l) {
          blocks.push_back(std::make_unique<TransformerBlock<T>>(config.block_config(), rng));
        }
        return blocks;
      }()),
      norm_f_(make_norm<T>(config.norm, config.d_model)),
      head_(config.d_model, config.out_vocab, rng, false) {}

template <class T>
void Transformer<T>::collect_parameters(const std::string& prefix, ParameterList<T>& out) {
  embed_.collect_parameters(prefix + "embed.", out);
  pos_.collect_parameters(prefix + "pos.", out);
  for (std::size_t l = 0; l < blocks_.size(); ++l) {
    blocks_[l]->collect_parameters(prefix + "blocks." + std::to_string(l) + ".", out);
  }
  if (norm_f_) norm_f_->collect_parameters(prefix + "ln_f.", out);
  head_.collect_parameters(prefix + "head.", out);
}

template <class T>
void Transformer<T>::set_nonfinite_check(bool enabled) {
  check_nonfinite_ = enabled;
  for (auto& b : blocks_) b->set_nonfinite_check(enabled);
  first_nonfinite_.reset();
}

template <class T>
void Transformer<T>::note(const Tensor3<T>& t, const std::string& where) {
  if (!check_nonfinite_ || first_nonfinite_) return;
  for (std::size_t i = 0; i < t.size(); ++i) {
    if (!std::isfinite(t.data()[i])) {
      first_nonfinite_ = where;
      return;
    }
  }
}

template <class T>
Tensor3<T> Transformer<T>::forward(const std::vector<TokenIds>& fields, const KeyMask* key_mask) {
  check_arg(fields.size() == config_.vocab_sizes.size(), "Transformer::forward", "fields",
            std::to_string(config_.vocab_sizes.size()) + " id tensors (one per vocabulary)",
            std::to_string(fields.size()));
  first_nonfinite_.reset();
  Tensor3<T> x = embed_.forward(fields);  // (B,T,C)
  note(x, "embed");
  x = pos_.forward(x);
  note(x, "pos");
  for (std::size_t l = 0; l < blocks_.size(); ++l) {
    x = blocks_[l]->forward(x, key_mask);
    if (check_nonfinite_ && !first_nonfinite_ && blocks_[l]->first_nonfinite()) {
      first_nonfinite_ = "blocks." + std::to_string(l) + "." + *blocks_[l]->first_nonfinite();
    }
    note(x, "blocks." + std::to_string(l));
  }
  if (norm_f_) x = norm_f_->forward(x);
  note(x, "ln_f");
  Tensor3<T> logits = head_.forward(x);  // (B,T,C) x (C,V) -> (B,T,V)
  note(logits, "head");
  has_forward_ = true;
  return logits;
}

template <class T>
void Transformer<T>::backward(const Tensor3<T>& dlogits) {
  if (!has_forward_) throw std::logic_error("Transformer::backward: called before forward");
  Tensor3<T> dx = head_.backward(dlogits);
  note(dx, "head (gradient)");
  if (norm_f_) dx = norm_f_->backward(dx);
  note(dx, "ln_f (gradient)");
  for (std::size_t l = blocks_.size(); l-- > 0;) {
    if (check_nonfinite_) blocks_[l]->clear_nonfinite();
    dx = blocks_[l]->backward(dx);
    if (check_nonfinite_ && !first_nonfinite_ && blocks_[l]->first_nonfinite()) {
      first_nonfinite_ = "blocks." + std::to_string(l) + "." + *blocks_[l]->first_nonfinite();
    }
  }
  dx = pos_.backward(dx);
  embed_.backward(dx);
}

template class Transformer<float>;
template class Transformer<double>;

}  // namespace attnlab
