// The tiny transformer of the study:
//   x = Σ_fields embed_i(fields[i]) + pos        (B,T,C)
//   x = blocks[0..L)(x)                          (B,T,C)
//   logits = head(norm_f(x))                     (B,T,C) x (C,V) -> (B,T,V)
//   [logits = c · tanh(logits / c) with logit_softcap c > 0 (Gemma 2; nanochat's 15)]
// Parameters: "embed.fields.<i>.table", "pos.table" (learned positions), "blocks.<l>.*",
// "ln_f.*", "head.w" (C, V), no head bias.
//
// Tied embedding and head (tie_embeddings; nanoGPT's and llm.c's wte.weight = lm_head.weight,
// Press & Wolf 2017): the head reads the token table W_e (V, C) as its weight,
//   logits = norm_f(x) W_eᵀ                      (B,T,C) x (V,C)ᵀ -> (B,T,V)
// through the linear op with its weight stored (Out, In) (no transposed copy). There is no
// "head.w": W_e is listed once ("embed.fields.0.table"), so the optimiser, the checkpoint and the
// grad norm see it once, and its grad is the sum of its two uses (the embedding's scatter-add and
// the head's dW = dlogitsᵀ h, each added in by the backward). Needs one token field whose
// vocabulary is the head's (vocab_sizes = {out_vocab}).
//
// Initialisation (explicit, documented, independent of the attention options): from one Rng, in
// this order: the field tables N(0, 1), the learned position table N(0, 1), then per block
// w_q, w_k, w_v, w_o, mlp.fc1.w, mlp.fc2.w from N(0, 1/fan_in), then head.w from N(0, 1/C).
// Tied: the shared table is drawn N(0, 1) and scaled to N(0, 1/C), the head's variance (logits
// start at unit variance; nanoGPT draws both at 0.02 ≈ 1/√768), and there is no head.w draw.
// Biases and norm shifts start at 0, norm gains at 1, log_scale at log of the mode's scale.
// The scaling mode, explicit scale, causal flag, qk_norm and learnable_scale never change a draw,
// so one seed gives every scaling mode identical initial weights.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "attnlab/nn/embedding.hpp"
#include "attnlab/nn/linear.hpp"
#include "attnlab/nn/positional.hpp"
#include "attnlab/nn/transformer_block.hpp"

namespace attnlab {

// One nested config: TransformerConfig ⊃ BlockConfig ⊃ AttentionConfig, one home per field
// (C and H live in block.attention). Validated once, in validate(); JSON in io/config_json.hpp.
struct TransformerConfig {
  std::vector<std::size_t> vocab_sizes;  // one vocabulary per input field (at least one)
  std::size_t max_len = 64;              // longest sequence (size of the position table)
  std::size_t layers = 2;                // number of blocks
  std::size_t out_vocab = 0;             // V, the classes of the head
  // EnumTable<PositionEncoding>. rope turns on every block's attention.rope (its base and
  // fraction are block.attention.rope_theta and rope_fraction); block.attention.rope itself stays
  // false in the config, this field being its one home.
  PositionEncoding positions = PositionEncoding::learned;
  // Every block's shape: C = block.attention.d_model, H = block.attention.heads, F = block.d_ff.
  BlockConfig block = default_block();
  // Output-logit softcap c: logits = c · tanh(logits / c) (attnlab/ops/softcap.hpp), in every
  // forward (training, evaluation, generation); 0 = none. Finite and > 0 when set.
  double logit_softcap = 0;
  // The head shares the token table (see above): one field, vocab_sizes[0] == out_vocab.
  bool tie_embeddings = false;

  // Throws std::invalid_argument whose message names the field by its path, e.g.
  // "TransformerConfig: block.attention.d_model expected divisible by heads (4) when d_k is 0
  // (derived), got 30".
  void validate() const;
  std::size_t d_model() const { return block.attention.d_model; }
  // The blocks' config as the model builds them: block with attention.rope = (positions == rope).
  BlockConfig block_config() const;

  // C 64, H 4, F 256, LayerNorm, MLP on.
  static BlockConfig default_block();
};

// Model FLOPs of one training step (forward + backward) per token at sequence length seq_len:
// nanoGPT's estimate_mfu formula with N restricted to the matmul weights, as the PaLM paper counts
// them (Chowdhery et al. 2022, appendix B):
//   6 · N + 6 · L · H · T · (D + Dv)
// N: the weights of every matmul (w_q, w_k, w_v, w_o, the MLP's fc1.w and fc2.w, head.w, or the
// tied table in its use as the head; not the embedding and position tables in their use as
// lookups, nor biases and norms); the second term is QKᵀ
// and PV (2 · T · D and 2 · T · Dv multiply-adds per query and head, times 3 for the backward), at
// the full T even when attention is causal (the convention; causal kernels do about half). For
// D = Dv it is nanoGPT's 6N + 12·L·H·D·T. Throws std::invalid_argument for an invalid config or
// seq_len 0. MFU = flops_per_token · tokens/s / the machine's measured peak (blas.hpp).
double transformer_flops_per_token(const TransformerConfig& config, std::size_t seq_len);

// A parameter's name (as collect_parameters gives it, "blocks.0.attn.w_q") and shape.
struct ParameterShape {
  std::string name;
  std::vector<std::size_t> shape;
  bool operator==(const ParameterShape&) const = default;
};

// The parameters a Transformer<T>(config) holds, in collect_parameters' order, worked out from the
// config without building it: what a checkpoint's tensors are checked against before a model is
// allocated, and what a memory estimate counts. Validates config.
std::vector<ParameterShape> transformer_parameter_shapes(const TransformerConfig& config);

// The number of parameters of transformer_parameter_shapes(config), as a double (no overflow).
double transformer_parameter_count(const TransformerConfig& config);

// The decoding state of a Transformer: one KV cache per block; every block has seen length()
// tokens, at positions 0 .. length() - 1.
template <class T>
struct TransformerCache {
  std::vector<KVCache<T>> layers;
  std::size_t length() const { return layers.empty() ? 0 : layers.front().length; }
  void clear() { layers.clear(); }
};

template <class T>
class Transformer : public Module<T> {
 public:
  // Validates the config, then draws every weight from `rng` (order above).
  Transformer(const TransformerConfig& config, Rng& rng);

  // fields: one (B, T) id tensor per vocabulary, ids in [0, vocab) or kNoToken (-1: absent);
  // key_mask: (B, T), true = may attend, or nullptr. Returns logits (B, T, out_vocab).
  // Throws std::invalid_argument on a wrong field count or T > max_len, ShapeError on mismatch.
  Tensor3<T> forward(const std::vector<TokenIds>& fields, const KeyMask* key_mask = nullptr);
  // The same on the backend: ids[i] (B, T) already there (upload_fields checks and copies them),
  // key_mask (B, T) bytes or nullptr. Returns the logits (B, T, out_vocab) there. layout: one
  // block mask and positions for every block's attention (SequenceLayout, e.g. document_layout
  // for packed documents: built once per batch, read by every layer), or nullptr. Its positions
  // need positions = rope (the learned and sinusoidal tables add 0 .. T−1): std::invalid_argument
  // otherwise.
  Buffer<T> forward(const std::vector<Buffer<int>>& ids,
                    const Buffer<unsigned char>* key_mask = nullptr,
                    const SequenceLayout* layout = nullptr);
  // Checks host fields as forward does (count, shapes, ids in range) and copies
  // them to the backend.
  std::vector<Buffer<int>> upload_fields(const std::vector<TokenIds>& fields) const;
  // Incremental decoding (generation with a KV cache): ids[i] (B, Tn) are Tn new tokens that
  // follow the cache's length() tokens, at positions length() .. length() + Tn - 1. Returns their
  // logits (B, Tn, out_vocab), equal to the last Tn rows of forward() over the whole sequence (to
  // rounding), at O(length() + Tn) attention cost per new token instead of O((length() + Tn)^2)
  // per step; appends their keys and values to the cache. Needs causal attention, and
  // length() + Tn <= max_len (std::invalid_argument otherwise, naming both). Inference only: no
  // dropout, and backward() after it throws std::logic_error (until the next forward()).
  Buffer<T> forward_cached(const std::vector<Buffer<int>>& ids, TransformerCache<T>& cache);
  // dlogits: (B, T, out_vocab) of the last forward. ADDS into every parameter's grad.
  // Throws std::logic_error before forward, ShapeError on mismatch.
  void backward(const Tensor3<T>& dlogits);
  void backward(const Buffer<T>& dlogits);

  void collect_parameters(const std::string& prefix, ParameterList<T>& out) override;
  const TransformerConfig& config() const { return config_; }
  std::size_t num_blocks() const { return blocks_.size(); }
  TransformerBlock<T>& block(std::size_t i) { return *blocks_.at(i); }
  const TransformerBlock<T>& block(std::size_t i) const { return *blocks_.at(i); }

  // Non-finite check for the trainer. When enabled (off by default: it costs one pass over each
  // activation and gradient), forward and backward record the first place whose output or
  // gradient holds a NaN or inf, e.g. "blocks.1.attn (head 2)" or "head"; forward clears the
  // record. first_nonfinite() is empty while everything was finite.
  void set_nonfinite_check(bool enabled);
  std::optional<std::string> first_nonfinite() const { return first_nonfinite_; }

 protected:
  void for_each_child(const std::function<void(Module<T>&)>& visit) override;
  void reset_cache() override { has_forward_ = false; }

 private:
  // forward (cache null: training context kept, key_mask applies) and forward_cached (positions
  // and attention go on from the cache): one pipeline, embed -> positions -> blocks -> ln_f ->
  // head.
  Buffer<T> run(const char* op, const std::vector<Buffer<int>>& ids,
                const Buffer<unsigned char>* key_mask, TransformerCache<T>* cache,
                const SequenceLayout* layout = nullptr);
  void note(const Buffer<T>& t, const std::string& where);
  // The head: Linear, or the tied table read as (V, C) = (Out, In).
  Buffer<T> head_forward(const Buffer<T>& x);
  Buffer<T> head_backward(const Buffer<T>& dy);

  TransformerConfig config_;
  MultiFieldEmbedding<T> embed_;
  PositionalEncoding<T> pos_;
  std::vector<std::unique_ptr<TransformerBlock<T>>> blocks_;
  std::unique_ptr<SequenceModule<T>> norm_f_;  // nullptr for Norm::none
  std::unique_ptr<Linear<T>> head_;            // nullptr when tied (the tied_* buffers)
  // The tied head (config.tie_embeddings): its input of the last forward (B,T,C), its output
  // (B,T,V), and the backward's dx (B,T,C); dW_e is added into the table's gradient in place.
  Buffer<T> tied_x_, tied_y_, tied_dx_;
  OperandKeep tied_keep_;  // tied_x_ and the table as the head's GEMMs use them
  // With logit_softcap: the capped logits of the last forward (the backward reads them) and the
  // gradient before the cap.
  Buffer<T> capped_, dcapped_;
  bool has_forward_ = false;
  std::size_t batch_ = 0, length_ = 0;
  bool check_nonfinite_ = false;
  std::optional<std::string> first_nonfinite_;
};

}  // namespace attnlab
