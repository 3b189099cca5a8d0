#include "train_backend.hpp"

#include <cmath>
#include <stdexcept>

#include "attnlab/nn/module.hpp"
#include "attnlab/optim/clip.hpp"

namespace attnlab::app {

double tensor_norm(const xt::xarray<float>& a) {
  double s = 0;
  for (float x : a) s += static_cast<double>(x) * x;
  return std::sqrt(s);
}

TrainBackend::TrainBackend(Model& model, OptimizerGroups<float>& optimizer, double z_loss)
    : model_(model), opt_(optimizer), params_(model.parameters()), loss_(z_loss) {}

std::string TrainBackend::name() const {
  return model_.ops().name();
}

void TrainBackend::set_lr(double lr) {
  opt_.set_lr(lr);
}

void TrainBackend::set_step(std::uint64_t seed, std::uint64_t step) {
  seed_ = seed;
  step_ = step;
}

TrainBackend::Loss TrainBackend::forward_loss(const Batch& batch, double weight) {
  model_.train_mode(seed_, step_);
  loss_.forward(model_.ops(), model_.forward_on_backend(batch), batch.targets, weight);
  return {loss_.cross_entropy(), loss_.z_term()};
}

void TrainBackend::zero_grad() {
  model_.zero_grad();
}

void TrainBackend::backward() {
  model_.backward(loss_.dlogits());
}

double TrainBackend::grad_norm(const std::string& parameter) {
  for (const auto& p : params_)
    if (p.name == parameter) return attnlab::grad_norm(ParameterList<float>{p});
  throw std::invalid_argument("grad_norm: no parameter '" + parameter + "'");
}

double TrainBackend::grad_norm() {
  return attnlab::grad_norm(params_);
}

void TrainBackend::clip_grad_norm(double max_norm) {
  attnlab::clip_grad_norm(params_, max_norm);
}

void TrainBackend::step() {
  opt_.step();
}

void TrainBackend::synchronize() {
  model_.ops().synchronize();
}

Tensor3<float> TrainBackend::eval_logits(const Batch& batch) {
  model_.eval_mode();
  return to_tensor<float, 3>(model_.forward_on_backend(batch), "eval");
}

LayerAttention TrainBackend::attention(std::size_t layer) {
  LayerAttention a{model_.attention_weights(layer), model_.attention_logits(layer), {}};
  if (layer == 0) a.dots = model_.attention_dots(0);
  return a;
}

void TrainBackend::sync_host() {
  model_.copy_to_host();
}

std::string TrainBackend::locate_nonfinite(const Batch& batch) {
  model_.train_mode(seed_, step_);  // the failed step's forward, its dropout masks included
  return model_.locate_nonfinite(batch);
}

}  // namespace attnlab::app
