// `attnlab gradcheck`: builds one layer in double precision from the same model config as `train`,
// and runs the library's checkers (gradcheck.hpp, nn/gradcheck_module.hpp) on it.
#include "attnlab/app/layer_check.hpp"

#include <algorithm>
#include <cstdint>
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

}  // namespace

bool layer_check_passed(const GradcheckReport& report) {
  for (const auto& r : report.results)
    if (r.rel_error > kLayerGradTolerance &&
        std::max(r.analytic_norm, r.numeric_norm) > kZeroGradientNorm)
      return false;
  return true;
}

const std::vector<std::string>& checkable_layers() {
  static const std::vector<std::string> layers = enum_name_list<CheckableLayer>();
  return layers;
}

GradcheckReport check_layer(const std::string& layer, const TransformerConfig& model, int batch,
                            int seq, std::uint64_t seed) {
  return check_layer(parse_enum<CheckableLayer>(layer), model, batch, seq, seed);
}

GradcheckReport check_layer(CheckableLayer layer, const TransformerConfig& model, int batch,
                            int seq, std::uint64_t seed) {
  check_arg(batch >= 1 && seq >= 1, "gradcheck", "batch and seq", ">= 1",
            std::to_string(batch) + ", " + std::to_string(seq));
  const std::size_t B = static_cast<std::size_t>(batch), T = static_cast<std::size_t>(seq);
  // The tiny two-field model of CheckableLayer::transformer; its block and attention configure the
  // other layers.
  TransformerConfig c = model;
  c.vocab_sizes = {5, 4};
  c.max_len = T;
  c.out_vocab = 6;
  if (c.block.d_ff == 0) c.block.d_ff = default_mlp_width(c.d_model(), c.block.mlp);
  c.validate();
  const BlockConfig block = c.block_config();  // with positions = rope, the layers rotate
  const AttentionConfig& attn = block.attention;
  const std::size_t C = attn.d_model, H = attn.heads, D = attn.head_dim_k(), Dv = attn.head_dim_v(),
                    F = block.d_ff;
  Rng rng(seed);
  ModuleGradcheckOptions options;
  options.seed = seed + 1;

  if (layer == CheckableLayer::attention) {  // the functional core: L = Σ r ⊙ sdpa(q, k, v)
    auto q = randn<double, 4>({B, H, T, D}, rng);
    auto k = randn<double, 4>({B, H, T, D}, rng);
    auto v = randn<double, 4>({B, H, T, Dv}, rng);
    const auto r = randn<double, 4>({B, H, T, Dv}, rng);
    const SdpaOptions o = attn.sdpa;
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
  if (layer == CheckableLayer::mha) {
    module = std::make_unique<MultiHeadAttention<double>>(attn, rng);
  } else if (layer == CheckableLayer::block) {
    module = std::make_unique<TransformerBlock<double>>(block, rng);
  } else if (layer == CheckableLayer::linear) {
    module = std::make_unique<Linear<double>>(C, C, rng);
  } else if (layer == CheckableLayer::layernorm) {
    module = std::make_unique<LayerNorm<double>>(C);
  } else if (layer == CheckableLayer::rmsnorm) {
    module = std::make_unique<RMSNorm<double>>(C);
  } else if (layer == CheckableLayer::ffn) {
    module = std::make_unique<FeedForward<double>>(C, F, rng, block.mlp);
  }
  if (module) {
    jitter(*module, rng);
    return check_module_gradients(*module, x, options);
  }

  if (layer == CheckableLayer::embedding) {
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

  // CheckableLayer::transformer: cross-entropy of a tiny two-field model, parameters only.
  check_arg(layer == CheckableLayer::transformer, "gradcheck", "layer", "a layer built here",
            enum_name(layer));
  Transformer<double> net(c, rng);
  jitter(net, rng);
  std::vector<TokenIds> fields;
  for (std::size_t f = 0; f < 2; ++f) {
    TokenIds ids = TokenIds::from_shape({B, T});
    for (auto& id : ids) id = static_cast<int>(rng.below(c.vocab_sizes[f]));
    fields.push_back(ids);
  }
  TokenIds targets = TokenIds::from_shape({B, T});
  for (auto& t : targets) t = static_cast<int>(rng.below(c.out_vocab));
  targets(0, 0) = kIgnoreIndex;
  return check_parameter_gradients(net, [&](bool with_backward) {
    const auto logits = net.forward(fields);
    CrossEntropyCache<double, 3> cache;
    const double loss = cross_entropy_forward<double, 3>(cache, logits, targets);
    if (with_backward) net.backward(cross_entropy_backward<double, 3>(cache));
    return loss;
  });
}

}  // namespace attnlab::app
