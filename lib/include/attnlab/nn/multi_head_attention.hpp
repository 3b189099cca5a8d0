// Multi-head attention on the hand-written core (ops/attention.hpp).
// Reference: Vaswani et al. 2017, §3.2.2; torch.nn.MultiheadAttention without biases.
//
//   Q = x W_q        (B,Tq,C)  x (C, H·D)   -> (B,Tq,H·D) -> heads (B,H,Tq,D)
//   K = ctx W_k      (B,Tk,Cc) x (Cc, Hkv·D)  -> (B,Tk,Hkv·D) -> heads (B,Hkv,Tk,D)
//   V = ctx W_v      (B,Tk,Cc) x (Cc, Hkv·Dv) -> (B,Tk,Hkv·Dv) -> heads (B,Hkv,Tk,Dv)
//   [optional QK-norm: Q, K <- LayerNorm over D per head, shared γ, β (ViT-22B, Dehghani et al.
//    2023; Wortsman et al. 2023)]
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
#pragma once

#include <optional>

#include "attnlab/nn/module.hpp"
#include "attnlab/ops/attention.hpp"
#include "attnlab/ops/layernorm.hpp"
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
  SdpaOptions sdpa;           // scaling mode, explicit scale, causal; head_scale must stay empty
  bool qk_norm = false;
  bool learnable_scale = false;
  // ALiBi (Press et al. 2022) with the paper's slopes 2^(-8(h+1)/H): a linear penalty on the
  // distance to each key, no position table needed (positions = none).
  bool alibi = false;
  // Dropout on the attention weights in training mode (Module::train()), p in [0, 1); none in
  // eval mode. Masks are keyed by Module::set_dropout_key.
  double dropout = 0.0;

  // Throws std::invalid_argument "<op>: <path><field> expected ..., got ...": zero sizes, a d_model
  // that heads do not divide when d_k or d_v is derived, a non-positive explicit scale, a
  // non-empty sdpa.head_scale. The one home of these rules (BlockConfig and TransformerConfig pass
  // their name and the path to here).
  void validate(std::string_view op = "AttentionConfig", const std::string& path = "") const;
  std::size_t head_dim_k() const { return d_k ? d_k : d_model / heads; }
  std::size_t head_dim_v() const { return d_v ? d_v : d_model / heads; }
  std::size_t context_dim() const { return d_context ? d_context : d_model; }
  std::size_t key_value_heads() const { return kv_heads ? kv_heads : heads; }
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
  // Validates the config, then draws w_q, w_k, w_v, w_o from `rng`.
  MultiHeadAttention(const AttentionConfig& config, Rng& rng);

  // Self-attention without a mask: forward(x) / backward(dy) from SequenceModule.
  using SequenceModule<T>::forward;
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
  // (backward(dy) after a cross forward returns dx only; dcontext() then holds the other.)
  CrossGrads backward_cross(const Tensor3<T>& dy);
  // (B, Tk, Cc) dL/dcontext of the last backward after a cross forward, on the backend.
  // Empty after a self-attention forward.
  Buffer<T> dcontext() const { return self_ ? Buffer<T>() : dcontext_; }

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

  // Inspection, copied to the host. (B,H,Tq,Tk) attention weights P of the last forward (0 at
  // hidden positions); empty before the first forward. After a fused-path forward (which keeps no
  // P) they are recomputed from the cached q, k, scales and mask.
  Tensor4<T> attention_weights() const;
  // (B,H,Tq,D) and (B,Hkv,Tk,D): the queries and keys the core saw in the last forward (after
  // QK-norm), for metrics such as the q·k variance; empty before the first forward.
  Tensor4<T> queries() const;
  Tensor4<T> keys() const;
  // (B,H,Tq,Tk) the scaled logits S = s · Q Kᵀ of the last forward, hidden positions at -inf
  // (recomputed from the cached q, k, scales and mask; for saturation metrics). Throws
  // std::logic_error before any forward.
  Tensor4<T> attention_scores() const;
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

 protected:
  Buffer<T> forward_impl(const Buffer<T>& x) override;
  Buffer<T> backward_impl(const Buffer<T>& dy) override;
  void reset_cache() override;

 private:
  Buffer<T> attend(const Buffer<T>& x, const Buffer<T>& context,
                   const Buffer<unsigned char>* key_mask, bool self, KVCache<T>* cache = nullptr);
  AttentionParams<T> params() const;
  SdpaOptions used_options() const;  // the options of the last forward, its scales included
  // x: (B, T, C) checked; key_mask: (B, Tk) checked and copied to the backend as bytes.
  Buffer<unsigned char> upload_mask(const KeyMask* key_mask, std::size_t B, std::size_t Tk);

  AttentionConfig config_;
  std::size_t H_, Hkv_, D_, Dv_;
  bool self_ = true;
  // The last forward.
  AttentionSpec spec_;
  bool fused_ = false, has_forward_ = false;
  bool cached_ = false;         // the last forward was forward_cached (no backward)
  Buffer<T> x_, context_;       // inputs (queries, keys/values)
  Buffer<unsigned char> mask_;  // (B, Tk) or empty
  Buffer<T> proj_, q_raw_, k_raw_, q_mean_, q_rstd_;  // projections; QK-norm inputs and stats
  Buffer<T> k_mean_, k_rstd_;
  Buffer<T> q_, k_, v_;                 // (B,H,T,·) as fed to the core
  Buffer<T> scale_;                     // (H,) the scale of each head
  Buffer<T> alibi_;                     // (H,) ALiBi's slopes, with alibi
  Buffer<T> p_, lse_, o_, merged_, y_;  // P or LSE, O, merged heads, output
  // Backward buffers.
  Buffer<T> dmerged_, dout_, dq_, dk_, dv_, ds_, dq_raw_, dk_raw_, dw_, dnorm_, dlog_scale_;
  Buffer<T> dx_, dcontext_, dcontext_v_;
};

// (B,T,H·D) -> (B,H,T,D): one contiguous D-row copy per (b, t, h).
template <class T>
Tensor4<T> split_heads(const Tensor3<T>& x, std::size_t heads);
// (B,H,T,D) -> (B,T,H·D), the inverse.
template <class T>
Tensor3<T> merge_heads(const Tensor4<T>& x);

}  // namespace attnlab
