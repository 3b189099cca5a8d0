// The trainer's model (attnlab/app/model.hpp): the stack's Transformer<float>, configured by a
// TransformerConfig resolved against the task. Initialisation is the Transformer's (documented in
// nn/transformer.hpp): embeddings N(0, 1), projections N(0, 1/fan_in), drawn in an order that no
// attention option changes, so one seed gives every scaling mode identical initial weights.
#include "attnlab/app/model.hpp"

#include <cstdint>
#include <optional>
#include <vector>

#include "attnlab/nn/transformer.hpp"

namespace attnlab::app {

static_assert(kAbsent == kNoToken, "absent fields use the embedding's no-token id");

struct Model::Impl {
  Impl(const TransformerConfig& config, Rng& rng) : net(config, rng) {}
  Transformer<float> net;
};

Model::Model(const TransformerConfig& config, Rng& rng)
    : impl_(std::make_unique<Impl>(config, rng)) {
  impl_->net.eval();  // dropout only in the trainer's steps (train_mode)
}

void Model::train_mode(std::uint64_t seed, std::uint64_t step) {
  impl_->net.train();
  impl_->net.set_dropout_key(seed, step);
}

void Model::eval_mode() {
  impl_->net.eval();
}

Model::~Model() = default;

namespace {
// Packed documents' layout (attnlab/nn/multi_head_attention.hpp): one block mask per batch, at the
// tile the attention reads it on the model's backend, which every block's attention reads; none
// for a batch without documents.
std::optional<SequenceLayout> layout_of(const Batch& batch, Transformer<float>& net) {
  if (batch.documents.size() == 0) return std::nullopt;
  const auto [rows, keys] = layout_tiles(net.ops(), net.config().block_config().attention);
  return document_layout(std::vector<std::int32_t>(batch.documents.begin(), batch.documents.end()),
                         batch.size(), batch.length(), batch.restart_positions, rows, keys);
}
}  // namespace

Tensor3<float> Model::forward(const Batch& batch) {
  return to_tensor<float, 3>(forward_on_backend(batch), "Model::forward");
}

Buffer<float> Model::forward_on_backend(const Batch& batch) {
  const std::optional<SequenceLayout> layout = layout_of(batch, impl_->net);
  return impl_->net.forward(impl_->net.upload_fields(batch.fields), nullptr,
                            layout ? &*layout : nullptr);
}

void Model::backward(const Tensor3<float>& dlogits) {
  impl_->net.backward(dlogits);
}

void Model::backward(const Buffer<float>& dlogits) {
  impl_->net.backward(dlogits);
}

void Model::to(DeviceOps<float>& ops) {
  impl_->net.to(ops);
}

DeviceOps<float>& Model::ops() const {
  return impl_->net.ops();
}

void Model::copy_to_host() {
  impl_->net.copy_to_host();
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
  return impl_->net.config().block.attention.heads;
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
  // Every query-key pair's plain q·k: no scale, and no mask or bias (a causal mask's -inf would
  // make the premise check's variance NaN; the premise is about the dot products themselves).
  SdpaOptions raw = attn.sdpa_options();
  raw.scaling = Scaling::none;
  raw.scale.reset();
  raw.head_scale.clear();
  raw.causal = false;
  raw.query_offset = 0;
  raw.window = 0;
  raw.alibi_slopes.clear();
  return sdpa_scores(attn.queries(), attn.keys(), raw);
}

Tensor4<float> Model::attention_queries(std::size_t layer) const {
  return impl_->net.block(layer).attention().queries();
}

Tensor4<float> Model::attention_keys(std::size_t layer) const {
  return impl_->net.block(layer).attention().keys();
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

std::string Model::locate_nonfinite(const Batch& batch) {
  // Forwards run without the check, which reads every stage's output (a few percent of a CPU
  // step); the batch is replayed with it on, on whichever backend the model is.
  impl_->net.set_nonfinite_check(true);
  forward_on_backend(batch);
  std::string where = impl_->net.first_nonfinite().value_or("");
  impl_->net.set_nonfinite_check(false);
  return where;
}

}  // namespace attnlab::app
