// The trainer's model (attnlab/app/model.hpp): the stack's Transformer<float>, configured from a
// ModelSpec and a TaskShape. Initialisation is the Transformer's (documented in
// nn/transformer.hpp): embeddings N(0, 1), projections N(0, 1/fan_in), drawn in an order that no
// attention option changes, so one seed gives every scaling mode identical initial weights.
#include "attnlab/app/model.hpp"

#include "attnlab/nn/transformer.hpp"

namespace attnlab::app {

static_assert(kAbsent == kNoToken, "absent fields use the embedding's no-token id");

struct Model::Impl {
  Impl(const TransformerConfig& config, Rng& rng) : net(config, rng) {}
  Transformer<float> net;
};

namespace {
TransformerConfig transformer_config(const ModelSpec& spec, const TaskShape& shape) {
  validate(spec);
  TransformerConfig c;
  for (int v : shape.field_vocab) c.vocab_sizes.push_back(static_cast<std::size_t>(v));
  c.max_len = static_cast<std::size_t>(shape.seq_len);
  c.d_model = static_cast<std::size_t>(spec.d_model);
  c.heads = static_cast<std::size_t>(spec.heads);
  c.d_k = static_cast<std::size_t>(spec.d_k);
  c.d_v = static_cast<std::size_t>(spec.d_v);
  c.d_ff = static_cast<std::size_t>(spec.d_ff ? spec.d_ff : 4 * spec.d_model);
  c.layers = static_cast<std::size_t>(spec.layers);
  c.out_vocab = static_cast<std::size_t>(shape.output_vocab);
  c.attn_only = spec.attn_only;
  c.norm = spec.norm;
  c.attention.scaling = spec.scaling;
  c.attention.scale = spec.scale;
  c.attention.causal = spec.causal;
  c.qk_norm = spec.qk_norm;
  c.learnable_scale = spec.learnable_scale;
  c.positions = spec.positions ? PositionEncoding::learned : PositionEncoding::none;
  return c;
}
}  // namespace

Model::Model(const ModelSpec& spec, const TaskShape& shape, Rng& rng)
    : impl_(std::make_unique<Impl>(transformer_config(spec, shape), rng)) {
  impl_->net.set_nonfinite_check(true);
}

Model::~Model() = default;

Tensor3<float> Model::forward(const Batch& batch) {
  return impl_->net.forward(batch.fields);
}

void Model::backward(const Tensor3<float>& dlogits) {
  impl_->net.backward(dlogits);
}

ParameterList<float> Model::parameters() {
  return impl_->net.parameters();
}

void Model::zero_grad() {
  impl_->net.zero_grad();
}

std::size_t Model::layers() const {
  return impl_->net.num_blocks();
}

std::size_t Model::heads() const {
  return impl_->net.config().heads;
}

Tensor4<float> Model::attention_weights(std::size_t layer) const {
  return impl_->net.block(layer).attention().attention_weights();
}

Tensor4<float> Model::attention_logits(std::size_t layer) const {
  // The last forward's scaled logits, with its mask and per-head scales.
  return impl_->net.block(layer).attention().attention_scores();
}

Tensor4<float> Model::attention_dots(std::size_t layer) const {
  const auto& attn = impl_->net.block(layer).attention();
  SdpaOptions raw = attn.sdpa_options();
  raw.scaling = Scaling::none;
  raw.scale.reset();
  raw.head_scale.clear();
  return sdpa_scores(attn.queries(), attn.keys(), raw);
}

std::string Model::w_q_name(std::size_t layer) const {
  return "blocks." + std::to_string(layer) + ".attn.w_q";
}

std::string Model::w_k_name(std::size_t layer) const {
  return "blocks." + std::to_string(layer) + ".attn.w_k";
}

Transformer<float>& Model::transformer() {
  return impl_->net;
}

std::string Model::first_nonfinite_stage() const {
  return impl_->net.first_nonfinite().value_or("");
}

}  // namespace attnlab::app
