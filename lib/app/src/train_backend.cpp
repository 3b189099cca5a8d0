#include "train_backend.hpp"

#include <cmath>

#include "attnlab/app/loss.hpp"
#include "attnlab/cuda.hpp"
#include "attnlab/nn/device_transformer.hpp"
#include "attnlab/nn/transformer.hpp"
#include "attnlab/optim/clip.hpp"

namespace attnlab::app {

double tensor_norm(const xt::xarray<float>& a) {
  double s = 0;
  for (float x : a) s += static_cast<double>(x) * x;
  return std::sqrt(s);
}

namespace {

class HostBackend final : public TrainBackend {
 public:
  HostBackend(Model& model, Optimizer<float>& optimizer)
      : model_(model), opt_(optimizer), params_(model.parameters()) {}

  std::string name() const override { return "cpu"; }
  void set_lr(double lr) override { opt_.set_lr(lr); }
  double forward_loss(const Batch& batch) override {
    loss_ = masked_cross_entropy(model_.forward(batch), batch.targets, true);
    return loss_.loss;
  }
  void backward() override {
    model_.zero_grad();
    model_.backward(loss_.dlogits);
  }
  double grad_norm(const std::string& parameter) override {
    for (const auto& p : params_)
      if (p.name == parameter) return tensor_norm(p.param->grad);
    throw std::invalid_argument("grad_norm: no parameter '" + parameter + "'");
  }
  void clip_grad_norm(double max_norm) override { attnlab::clip_grad_norm(params_, max_norm); }
  void step() override { opt_.step(); }
  void synchronize() override {}
  Tensor3<float> eval_logits(const Batch& batch) override { return model_.forward(batch); }
  LayerAttention attention(std::size_t layer) override {
    LayerAttention a{model_.attention_weights(layer), model_.attention_logits(layer), {}};
    if (layer == 0) a.dots = model_.attention_dots(0);
    return a;
  }
  void sync_host(bool) override {}
  std::string locate_nonfinite(const Batch&) override { return model_.first_nonfinite_stage(); }

 private:
  Model& model_;
  Optimizer<float>& opt_;
  ParameterList<float> params_;
  LossResult loss_;
};

class DeviceBackend final : public TrainBackend {
 public:
  DeviceBackend(Model& model, Optimizer<float>& optimizer, const AdamWOptions* adamw,
                const SgdOptions* sgd, DeviceOps<float>& ops,
                std::unique_ptr<DeviceOps<float>> own_ops)
      : own_ops_(std::move(own_ops)),
        model_(model),
        opt_(optimizer),
        params_(model.parameters()),
        ops_(ops),
        dev_(model.transformer(), ops),
        dev_opt_(adamw ? std::make_unique<DeviceOptimizer<float>>(dev_, *adamw)
                       : std::make_unique<DeviceOptimizer<float>>(dev_, *sgd)) {
    // A resumed run's optimizer state continues on the device.
    if (opt_.step_count() > 0) dev_opt_->load_state(opt_.state_tensors(), opt_.step_count());
  }

  std::string name() const override { return ops_.name(); }
  void set_lr(double lr) override { dev_opt_->set_lr(lr); }
  double forward_loss(const Batch& batch) override {
    dev_.forward(batch.fields);
    return dev_.loss(batch.targets);
  }
  void backward() override { dev_.backward(); }
  double grad_norm(const std::string& parameter) override { return dev_.grad_norm(parameter); }
  void clip_grad_norm(double max_norm) override { dev_.clip_grad_norm(max_norm); }
  void step() override { dev_opt_->step(); }
  void synchronize() override { ops_.synchronize(); }
  Tensor3<float> eval_logits(const Batch& batch) override {
    dev_.forward(batch.fields);
    return dev_.logits();
  }
  // Recomputed on the host from the layer's queries and keys: the same P and S the host model's
  // attention_weights / attention_scores give.
  LayerAttention attention(std::size_t layer) override {
    SdpaOptions o = model_.transformer().config().block.attention.sdpa;
    o.head_scale = dev_.head_scales(layer);
    const Tensor4<float> q = dev_.queries(layer), k = dev_.keys(layer);
    LayerAttention a{sdpa_weights<float>(q, k, o), sdpa_scores<float>(q, k, o), {}};
    if (layer == 0) {  // as Model::attention_dots
      o.scaling = Scaling::none;
      o.scale.reset();
      o.head_scale.clear();
      a.dots = sdpa_scores<float>(q, k, o);
    }
    return a;
  }
  void sync_host(bool optimizer_state) override {
    dev_.download_parameters(params_);
    if (optimizer_state) opt_.load_state(dev_opt_->state_tensors(), dev_opt_->step_count());
  }
  // Replays the batch on the host mirror, which records the first non-finite stage.
  std::string locate_nonfinite(const Batch& batch) override {
    dev_.download_parameters(params_);
    model_.forward(batch);
    return model_.first_nonfinite_stage();
  }

 private:
  std::unique_ptr<DeviceOps<float>>
      own_ops_;  // the CUDA backend made for this run (first: outlives dev_)
  Model& model_;
  Optimizer<float>& opt_;
  ParameterList<float> params_;
  DeviceOps<float>& ops_;
  DeviceTransformer<float> dev_;
  std::unique_ptr<DeviceOptimizer<float>> dev_opt_;
};

}  // namespace

std::unique_ptr<TrainBackend> host_backend(Model& model, Optimizer<float>& optimizer) {
  return std::make_unique<HostBackend>(model, optimizer);
}

std::unique_ptr<TrainBackend> device_backend(Model& model, Optimizer<float>& optimizer,
                                             const AdamWOptions* adamw, const SgdOptions* sgd,
                                             DeviceOps<float>* ops) {
  std::unique_ptr<DeviceOps<float>> own;
  if (!ops) {
    if (!cuda_available()) {
      check_arg(
          false, "train", "device", "a usable CUDA device for 'cuda'",
          cuda_built() ? "none (no driver or no GPU)" : "none (attnlab was built without CUDA)");
    }
    own = make_cuda_device_ops<float>();
    ops = own.get();
  }
  return std::make_unique<DeviceBackend>(model, optimizer, adamw, sgd, *ops, std::move(own));
}

}  // namespace attnlab::app
