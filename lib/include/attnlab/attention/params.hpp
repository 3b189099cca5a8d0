// The one parameter struct of scaled dot-product attention. Every path takes an AttentionParams:
// the CPU reference and fused paths (lib/src/ops/attention_*.cpp), the CUDA reference and fused
// kernels (lib/backends/cuda/attention_*), and the emulated CUDA kernels of the tests. The score
// rule that reads it is attnlab/attention/score_rule.hpp. Modelled on FlashAttention's
// Flash_fwd_params (Dao-AILab flash-attention, csrc/flash_attn/src/flash.h): one struct carries
// every variant; a variant adds its fields here and its arithmetic as one helper of the rule.
//
// The contract is that of lib/README.md, "The attention API", and of
// attnlab/ops/attention.hpp. Compiles under nvcc (C++17) and without xtensor; no CUDA type.
#pragma once

#include <cstddef>
#include <cstdint>
#include <limits>
#include <stdexcept>
#include <string>

#include "attnlab/kernel_math.hpp"  // ATTNLAB_HD

namespace attnlab {

namespace attention {  // attnlab/attention/program.hpp: the CPU paths' programs
class ScoreProgram;
class MaskProgram;
class BlockMask;
template <class T>
struct ProgramArgs;
}  // namespace attention

// The sizes of one attention call: q (B,H,Tq,D), k (B,Hkv,Tk,D), v (B,Hkv,Tk,Dv).
struct AttentionSizes {
  std::size_t B = 0, H = 0, Hkv = 0, Tq = 0, Tk = 0, D = 0, Dv = 0;
};

// The variant choices of the score rule: the ONE declaration of each, shared by every link of the
// option chain. SdpaConfig (a layer's choices and a run config's spelling,
// attnlab/ops/attention.hpp) derives from it, so does the AttentionSpec that every path reads;
// resolve_sdpa copies it whole (and AttentionDropout, below, beside it). A new variant field is
// declared here, checked in check_attention_variant below, and read by its helper in the score rule
// (attnlab/attention/score_rule.hpp); a run config spells it in lib/src/io/config_json.cpp.
struct AttentionVariant {
  // Causal with a query offset o: query i sees key j iff j <= i + o. o = 0 is PyTorch's is_causal
  // (top-left aligned); o = Tk - Tq is causal_lower_right (bottom-right aligned), the case of Tq
  // new queries decoding against Tk cached keys. The offset is 0 unless causal.
  bool causal = false;
  std::size_t query_offset = 0;

  // Sliding window w (causal only): query i sees keys j with i + o - w < j <= i + o, its w latest,
  // itself included (Beltagy et al. 2020, Mistral); 0 = no window. The fused paths skip the key
  // tiles outside the band.
  std::size_t window = 0;
  // Score softcap c (Gemma 2 uses 50; FlashAttention's `softcap`): the scaled dot u = s_h · q·k
  // becomes c · tanh(u / c) before ALiBi's term and the bias are added
  // (attnlab/attention/score_rule.hpp); the backward multiplies dS by 1 − tanh²(u / c). Finite and
  // >= 0; 0 = no cap.
  double softcap = 0.0;
};

// Dropout on the attention weights (after the softmax, before P V), in training: weight (b,h,i,j)
// is kept with probability 1 - p and scaled by 1 / (1 - p), its mask drawn from dropout_seed by
// attnlab/attention/dropout.hpp (regenerated in the backward, the same on every path). p in
// [0, 1); 0 = no dropout. Per call only, apart from the variant: a layer's config never holds it
// (it would apply in evaluation too); the layer sets it in training (AttentionConfig::dropout).
struct AttentionDropout {
  double dropout_p = 0.0;
  std::uint64_t dropout_seed = 0;
};

// The sizes and variant choices of one attention call, without pointers: what a cache keeps.
struct AttentionSpec : AttentionSizes, AttentionVariant, AttentionDropout {
  // The query heads per K/V head (1 without grouped-query attention).
  ATTNLAB_HD std::size_t group() const { return H / Hkv; }
  // The K/V head that query head h reads (grouped-query attention: H / Hkv query heads share one).
  ATTNLAB_HD std::size_t kv_head_of(std::size_t h) const { return h / (H / Hkv); }
  // The flattened (b, kv head) slice of k and v that the (b, h) slice bh = b·H + h of q reads.
  ATTNLAB_HD std::size_t kv_slice_of(std::size_t bh) const {
    return bh / H * Hkv + kv_head_of(bh % H);
  }
};

// One call: the spec plus the pointers of its inputs (host memory for the CPU paths, device memory
// for the CUDA ones), contiguous and row-major.
template <class T>
struct AttentionParams : AttentionSpec {
  const T* q = nullptr;                     // (B,H,Tq,D)
  const T* k = nullptr;                     // (B,Hkv,Tk,D)
  const T* v = nullptr;                     // (B,Hkv,Tk,Dv)
  const T* scale = nullptr;                 // (H,) the scale s_h of each query head
  const unsigned char* key_mask = nullptr;  // (B,Tk) nonzero = may attend; nullptr: no mask
  // (H,) ALiBi (Press et al. 2022): the score of a visible key gets -m_h · (i + o - j), computed
  // on the fly (the fused paths keep O(T) memory); nullptr: no ALiBi.
  const T* alibi_slopes = nullptr;

  // Additive bias (relative-position or learned biases): a visible key's score gets
  // bias(b,h,i,j), stored with rows of Tk contiguous at b·bias_batch_stride + h·bias_head_stride +
  // i·Tk + j (a stride of 0 broadcasts over that axis); nullptr: no bias. A bias of -inf hides a
  // key as the mask does.
  const T* bias = nullptr;
  std::size_t bias_batch_stride = 0, bias_head_stride = 0;

  // Backward output, optional: when set, the backward writes dS = dL/dS (B,H,Tq,Tk), the gradient
  // of the scores before the scale (and after the softcap: the cap's slope is not in it), which is
  // the gradient of an additive bias before the sums
  // over its broadcast axes. The fused paths write the tiles they visit and leave the rest (keys
  // the rule hides from a whole tile): pass zeroed memory.
  T* dscores = nullptr;

  // Attention programs (attnlab/attention/program.hpp), host objects read by the CPU paths only:
  // the raw device calls refuse them, and the CUDA op runs programs through the kernels compiled
  // for them (attnlab/attention/device_program.hpp), not through these. score_program maps each
  // visible scaled dot u to f(u); mask_program hides keys; block_mask (with mask_program, built for
  // this call's sizes) lets the fused path skip tiles and fixes its tile sizes. program_args: the
  // captured parameters' values; program_grads (backward, optional): one row of all parameters'
  // elements per K/V slice (B·Hkv rows of program_grad_width), each summed in a fixed order, for
  // the caller to reduce.
  const attention::ScoreProgram* score_program = nullptr;
  const attention::MaskProgram* mask_program = nullptr;
  const attention::BlockMask* block_mask = nullptr;
  const attention::ProgramArgs<T>* program_args = nullptr;
  T* program_grads = nullptr;
  std::size_t program_grad_width = 0;

  bool has_program() const { return score_program != nullptr || mask_program != nullptr; }
};

// The one translator's last step (attnlab/ops/attention.hpp, resolve_sdpa, gives the spec): the
// parameters of a call over its inputs. scale (H,); alibi_slopes (H,) or nullptr; key_mask (B,Tk)
// bytes or nullptr. The bias and dscores stay unset (the callers that have them set them).
template <class T>
AttentionParams<T> attention_params(const AttentionSpec& spec, const T* q, const T* k, const T* v,
                                    const T* scale, const T* alibi_slopes,
                                    const unsigned char* key_mask) {
  AttentionParams<T> a;
  static_cast<AttentionSpec&>(a) = spec;
  a.q = q, a.k = k, a.v = v, a.scale = scale;
  a.alibi_slopes = alibi_slopes;
  a.key_mask = key_mask;
  return a;
}

// Throws std::invalid_argument "<op>: <prefix><field> expected ..., got ..." unless the variant and
// dropout are ones this version runs: no query offset and no window without causal, a dropout
// probability in [0, 1), a finite softcap >= 0. The one home of these rules: resolve_sdpa (the
// options of the op and of a layer) and the raw calls of every backend (through
// check_attention_spec) run it. Host only.
inline void check_attention_variant(const AttentionVariant& s, const AttentionDropout& d,
                                    const char* op, const std::string& prefix = "") {
  const auto fail = [&](const std::string& field, const std::string& what) {
    throw std::invalid_argument(std::string(op) + ": " + prefix + field + " expected " + what);
  };
  if (!s.causal && s.query_offset != 0) {
    fail("query_offset", "0 without causal (the offset shifts the causal diagonal), got " +
                             std::to_string(s.query_offset));
  }
  if (s.window != 0 && !s.causal) {
    fail("window", "0 without causal (a sliding window bounds the causal keys), got " +
                       std::to_string(s.window));
  }
  if (!(d.dropout_p >= 0.0 && d.dropout_p < 1.0)) {
    fail("dropout_p", "a probability in [0, 1), got " + std::to_string(d.dropout_p));
  }
  if (!(s.softcap >= 0.0 && s.softcap <= std::numeric_limits<double>::max())) {
    fail("softcap", "a finite cap > 0, or 0 for none, got " + std::to_string(s.softcap));
  }
}

// check_attention_variant, and Hkv >= 1 dividing H (grouped-query attention: H / Hkv query heads
// share one K/V head). Sizes are checked against the tensors at the entry points.
inline void check_attention_spec(const AttentionSpec& s, const char* op,
                                 const std::string& prefix = "") {
  if (s.Hkv == 0 || s.H % s.Hkv != 0) {
    throw std::invalid_argument(std::string(op) + ": " + prefix +
                                "Hkv (key/value heads) expected a divisor of H = " +
                                std::to_string(s.H) + ", got " + std::to_string(s.Hkv));
  }
  check_attention_variant(s, s, op, prefix);
}

// The raw calls' check (attnlab/device_ops.hpp): the spec, and no attention program (programs run
// through sdpa_forward and sdpa_backward, which bind their parameters and report their errors).
template <class T>
void check_attention_params(const AttentionParams<T>& p, const char* op) {
  check_attention_spec(p, op);
  if (p.has_program()) {
    throw std::invalid_argument(
        std::string(op) +
        ": score_program and mask_program expected none on a raw device "
        "call (attention programs run through sdpa_forward), got a program");
  }
}

}  // namespace attnlab
