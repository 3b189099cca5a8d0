#include "attnlab/nn/transformer.hpp"

#include <cmath>
#include <string>

#include "attnlab/ops/softcap.hpp"

namespace attnlab {

double transformer_flops_per_token(const TransformerConfig& config, std::size_t seq_len) {
  config.validate();
  check_arg(seq_len >= 1, "transformer_flops_per_token", "seq_len", ">= 1",
            std::to_string(seq_len));
  const AttentionConfig& a = config.block.attention;
  const double C = static_cast<double>(a.d_model), H = static_cast<double>(a.heads);
  const double D = static_cast<double>(a.head_dim_k()), Dv = static_cast<double>(a.head_dim_v());
  const double F = static_cast<double>(config.block.d_ff), L = static_cast<double>(config.layers);
  const double T = static_cast<double>(seq_len), V = static_cast<double>(config.out_vocab);
  const double cc = static_cast<double>(a.context_dim());
  const double Hkv = static_cast<double>(a.key_value_heads());
  double per_block = C * H * D + cc * Hkv * D + cc * Hkv * Dv + H * Dv * C;  // w_q, w_k, w_v, w_o
  const double mlp_matrices = config.block.mlp == MlpActivation::swiglu ? 3 : 2;
  if (!config.block.attn_only) per_block += mlp_matrices * C * F;  // fc1.w (gate, up), fc2.w
  const double n = L * per_block + C * V;  // + head.w (or the tied table's use as the head)
  return 6 * n + 6 * L * H * T * (D + Dv);
}

std::vector<ParameterShape> transformer_parameter_shapes(const TransformerConfig& config) {
  config.validate();
  const BlockConfig b = config.block_config();
  const AttentionConfig& a = b.attention;
  const std::size_t C = a.d_model, H = a.heads, Hkv = a.key_value_heads();
  const std::size_t D = a.head_dim_k(), Dv = a.head_dim_v(), Cc = a.context_dim();
  std::vector<ParameterShape> out;
  const auto norm = [&](const std::string& prefix) {
    if (b.norm == Norm::none) return;
    out.push_back({prefix + "gamma", {C}});
    if (b.norm == Norm::layernorm && b.bias) out.push_back({prefix + "beta", {C}});
  };
  for (std::size_t i = 0; i < config.vocab_sizes.size(); ++i)
    out.push_back({"embed.fields." + std::to_string(i) + ".table", {config.vocab_sizes[i], C}});
  if (config.positions == PositionEncoding::learned)
    out.push_back({"pos.table", {config.max_len, C}});
  for (std::size_t l = 0; l < config.layers; ++l) {
    const std::string p = "blocks." + std::to_string(l) + ".";
    norm(p + "ln1.");
    out.push_back({p + "attn.w_q", {C, H * D}});
    out.push_back({p + "attn.w_k", {Cc, Hkv * D}});
    out.push_back({p + "attn.w_v", {Cc, Hkv * Dv}});
    out.push_back({p + "attn.w_o", {H * Dv, C}});
    if (a.qk_norm) {
      for (const char* n : {"q_norm.gamma", "q_norm.beta", "k_norm.gamma", "k_norm.beta"})
        out.push_back({p + "attn." + n, {D}});
    }
    if (a.learnable_scale) out.push_back({p + "attn.log_scale", {H}});
    if (!b.attn_only) {
      norm(p + "ln2.");
      const std::size_t fc1 = b.mlp == MlpActivation::swiglu ? 2 * b.d_ff : b.d_ff;
      out.push_back({p + "mlp.fc1.w", {C, fc1}});
      if (b.bias) out.push_back({p + "mlp.fc1.b", {fc1}});
      out.push_back({p + "mlp.fc2.w", {b.d_ff, C}});
      if (b.bias) out.push_back({p + "mlp.fc2.b", {C}});
    }
  }
  norm("ln_f.");
  if (!config.tie_embeddings) out.push_back({"head.w", {C, config.out_vocab}});
  return out;
}

double transformer_parameter_count(const TransformerConfig& config) {
  double n = 0;
  for (const ParameterShape& p : transformer_parameter_shapes(config)) {
    double size = 1;
    for (const std::size_t d : p.shape) size *= static_cast<double>(d);
    n += size;
  }
  return n;
}

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
  check_arg(!block.attention.rope, op, "block.attention.rope",
            "false (positions = rope turns RoPE on in every block)", "true");
  block_config().validate(op, "block.");
  if (logit_softcap != 0) check_softcap(op, "logit_softcap", logit_softcap);
  if (tie_embeddings) {  // the head reads table 0 as (out_vocab, C): one field, one vocabulary
    check_arg(vocab_sizes.size() == 1, op, "vocab_sizes",
              "one token field when tie_embeddings is set (the head shares that field's table)",
              std::to_string(vocab_sizes.size()) + " fields");
    check_arg(vocab_sizes[0] == out_vocab, op, "out_vocab",
              "vocab_sizes[0] = " + std::to_string(vocab_sizes[0]) +
                  " when tie_embeddings is set (the head's classes are the table's tokens)",
              std::to_string(out_vocab));
  }
}

BlockConfig TransformerConfig::block_config() const {
  BlockConfig b = block;
  b.attention.rope = positions == PositionEncoding::rope;
  return b;
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
          blocks.push_back(std::make_unique<TransformerBlock<T>>(config.block_config(), rng));
        }
        return blocks;
      }()),
      norm_f_(make_norm<T>(config.block.norm, config.d_model(), config.block.bias)),
      head_(config.tie_embeddings
                ? nullptr
                : std::make_unique<Linear<T>>(config.d_model(), config.out_vocab, rng, false)) {
  if (config.tie_embeddings)  // N(0, 1) -> N(0, 1/C), the head's init
    embed_.field(0).table.value *= static_cast<T>(1 / std::sqrt(double(config.d_model())));
  this->set_dropout_key(0, 0);  // every layer its own dropout key
}

template <class T>
void Transformer<T>::collect_parameters(const std::string& prefix, ParameterList<T>& out) {
  embed_.collect_parameters(prefix + "embed.", out);
  pos_.collect_parameters(prefix + "pos.", out);
  for (std::size_t l = 0; l < blocks_.size(); ++l) {
    blocks_[l]->collect_parameters(prefix + "blocks." + std::to_string(l) + ".", out);
  }
  if (norm_f_) norm_f_->collect_parameters(prefix + "ln_f.", out);
  if (head_) head_->collect_parameters(prefix + "head.", out);  // tied: listed once, by embed
}

template <class T>
void Transformer<T>::set_nonfinite_check(bool enabled) {
  check_nonfinite_ = enabled;
  for (auto& b : blocks_) b->set_nonfinite_check(enabled);
  first_nonfinite_.reset();
}

template <class T>
void Transformer<T>::for_each_child(const std::function<void(Module<T>&)>& visit) {
  visit(embed_);
  visit(pos_);
  for (auto& b : blocks_) visit(*b);
  if (norm_f_) visit(*norm_f_);
  if (head_) visit(*head_);
}

template <class T>
Buffer<T> Transformer<T>::head_forward(const Buffer<T>& x) {
  if (head_) return head_->forward(x);
  DeviceOps<T>& ops = this->ops();
  const std::size_t C = config_.d_model(), V = config_.out_vocab;
  tied_x_ = x;  // (B,T,C), kept for dW_e
  tied_keep_.clear();
  Buffer<T>& y = Buffer<T>::reuse(tied_y_, ops, {x.dim(0), x.dim(1), V});
  //                                               (B·T,C) x (V,C)ᵀ -> (B·T,V)
  ops.linear_forward(y.data(), x.data(), embed_.field(0).table.value_data(), nullptr,
                     x.dim(0) * x.dim(1), C, V, /*w_transposed=*/true, &tied_keep_);
  return y;
}

template <class T>
Buffer<T> Transformer<T>::head_backward(const Buffer<T>& dy) {
  if (head_) return head_->backward(dy);
  DeviceOps<T>& ops = this->ops();
  const std::size_t C = config_.d_model(), V = config_.out_vocab;
  Parameter<T>& table = embed_.field(0).table;
  Buffer<T>& dx = Buffer<T>::reuse(tied_dx_, ops, {dy.dim(0), dy.dim(1), C});
  // dx = dy W_e (B·T,V) x (V,C);  dW_e = dyᵀ x (V,B·T) x (B·T,C), added to the table's gradient
  // in the GEMM (β = 1), beside the embedding's own use
  ops.linear_backward(dx.data(), table.grad_data(), nullptr, dy.data(), tied_x_.data(),
                      table.value_data(), dy.dim(0) * dy.dim(1), C, V, /*w_transposed=*/true,
                      /*accumulate_dw=*/true, &tied_keep_);
  return dx;
}

template <class T>
void Transformer<T>::note(const Buffer<T>& t, const std::string& where) {
  if (!check_nonfinite_ || first_nonfinite_) return;
  if (!all_finite(t)) first_nonfinite_ = where;
}

template <class T>
std::vector<Buffer<int>> Transformer<T>::upload_fields(const std::vector<TokenIds>& fields) const {
  return embed_.upload(fields, "Transformer::forward", " (one per vocabulary)");
}

template <class T>
Tensor3<T> Transformer<T>::forward(const std::vector<TokenIds>& fields, const KeyMask* key_mask) {
  const std::vector<Buffer<int>> ids = upload_fields(fields);
  Buffer<unsigned char> mask;
  if (key_mask) {
    check_shape("sdpa_forward", "key_mask", *key_mask,
                {static_cast<std::ptrdiff_t>(fields[0].shape()[0]),
                 static_cast<std::ptrdiff_t>(fields[0].shape()[1])});
    mask = to_byte_mask(this->ops(), *key_mask);
  }
  return to_tensor<T, 3>(forward(ids, key_mask ? &mask : nullptr), "Transformer");
}

template <class T>
Buffer<T> Transformer<T>::forward(const std::vector<Buffer<int>>& ids,
                                  const Buffer<unsigned char>* key_mask,
                                  const SequenceLayout* layout) {
  const char* op = "Transformer::forward";
  if (layout && !layout->positions.empty()) {
    check_arg(config_.positions == PositionEncoding::rope, op, "layout.positions",
              "positions = rope (per-token positions rotate q and k; a position table adds 0 .. "
              "T-1)",
              "positions = " + std::string(enum_name(config_.positions)));
  }
  return run(op, ids, key_mask, nullptr, layout);
}

template <class T>
Buffer<T> Transformer<T>::forward_cached(const std::vector<Buffer<int>>& ids,
                                         TransformerCache<T>& cache) {
  const char* op = "Transformer::forward_cached";
  check_arg(config_.block.attention.sdpa.causal, op, "block.attention.sdpa.causal",
            "causal attention (with a KV cache, earlier tokens never see later ones)", "false");
  const std::size_t past = cache.length(), Tn = ids.empty() ? 0 : ids[0].dim(1);
  check_arg(past + Tn <= config_.max_len, op, "cache length + new tokens",
            "<= max_len = " + std::to_string(config_.max_len),
            std::to_string(past) + " + " + std::to_string(Tn));
  if (cache.layers.size() != blocks_.size()) {
    check_arg(cache.layers.empty(), op, "cache",
              "an empty cache or one of " + std::to_string(blocks_.size()) + " layers",
              std::to_string(cache.layers.size()) + " layers");
    cache.layers.resize(blocks_.size());
  }
  return run(op, ids, nullptr, &cache);
}

template <class T>
Buffer<T> Transformer<T>::run(const char* op, const std::vector<Buffer<int>>& ids,
                              const Buffer<unsigned char>* key_mask, TransformerCache<T>* cache,
                              const SequenceLayout* layout) {
  check_arg(ids.size() == config_.vocab_sizes.size(), op, "fields",
            std::to_string(config_.vocab_sizes.size()) + " id tensors (one per vocabulary)",
            std::to_string(ids.size()));
  first_nonfinite_.reset();
  has_forward_ = false;               // a decoding step (cache) keeps no backward context
  Buffer<T> x = embed_.forward(ids);  // (B,T,C)
  note(x, "embed");
  x = cache ? pos_.forward_at(x, cache->length()) : pos_.forward(x);  // positions go on from it
  note(x, "pos");
  for (std::size_t l = 0; l < blocks_.size(); ++l) {
    if (cache) {
      x = blocks_[l]->forward_cached(x, cache->layers[l]);
    } else {
      x = blocks_[l]->forward(x, key_mask, layout);
      if (check_nonfinite_ && !first_nonfinite_ && blocks_[l]->first_nonfinite())
        first_nonfinite_ = "blocks." + std::to_string(l) + "." + *blocks_[l]->first_nonfinite();
    }
    note(x, "blocks." + std::to_string(l));
  }
  if (norm_f_) x = norm_f_->forward(x);
  note(x, "ln_f");
  Buffer<T> logits = head_forward(x);  // (B,T,C) x (C,V) -> (B,T,V)
  if (config_.logit_softcap != 0) {    // into a buffer of the model's: the head keeps its output
    Buffer<T>& capped = Buffer<T>::reuse(capped_, this->ops(), logits.shape());
    this->ops().softcap_forward(capped.data(), logits.data(), logits.size(),
                                static_cast<T>(config_.logit_softcap));
    logits = capped;
  }
  note(logits, "head");
  if (!cache) {
    has_forward_ = true;
    batch_ = logits.dim(0);
    length_ = logits.dim(1);
  }
  return logits;
}

template <class T>
void Transformer<T>::backward(const Tensor3<T>& dlogits) {
  if (!has_forward_) throw std::logic_error("Transformer::backward: called before forward");
  check_shape("Linear", "dy", dlogits,
              {static_cast<std::ptrdiff_t>(batch_), static_cast<std::ptrdiff_t>(length_),
               static_cast<std::ptrdiff_t>(config_.out_vocab)});
  backward(to_buffer<T>(this->ops(), dlogits));
}

template <class T>
void Transformer<T>::backward(const Buffer<T>& dlogits) {
  if (!has_forward_) throw std::logic_error("Transformer::backward: called before forward");
  check_buffer("Transformer::backward", "dlogits", dlogits, this->ops(),
               {static_cast<std::ptrdiff_t>(batch_), static_cast<std::ptrdiff_t>(length_),
                static_cast<std::ptrdiff_t>(config_.out_vocab)});
  Buffer<T> dx;
  if (config_.logit_softcap != 0) {  // through the cap: dlogits · (1 − (capped / c)²)
    Buffer<T>& draw = Buffer<T>::reuse(dcapped_, this->ops(), dlogits.shape());
    this->ops().softcap_backward(draw.data(), dlogits.data(), capped_.data(), draw.size(),
                                 static_cast<T>(config_.logit_softcap));
    dx = head_backward(draw);
  } else {
    dx = head_backward(dlogits);
  }
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
