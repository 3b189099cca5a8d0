// Gradient checks of one layer from the command line (`attnlab gradcheck`): builds the layer in
// double precision from a TransformerConfig (its block and attention for the smaller layers), and
// runs the library's central-difference checker on the input and every parameter of L = Σ r ⊙
// layer(x) (cross-entropy for the whole Transformer).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "attnlab/app/run_config.hpp"
#include "attnlab/enum_table.hpp"
#include "attnlab/gradcheck.hpp"

namespace attnlab::app {

// The layers `attnlab gradcheck` checks.
enum class CheckableLayer {
  attention,
  mha,
  block,
  transformer,
  linear,
  layernorm,
  rmsnorm,
  embedding,
  ffn
};

}  // namespace attnlab::app

namespace attnlab {
template <>
struct EnumTable<app::CheckableLayer> {
  static constexpr EnumEntry<app::CheckableLayer> entries[] = {
      {app::CheckableLayer::attention, "attention", "the functional core, sdpa(q, k, v)"},
      {app::CheckableLayer::mha, "mha", "MultiHeadAttention"},
      {app::CheckableLayer::block, "block", "TransformerBlock"},
      {app::CheckableLayer::transformer, "transformer",
       "a tiny two-field Transformer under cross-entropy, parameters only"},
      {app::CheckableLayer::linear, "linear", "Linear(C, C)"},
      {app::CheckableLayer::layernorm, "layernorm", "LayerNorm"},
      {app::CheckableLayer::rmsnorm, "rmsnorm", "RMSNorm"},
      {app::CheckableLayer::embedding, "embedding", "Embedding, absent ids included"},
      {app::CheckableLayer::ffn, "ffn", "FeedForward, with the model's MLP activation"},
  };
  static constexpr EnumParseText parse = {"gradcheck", "layer"};
};
}  // namespace attnlab

namespace attnlab::app {

// The relative-error tolerance of `attnlab gradcheck` (that of the stack's test suite).
inline constexpr double kLayerGradTolerance = 1e-6;

// A tensor whose true gradient is zero (k_norm.beta: the softmax ignores a shift shared by every
// key) has a meaningless relative error between two round-off-sized vectors; it is judged on the
// gradient norms instead, which must both stay under this.
inline constexpr double kZeroGradientNorm = 1e-7;

// Every tensor within kLayerGradTolerance relative error, or with both norms <= kZeroGradientNorm.
bool layer_check_passed(const GradcheckReport& report);

// The names of EnumTable<CheckableLayer>.
const std::vector<std::string>& checkable_layers();

// batch B and seq T size the input; the model's vocabularies, max_len and out_vocab are the
// check's own, d_ff 0 means 4 · d_model. Throws std::invalid_argument for a bad config
// (TransformerConfig::validate).
GradcheckReport check_layer(CheckableLayer layer, const TransformerConfig& model, int batch,
                            int seq, std::uint64_t seed);
// The same by name: std::invalid_argument for a name that is not a CheckableLayer's.
GradcheckReport check_layer(const std::string& layer, const TransformerConfig& model, int batch,
                            int seq, std::uint64_t seed);

}  // namespace attnlab::app
