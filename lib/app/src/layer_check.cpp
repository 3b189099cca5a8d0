// `attnlab gradcheck`: builds one layer in double precision from the same flags as `train`, and
// runs the library's checkers (gradcheck.hpp, nn/gradcheck_module.hpp) on it.
#include "attnlab/app/layer_check.hpp"

#include <algorithm>
#include <memory>
#include <stdexcept>

#include "attnlab/nn/embedding.hpp"
#include "attnlab/nn/feed_forward.hpp"
#include "attnlab/nn/gradcheck_module.hpp"
#include "attnlab/nn/linear.hpp"
#include "attnlab/nn/multi_head_attention.hpp"
#include "attnlab/nn/norm.hpp"
#include "attnlab/nn/transformer.hpp"
#include "attnlab/nn/transformer_block.hpp"
#include "attnlab/ops/attention.hpp"
#include "attnlab/ops/cross_entropy.hpp"
#include "attnlab/random.hpp"

namespace attnlab::app {

namespace {

// Parameters that start constant (norm gains 1, shifts and biases 0, a log scale) are moved off
// their initial values, so that a gradient that ignores them cannot pass by accident.
void jitter(Module<double>& module, Rng& rng) {
  for (auto& p : module.parameters())
    for (auto& v : p.param->value) v += 0.2 * rng.normal();
}

AttentionConfig attention_config(const ModelSpec& s) {
  AttentionConfig a;
  a.d_model = static_cast<std::size_t>(s.d_model);
  a.heads = static_cast<std::size_t>(s.heads);
  a.d_k = static_cast<std::size_t>(s.d_k);
  a.d_v = static_cast<std::size_t>(s.d_v);
  a.sdpa.scaling = s.scaling;
  a.sdpa.scale = s.scale;
  a.sdpa.causal = s.causal;
  a.qk_norm = s.qk_norm;
  a.learnable_scale = s.learnable_scale;
  return a;
}

}  // namespace

bool layer_check_passed(const GradcheckReport& report) {
  for (const auto& r : report.results)
    if (r.rel_error > kLayerGradTolerance &&
        std::max(r.analytic_norm, r.numeric_norm) > kZeroGradientNorm)
      return false;
  return true;
}

const std::vector<std::string>& checkable_layers() {
  static const std::vector<std::string> layers = {"attention",   "mha",       "block",
                                                  "transformer", "linear",    "layernorm",
                                                  "rmsnorm",     "embedding", "ffn"};
  return layers;
}

GradcheckReport check_layer(const std::string& layer, const ModelSpec& spec, int batch, int seq,
                            std::uint64_t seed) {
  validate(spec);
  check_arg(batch >= 1 && seq >= 1, "gradcheck", "batch and seq", ">= 1",
            std::to_string(batch) + ", " + std::to_string(seq));
  const std::size_t B = static_cast<std::size_t>(batch), T = static_cast<std::size_t>(seq);
  const std::size_t C = static_cast<std::size_t>(spec.d_model);
  const std::size_t H = static_cast<std::size_t>(spec.heads);
  const std::size_t D = static_cast<std::size_t>(spec.d_k ? spec.d_k : spec.d_model / spec.heads);
  const std::size_t Dv = static_cast<std::size_t>(spec.d_v ? spec.d_v : spec.d_model / spec.heads);
  const std::size_t F = static_cast<std::size_t>(spec.d_ff ? spec.d_ff : 4 * spec.d_model);
  Rng rng(seed);
  ModuleGradcheckOptions options;
  options.seed = seed + 1;

  if (layer == "attention") {  // the functional core: L = Σ r ⊙ sdpa(q, k, v)
    auto q = randn<double, 4>({B, H, T, D}, rng);
    auto k = randn<double, 4>({B, H, T, D}, rng);
    auto v = randn<double, 4>({B, H, T, Dv}, rng);
    const auto r = randn<double, 4>({B, H, T, Dv}, rng);
    SdpaOptions o;
    o.scaling = spec.scaling;
    o.scale = spec.scale;
    o.causal = spec.causal;
    auto loss = [&] {
      SdpaCache<double> c;
      const auto out = sdpa_forward(c, q, k, v, o);
      double l = 0;
      for (std::size_t i = 0; i < out.size(); ++i) l += out.data()[i] * r.data()[i];
      return l;
    };
    SdpaCache<double> cache;
    sdpa_forward(cache, q, k, v, o);
    const auto g = sdpa_backward(r, cache, q, k, v);
    return check_gradients({{"q", q.data(), g.dq.data(), {B, H, T, D}},
                            {"k", k.data(), g.dk.data(), {B, H, T, D}},
                            {"v", v.data(), g.dv.data(), {B, H, T, Dv}}},
                           loss);
  }

  const auto x = randn<double, 3>({B, T, C}, rng);
  std::unique_ptr<SequenceModule<double>> module;
  if (layer == "mha") {
    module = std::make_unique<MultiHeadAttention<double>>(attention_config(spec), rng);
  } else if (layer == "block") {
    BlockConfig b;
    b.attention = attention_config(spec);
    b.d_ff = F;
    b.attn_only = spec.attn_only;
    b.norm = spec.norm;
    module = std::make_unique<TransformerBlock<double>>(b, rng);
  } else if (layer == "linear") {
    module = std::make_unique<Linear<double>>(C, C, rng);
  } else if (layer == "layernorm") {
    module = std::make_unique<LayerNorm<double>>(C);
  } else if (layer == "rmsnorm") {
    module = std::make_unique<RMSNorm<double>>(C);
  } else if (layer == "ffn") {
    module = std::make_unique<FeedForward<double>>(C, F, rng);
  }
  if (module) {
    jitter(*module, rng);
    return check_module_gradients(*module, x, options);
  }

  if (layer == "embedding") {
    const std::size_t vocab = 7;
    Embedding<double> embed(vocab, C, rng);
    TokenIds ids = TokenIds::from_shape({B, T});
    for (auto& id : ids) id = static_cast<int>(rng.below(vocab + 1)) - 1;  // -1: absent
    const auto r = randn<double, 3>({B, T, C}, rng);
    return check_parameter_gradients(embed, [&](bool with_backward) {
      const auto y = embed.forward(ids);
      double l = 0;
      for (std::size_t i = 0; i < y.size(); ++i) l += y.data()[i] * r.data()[i];
      if (with_backward) embed.backward(r);
      return l;
    });
  }

  if (layer == "transformer") {  // cross-entropy of a tiny two-field model, parameters only
    TransformerConfig c;
    c.vocab_sizes = {5, 4};
    c.max_len = T;
    c.d_model = C;
    c.heads = H;
    c.d_k = static_cast<std::size_t>(spec.d_k);
    c.d_v = static_cast<std::size_t>(spec.d_v);
    c.d_ff = F;
    c.layers = static_cast<std::size_t>(spec.layers);
    c.out_vocab = 6;
    c.attn_only = spec.attn_only;
    c.norm = spec.norm;
    c.attention.scaling = spec.scaling;
    c.attention.scale = spec.scale;
    c.attention.causal = spec.causal;
    c.qk_norm = spec.qk_norm;
    c.learnable_scale = spec.learnable_scale;
    c.positions = spec.positions ? PositionEncoding::learned : PositionEncoding::none;
    Transformer<double> model(c, rng);
    jitter(model, rng);
    std::vector<TokenIds> fields;
    for (std::size_t f = 0; f < 2; ++f) {
      TokenIds ids = TokenIds::from_shape({B, T});
      for (auto& id : ids) id = static_cast<int>(rng.below(c.vocab_sizes[f]));
      fields.push_back(ids);
    }
    TokenIds targets = TokenIds::from_shape({B, T});
    for (auto& t : targets) t = static_cast<int>(rng.below(c.out_vocab));
    targets(0, 0) = kIgnoreIndex;
    return check_parameter_gradients(model, [&](bool with_backward) {
      const auto logits = model.forward(fields);
      CrossEntropyCache<double, 3> cache;
      const double loss = cross_entropy_forward<double, 3>(cache, logits, targets);
      if (with_backward) model.backward(cross_entropy_backward<double, 3>(cache));
      return loss;
    });
  }
  throw std::invalid_argument(
      "gradcheck: layer expected one of attention|mha|block|transformer|"
      "linear|layernorm|rmsnorm|embedding|ffn, got '" +
      layer + "'");
}

}  // namespace attnlab::app
