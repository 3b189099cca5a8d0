// A pre-LN transformer block (Xiong et al. 2020; GPT-2):
//   h = x + attn(norm1(x))
//   y = h + mlp(norm2(h))          (omitted in the attention-only variant: y = h)
// norm is LayerNorm, RMSNorm or none (the identity).
// Parameters: "ln1.*", "attn.*", and unless attn_only "ln2.*", "mlp.fc1.*", "mlp.fc2.*".
#pragma once

#include <cstdint>
#include <memory>
#include <optional>

#include "attnlab/nn/feed_forward.hpp"
#include "attnlab/nn/multi_head_attention.hpp"
#include "attnlab/nn/norm.hpp"

namespace attnlab {

struct BlockConfig {
  AttentionConfig attention;
  std::size_t d_ff = 0;  // F, the MLP width (ignored when attn_only)
  bool attn_only = false;
  MlpActivation mlp = MlpActivation::gelu;  // the MLP's activation (EnumTable<MlpActivation>)
  Norm norm = Norm::layernorm;
  // false: no additive bias in the block (nanoGPT's bias=False): the MLP's fc1 and fc2 lose theirs
  // and the LayerNorms their β (ln1, ln2, and the Transformer's ln_f). The attention projections
  // have none either way; QK-norm keeps its per-head β (part of that arm's definition).
  bool bias = true;
  // Dropout on the two residual branches (the attention's and the MLP's outputs, before each
  // residual add) in training mode, p in [0, 1); none in eval mode.
  double dropout = 0.0;

  // Throws std::invalid_argument "<op>: <path><field> expected ..., got ..." (attention.validate()
  // included, its fields under <path>attention.); an owner passes its name and the path to here.
  void validate(std::string_view op = "BlockConfig", const std::string& path = "") const;
};

template <class T>
class TransformerBlock : public SequenceModule<T> {
 public:
  // Draws attention weights, then MLP weights, from `rng`.
  TransformerBlock(const BlockConfig& config, Rng& rng);

  using SequenceModule<T>::forward;
  // x: (B, T, C); key_mask: (B, T), true = may attend, or nullptr. Returns (B, T, C).
  Tensor3<T> forward(const Tensor3<T>& x, const KeyMask* key_mask);
  // The same on the backend; key_mask (B, T) bytes, nonzero = may attend, or nullptr; layout:
  // this forward's block mask and positions, for the attention (SequenceLayout), or nullptr.
  Buffer<T> forward(const Buffer<T>& x, const Buffer<unsigned char>* key_mask,
                    const SequenceLayout* layout = nullptr);
  // Incremental decoding: x (B, Tn, C) new tokens after the cache's; see
  // MultiHeadAttention::forward_cached (inference only, no dropout, no backward).
  Buffer<T> forward_cached(const Buffer<T>& x, KVCache<T>& cache);

  void collect_parameters(const std::string& prefix, ParameterList<T>& out) override;
  std::size_t in_features() const override { return config_.attention.d_model; }
  std::size_t out_features() const override { return config_.attention.d_model; }
  std::string_view type_name() const override { return "TransformerBlock"; }
  const BlockConfig& config() const { return config_; }

  MultiHeadAttention<T>& attention() { return attn_; }
  const MultiHeadAttention<T>& attention() const { return attn_; }

  // When enabled, forward and backward record the first sub-module ("ln1", "attn", "ln2", "mlp")
  // whose output or input gradient holds a non-finite value (see Transformer::first_nonfinite).
  void set_nonfinite_check(bool enabled) { check_nonfinite_ = enabled; }
  const std::optional<std::string>& first_nonfinite() const { return first_nonfinite_; }
  void clear_nonfinite() { first_nonfinite_.reset(); }

 protected:
  Buffer<T> forward_impl(const Buffer<T>& x) override;
  Buffer<T> backward_impl(const Buffer<T>& dy) override;
  void for_each_child(const std::function<void(Module<T>&)>& visit) override {
    if (norm1_) visit(*norm1_);
    visit(attn_);
    if (norm2_) visit(*norm2_);
    if (mlp_) visit(*mlp_);
  }

 private:
  Buffer<T> run_forward(const Buffer<T>& x, const Buffer<unsigned char>* key_mask,
                        KVCache<T>* cache = nullptr, const SequenceLayout* layout = nullptr);
  void note(const Buffer<T>& t, const char* where);

  BlockConfig config_;
  std::unique_ptr<SequenceModule<T>> norm1_, norm2_;  // nullptr for Norm::none
  MultiHeadAttention<T> attn_;
  std::unique_ptr<FeedForward<T>> mlp_;  // nullptr when attn_only
  // The residual dropout of the last forward: its key (0 when it did not apply) and a scratch for
  // the branch gradients.
  std::uint64_t residual_key_ = 0;
  bool residual_dropout_ = false;
  Buffer<T> branch_grad_;
  bool check_nonfinite_ = false;
  std::optional<std::string> first_nonfinite_;
};

}  // namespace attnlab
