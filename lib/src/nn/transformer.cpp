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
  check_arg(layers > 0, op, "layers", "> 0", std::to_string(layers));
  check_arg(out_vocab > 0, op, "out_vocab", "> 0", std::to_string(out_vocab));
  check_arg(block.attention.d_context == 0, op, "block.attention.d_context",
            "0 (a Transformer has no cross-attention)", std::to_string(block.attention.d_context));
  block.validate(op, "block.");
}

BlockConfig TransformerConfig::default_block() {
  BlockConfig b;
  b.attention.d_model = 64;
  b.attention.heads = 4;
  b.d_ff = 256;
  return b;
}

template <class T>
Transformer<T>::Transformer(const TransformerConfig& config, Rng& rng)
    : config_((config.validate(), config)),
      embed_(config.vocab_sizes, config.d_model(), rng),
      pos_(config.positions, config.max_len, config.d_model(), rng),
      blocks_([&] {
        std::vector<std::unique_ptr<TransformerBlock<T>>> blocks;
        for (std::size_t l = 0; l < config.layers; ++l) {
          blocks.push_back(std::make_unique<TransformerBlock<T>>(config.block, rng));
        }
        return blocks;
      }()),
      norm_f_(make_norm<T>(config.block.norm, config.d_model())),
      head_(config.d_model(), config.out_vocab, rng, false) {}

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
