// Multi-head attention on the hand-written core (ops/attention.hpp).
// Reference: Vaswani et al. 2017, §3.2.2; torch.nn.MultiheadAttention without biases.
//
//   Q = x W_q        (B,Tq,C)  x (C, H·D)   -> (B,Tq,H·D) -> heads (B,H,Tq,D)
//   K = ctx W_k      (B,Tk,Cc) x (Cc, Hkv·D)  -> (B,Tk,Hkv·D) -> heads (B,Hkv,Tk,D)
//   V = ctx W_v      (B,Tk,Cc) x (Cc, Hkv·Dv) -> (B,Tk,Hkv·Dv) -> heads (B,Hkv,Tk,Dv)
//   [optional QK-norm: Q, K <- LayerNorm over D per head, shared γ, β (ViT-22B, Dehghani et al.
//    2023; Wortsman et al. 2023)]
//   [optional RoPE: Q, K <- each row rotated by its position (ops/rope.hpp), after QK-norm]
//   O = sdpa(Q, K, V) (B,H,Tq,Dv) -> merged (B,Tq,H·Dv)
//   y = O W_o        (B,Tq,H·Dv) x (H·Dv, C) -> (B,Tq,C)
// ctx = x for self-attention. d_model C, heads H, d_k D and d_v Dv are independent. kv_heads Hkv
// (dividing H) shrinks W_K and W_V: query head h reads K/V head h / (H / Hkv) (grouped-query
// attention, Ainslie et al. 2023; Hkv = 1 is multi-query attention). Hkv = H (the default) is
// standard multi-head attention.
//
// Parameters: "w_q", "w_k", "w_v", "w_o" drawn from N(0, 1/fan_in) in that order (so q·k has
// variance ≈ D at init for unit-RMS inputs); with qk_norm also "q_norm.gamma", "q_norm.beta",
// "k_norm.gamma", "k_norm.beta" (D,); with learnable_scale also "log_scale" (H,), initialised to
// log of the mode's scale and fed to the core as SdpaOptions::head_scale = exp(log_scale).
// None of the options changes the random draws: one seed gives the same weights in every mode.
//
// Attention programs (attnlab/attention/program.hpp) in the layer:
//  - set_score_program: the layer's score function f(u, b, h, i, j, params) with its captured
//    parameters as the layer's own Parameters "program.<name>" (optimizers update them,
//    checkpoints save them); their gradients are the op's SdpaGrads::dprogram. On a device
//    backend, with the program's GPU launchers (ScoreProgramSpec::device_program), the layer runs
//    the GPU op's program paths over its own device buffers (sdpa_program_forward_device /
//    sdpa_program_backward_device, attnlab/ops/attention_cuda.hpp): nothing crosses to the host.
//  - SequenceLayout, per forward: a block mask (built once per batch, e.g. for packed documents,
//    and read by every layer) and per-token RoPE positions. The model builds one layout per
//    batch and hands the same pointer to every block's forward; each layer's Context keeps the
//    block mask (a shared_ptr) for its backward. On a device backend a layout from
//    document_layout runs the backend's own document mask (DeviceOps::document_mask_program).
// On a CPU backend a forward with either runs the host op (sdpa_forward / sdpa_backward) on the
// layer's buffers.
#pragma once

#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "attnlab/nn/module.hpp"
#include "attnlab/operand_keep.hpp"
#include "attnlab/ops/attention.hpp"
#include "attnlab/ops/layernorm.hpp"
#include "attnlab/ops/rope.hpp"
#include "attnlab/random.hpp"

namespace attnlab {

struct AttentionConfig {
  std::size_t d_model = 0;    // C, width of the queries' input and of the output
  std::size_t heads = 1;      // H, the query heads
  std::size_t kv_heads = 0;   // Hkv, the key/value heads, dividing H (grouped-query attention;
                              // 1: multi-query); 0: heads
  std::size_t d_k = 0;        // D; 0: d_model / heads (d_model must then divide evenly)
  std::size_t d_v = 0;        // Dv; 0: d_model / heads (same rule)
  std::size_t d_context = 0;  // Cc, width of the keys'/values' input (cross-attention); 0: d_model
  SdpaConfig sdpa;            // scaling mode, explicit scale, causal, window, path
  bool qk_norm = false;
  bool learnable_scale = false;
  // ALiBi (Press et al. 2022) with the paper's slopes 2^(-8(h+1)/H): a linear penalty on the
  // distance to each key, no position table needed (positions = none).
  bool alibi = false;
  // Dropout on the attention weights in training mode (Module::train()), p in [0, 1); none in
  // eval mode. Masks are keyed by Module::set_dropout_key.
  double dropout = 0.0;
  // Rotary positions (Su et al. 2021; attnlab/ops/rope.hpp) on q and k per head, self-attention
  // only: base rope_theta, the first ⌊rope_fraction · D⌋ dims (even), half-split pairs unless
  // rope_interleaved. With qk_norm the rotation follows the norm (it turns the normalised
  // vectors, as nanochat does). With a KV cache the new tokens' positions continue from its
  // length, and the cache keeps rotated keys. In a Transformer, model.positions = rope sets it.
  bool rope = false;
  double rope_theta = 10000.0;
  double rope_fraction = 1.0;
  bool rope_interleaved = false;

  // Throws std::invalid_argument "<op>: <path><field> expected ..., got ...": zero sizes, a d_model
  // that heads do not divide when d_k or d_v is derived, kv_heads not dividing heads, a dropout
  // outside [0, 1), and whatever resolve_sdpa refuses of sdpa (a non-positive explicit scale, a
  // window or query offset without causal), which it checks by resolving the layer's call: the
  // rules of the options live there once. BlockConfig and TransformerConfig pass their name and
  // the path to here.
  void validate(std::string_view op = "AttentionConfig", const std::string& path = "") const;
  std::size_t head_dim_k() const { return d_k ? d_k : d_model / heads; }
  std::size_t head_dim_v() const { return d_v ? d_v : d_model / heads; }
  std::size_t context_dim() const { return d_context ? d_context : d_model; }
  std::size_t key_value_heads() const { return kv_heads ? kv_heads : heads; }
  RopeOptions rope_options() const { return {rope_theta, rope_fraction, rope_interleaved}; }
};

// What one forward gives every self-attention layer beside its input, built once per batch by the
// caller (document_layout for packed documents) and passed by pointer down the model.
struct SequenceLayout {
  // Which keys each query sees, built for this forward's (B, ·, T, T) from a mask program that
  // does not read h (one mask serves every layer's heads; a mask that reads h needs the layers'
  // H). It replaces the layer's causal rule for this forward (the mask carries its own causality,
  // as masks::Document with causal does) and needs window = 0. The fused path skips its empty
  // tiles; with path auto a layer takes the fused path from kSdpaFusedMinKeysCausal keys, as for
  // causal attention.
  std::shared_ptr<const attention::BlockMask> block_mask;
  // (B·T) each token's RoPE position, row-major; empty: 0 .. T−1 in every row. Read by layers
  // with rope (others ignore it).
  std::vector<std::size_t> positions;
  // (B·T) the packed documents' ids behind block_mask (document_layout fills it), row-major: a
  // layer on a device backend uploads them and runs the mask in its GPU kernels
  // (DeviceOps::document_mask_program). Empty for a layout of another mask, which a device
  // backend refuses.
  std::vector<std::int32_t> documents;

  // block_mask at tile_rows × tile_keys (a device's fused kernels' tile): block_mask itself when
  // it has them, else built from its program on first use and kept with the layout (and its
  // copies), so every layer of a forward shares one build. Safe to call from several threads.
  std::shared_ptr<const attention::BlockMask> block_mask_at(std::size_t tile_rows,
                                                            std::size_t tile_keys) const;

 private:
  struct Tiles {  // the masks block_mask_at built
    std::mutex lock;
    std::vector<std::shared_ptr<const attention::BlockMask>> built;
  };
  std::shared_ptr<Tiles> tiles_ = std::make_shared<Tiles>();
};

// The layout of packed documents: documents (B·T) holds each token's document id, row-major
// (ids compare within a row only); query i sees key j of the same document with j ≤ i
// (attention::document_mask, causal). With restart_positions, each token's position is its
// offset from the first token of its document's run in the row, so RoPE restarts at every
// document; otherwise positions stay empty. The block mask is built for tile_rows × tile_keys
// (0: the fused path's defaults). Throws std::invalid_argument for B·T ≠ documents.size() or a
// zero size.
SequenceLayout document_layout(std::vector<std::int32_t> documents, std::size_t B, std::size_t T,
                               bool restart_positions, std::size_t tile_rows = 0,
                               std::size_t tile_keys = 0);

// The tile (rows, keys) at which a MultiHeadAttention with config c on backend ops reads a
// layout's block mask: c.sdpa's tiles on a CPU backend (0: the fused path's defaults), the fused
// kernels' tile on a device (c.sdpa's tiles when the kernels cannot take c's head dims). A layout
// built at it (document_layout's tile_rows, tile_keys) is the one the layers use: one build per
// batch.
template <class T>
std::pair<std::size_t, std::size_t> layout_tiles(DeviceOps<T>& ops, const AttentionConfig& c);

// A score program for MultiHeadAttention::set_score_program: the program, and its captured
// parameters as (name, initial values); the program reads parameter k as params(k, index).
// device_program: its GPU launchers (attnlab/attention/device_program.hpp), which a layer on a
// device backend needs; the CPU paths ignore them.
struct ScoreProgramSpec {
  std::shared_ptr<const attention::ScoreProgram> program;
  std::vector<std::pair<std::string, std::vector<double>>> params;
  std::shared_ptr<const cuda::DevicePrograms> device_program = {};
};

// The keys and values of the tokens one attention layer has seen, for incremental decoding (a KV
// cache): k (B, Hkv, length, D) after QK-norm and v (B, Hkv, length, Dv), on the layer's backend.
// Appending copies the old rows and the new ones into the second of two buffers that take turns
// (O(length · Hkv · D) per call, like the attention itself); capacity grows by doubling, so a
// decode loop stops allocating once it has reached its longest context.
template <class T>
struct KVCache {
  Buffer<T> k, v;
  std::size_t length = 0;

  // Appends k_new (B, Hkv, n, D) and v_new (B, Hkv, n, Dv). Throws std::invalid_argument when B,
  // Hkv, D or Dv differ from the cached ones.
  void append(DeviceOps<T>& ops, const Buffer<T>& k_new, const Buffer<T>& v_new);
  void clear() { *this = KVCache(); }

 private:
  Buffer<T> slots_k_[2], slots_v_[2];
  int current_ = 0;
  std::size_t capacity_ = 0;  // tokens the slots hold
};

template <class T>
class MultiHeadAttention : public SequenceModule<T> {
 public:
  // What one forward keeps for its backward (tiny-cuda-nn's forward context): the inputs, the
  // projections after QK-norm, the scales, and P or the log-sum-exp. A caller holds one per forward
  // in flight and hands it to backward; passing the same context to the next forward reuses its
  // buffers (a training loop allocates nothing per step). The module's own forward(x) and
  // backward(dy) keep one internally. Its fields are the layer's own.
  class Context {
   public:
    bool empty() const { return !valid_; }
    bool cross() const { return !self_; }  // made by forward_cross

   private:
    friend class MultiHeadAttention;
    bool valid_ = false, self_ = true, fused_ = false;
    bool cached_ = false;  // made by forward_cached: no backward
    AttentionSpec spec_;
    Buffer<T> x_, context_;                                        // inputs (queries, keys/values)
    Buffer<unsigned char> mask_;                                   // (B, Tk) or empty
    Buffer<T> q_raw_, k_raw_, q_mean_, q_rstd_, k_mean_, k_rstd_;  // QK-norm inputs and stats
    Buffer<T> q_, k_, v_;                                          // (B,H,T,·) as fed to the core
    Buffer<T> scale_;                                              // (H,) the scale of each head
    Buffer<T> p_, lse_, o_, merged_;                               // P or LSE, O, merged heads
    SdpaOptions options_;  // the call's options (head scales aside)
    // With a program (a score program or a layout's block mask): the host op's cache, and the
    // tokens' RoPE positions when the layout gives them.
    bool program_ = false;
    SdpaCache<T> sdpa_;
    std::vector<std::size_t> positions_;
    Buffer<int> documents_;  // on a device backend: the layout's document ids (B, T)
    // x_, context_, merged_ and the weights as the backend's projections use them (the CPU's bf16
    // roundings), from project_qkv's clear() to the backward.
    mutable OperandKeep keep_;
  };

  // The gradients of a backward with respect to the inputs; the parameter grads are ADDED into.
  struct Grads {
    Buffer<T> dx;        // (B, Tq, C); self-attention: through the queries, keys and values
    Buffer<T> dcontext;  // (B, Tk, Cc) after a cross forward; empty after self-attention
  };

  // Validates the config, then draws w_q, w_k, w_v, w_o from `rng`.
  MultiHeadAttention(const AttentionConfig& config, Rng& rng);

  // Self-attention without a mask: forward(x) / backward(dy) from SequenceModule.
  using SequenceModule<T>::forward;
  using SequenceModule<T>::backward;
  // Self-attention. x: (B, T, C); key_mask: (B, T), true = may attend (PyTorch SDPA polarity), or
  // nullptr. Returns (B, T, C).
  Tensor3<T> forward(const Tensor3<T>& x, const KeyMask* key_mask);
  // The same on the backend; key_mask (B, T) bytes, nonzero = may attend, or nullptr.
  Buffer<T> forward(const Buffer<T>& x, const Buffer<unsigned char>* key_mask);
  // Cross-attention: queries from x (B, Tq, C), keys and values from context (B, Tk, Cc);
  // key_mask: (B, Tk), true = may attend, or nullptr. Returns (B, Tq, C).
  Tensor3<T> forward_cross(const Tensor3<T>& x, const Tensor3<T>& context,
                           const KeyMask* key_mask = nullptr);
  Buffer<T> forward_cross(const Buffer<T>& x, const Buffer<T>& context,
                          const Buffer<unsigned char>* key_mask = nullptr);

  struct CrossGrads {
    Tensor3<T> dx;        // (B, Tq, C)
    Tensor3<T> dcontext;  // (B, Tk, Cc)
  };
  // Backward of forward_cross: returns dx and dcontext, ADDS into the parameter grads.
  // (backward(dy) after a cross forward throws std::logic_error: it would have to drop dcontext.)
  CrossGrads backward_cross(const Tensor3<T>& dy);

  // The context forms: any number of forwards in flight, each with its own context. `ctx` is
  // filled (its buffers reused); backward(ctx, dy) runs the reverse of that forward. Self-attention
  // when context is nullptr. Throws std::logic_error for an empty context or one of
  // forward_cached. layout: this forward's block mask and positions (self-attention only), or
  // nullptr.
  Buffer<T> forward(Context& ctx, const Buffer<T>& x, const Buffer<T>* context,
                    const Buffer<unsigned char>* key_mask, const SequenceLayout* layout = nullptr);
  // Self-attention with a layout (the module's own context, as forward(x, key_mask)).
  Buffer<T> forward(const Buffer<T>& x, const Buffer<unsigned char>* key_mask,
                    const SequenceLayout* layout);

  // The layer's score program (see the file comment). Registers spec.params as the Parameters
  // "program.<name>" (after the others, in the given order): call it before the module moves to
  // a backend (Module::to) and before its parameters are handed to an optimizer (std::logic_error
  // otherwise). Throws std::invalid_argument for a null program, an empty, repeated or dotted
  // name, empty values, or a layer with alibi or sdpa.softcap (give them in the program).
  void set_score_program(ScoreProgramSpec spec);
  bool has_score_program() const { return score_program_ != nullptr; }
  Grads backward(const Context& ctx, const Buffer<T>& dy);

  // Incremental decoding. x (B, Tn, C): Tn new tokens that follow the cache's `length` ones.
  // Projects their queries, keys and values, appends the keys and values to the cache, and attends
  // causally with the query offset `length`: the new queries are aligned with the last keys
  // (bottom-right, PyTorch's causal_lower_right), the score rule every path shares. The result
  // equals the last Tn rows of forward() over all length + Tn tokens, to rounding. Needs causal
  // attention (std::invalid_argument otherwise: an earlier token would have to see later ones).
  // Inference only: no dropout, and backward() after it throws std::logic_error.
  Buffer<T> forward_cached(const Buffer<T>& x, KVCache<T>& cache);

  void collect_parameters(const std::string& prefix, ParameterList<T>& out) override;
  std::size_t in_features() const override { return config_.d_model; }
  std::size_t out_features() const override { return config_.d_model; }
  std::string_view type_name() const override { return "MultiHeadAttention"; }
  const AttentionConfig& config() const { return config_; }

  // Inspection of a forward (the module's last one without an argument), copied to the host.
  // (B,H,Tq,Tk) attention weights P (0 at hidden positions); empty before the first forward. After
  // a fused-path forward (which keeps no P) they are recomputed from the kept q, k, scales and
  // mask.
  Tensor4<T> attention_weights() const { return attention_weights(last_); }
  Tensor4<T> attention_weights(const Context& ctx) const;
  // (B,H,Tq,D) and (B,Hkv,Tk,D): the queries and keys the core saw (after QK-norm and RoPE), for
  // metrics such as the q·k variance; empty before the first forward.
  Tensor4<T> queries() const { return queries(last_); }
  Tensor4<T> queries(const Context& ctx) const;
  Tensor4<T> keys() const { return keys(last_); }
  Tensor4<T> keys(const Context& ctx) const;
  // (B,H,Tq,Tk) the scaled logits S = s · Q Kᵀ, hidden positions at -inf (recomputed from the kept
  // q, k, scales and mask; for saturation metrics). Throws std::logic_error before any forward.
  Tensor4<T> attention_scores() const { return attention_scores(last_); }
  Tensor4<T> attention_scores(const Context& ctx) const;
  // (H,) the scale of each head for the next forward (exp(log_scale) with a learnable scale).
  std::vector<double> head_scales() const;
  // The SdpaOptions of the next forward (with head_scale filled for a learnable scale), as the
  // host op sdpa_forward would take them.
  SdpaOptions sdpa_options() const;

  Parameter<T> w_q;                                                   // (C, H·D)
  Parameter<T> w_k;                                                   // (Cc, Hkv·D)
  Parameter<T> w_v;                                                   // (Cc, Hkv·Dv)
  Parameter<T> w_o;                                                   // (H·Dv, C)
  Parameter<T> q_norm_gamma, q_norm_beta, k_norm_gamma, k_norm_beta;  // (D,) with qk_norm
  Parameter<T> log_scale;                                             // (H,) with learnable_scale
  // The score program's captured parameters (set_score_program), in its order.
  Parameter<T>& program_parameter(std::size_t k) { return *program_params_.at(k); }
  std::size_t program_parameter_count() const { return program_params_.size(); }

 protected:
  Buffer<T> forward_impl(const Buffer<T>& x) override;
  Buffer<T> backward_impl(const Buffer<T>& dy) override;
  void reset_cache() override;

 private:
  // The steps of a forward (attend) and of its backward, in order.
  Buffer<T> attend(Context& ctx, const Buffer<T>& x, const Buffer<T>& context,
                   const Buffer<unsigned char>* key_mask, bool self, KVCache<T>* cache = nullptr,
                   const SequenceLayout* layout = nullptr);
  void resolve_call(Context& ctx, std::size_t B, std::size_t Tq, std::size_t Tk, KVCache<T>* cache,
                    const SequenceLayout* layout);
  void bind_programs(Context& ctx, SdpaOptions& options, std::size_t B, std::size_t Tq,
                     std::size_t Tk, KVCache<T>* cache, const SequenceLayout* layout);
  void bind_device_documents(Context& ctx, SdpaOptions& options, std::size_t B, std::size_t Tn,
                             const SequenceLayout& layout);
  // The program path of the core (ctx.program_): the host op over the layer's buffers.
  void program_forward(Context& ctx);
  void program_backward(const Context& ctx, const Buffer<T>& dout);
  // RoPE on (B, heads, Tn, D) at ctx.positions_ (or offset .. offset + Tn − 1 when empty).
  void rotate_heads(const Context& ctx, T* x, std::size_t heads, std::size_t Tn, std::size_t offset,
                    bool inverse);
  void project_qkv(Context& ctx, std::size_t Tnew, KVCache<T>* cache);
  void bind_scales(Context& ctx);
  void core_forward(Context& ctx);
  Buffer<T> project_out(Context& ctx);
  const Buffer<T>& backward_out(const Context& ctx, const Buffer<T>& dy);
  void backward_core(const Context& ctx, const Buffer<T>& dout);
  void backward_rope(const Context& ctx);
  void backward_qk_norm(const Context& ctx);
  // Rotates `heads` slices of Tn rows of D (positions offset ..) in place; the inverse for the
  // backward. Grows the cos/sin tables on the backend first when they are too short.
  void rotate(T* x, std::size_t slices, std::size_t Tn, std::size_t offset, bool inverse);
  Grads backward_projections(const Context& ctx);

  AttentionParams<T> params(const Context& ctx) const;  // attention_params over ctx's buffers
  // The layer's own options, before a call adds its offset, dropout or scales: config_.sdpa and
  // ALiBi's slopes. Every SdpaOptions of the layer starts here.
  SdpaOptions layer_options() const;
  SdpaOptions options_of(const Context& ctx) const;  // the options of that forward, its scales in
  static KeyMask mask_to_host(const Buffer<unsigned char>& mask);  // (B, Tk) bytes -> bools
  // x: (B, T, C) checked; key_mask: (B, Tk) checked and copied to the backend as bytes.
  Buffer<unsigned char> upload_mask(const KeyMask* key_mask, std::size_t B, std::size_t Tk);

  AttentionConfig config_;
  std::size_t H_, Hkv_, D_, Dv_;
  Context last_;                   // the forward of forward(x), forward_cross and forward_cached
  Buffer<T> fixed_scale_;          // (H,) the resolved scale without learnable_scale, uploaded once
  Buffer<T> alibi_;                // (H,) ALiBi's slopes, with alibi, uploaded once
  Buffer<T> rope_cos_, rope_sin_;  // (positions, rot/2) with rope, grown by doubling
  std::size_t rope_positions_ = 0, rope_dims_ = 0;
  // Scratch of one call (no state between calls): projections and the backward's buffers.
  Buffer<T> proj_, y_;
  Buffer<T> dmerged_, dout_, dq_, dk_, dv_, ds_, dq_raw_, dk_raw_, dnorm_, dlog_scale_;
  Buffer<T> dx_, dcontext_, dcontext_v_;
  // set_score_program's program and parameters (stable addresses: the parameter list points in).
  std::shared_ptr<const attention::ScoreProgram> score_program_;
  std::shared_ptr<const cuda::DevicePrograms> device_program_;
  std::vector<std::string> program_names_;
  std::vector<std::unique_ptr<Parameter<T>>> program_params_;
};

// (B,T,H·D) -> (B,H,T,D): one contiguous D-row copy per (b, t, h).
template <class T>
Tensor4<T> split_heads(const Tensor3<T>& x, std::size_t heads);
// (B,H,T,D) -> (B,T,H·D), the inverse.
template <class T>
Tensor3<T> merge_heads(const Tensor4<T>& x);

}  // namespace attnlab
