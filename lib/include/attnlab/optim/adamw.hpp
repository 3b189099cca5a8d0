// AdamW: Adam with decoupled weight decay (Loshchilov and Hutter, "Decoupled Weight Decay
// Regularization", ICLR 2019).
//
// Reference: torch.optim.AdamW (amsgrad false, maximize false), in its exact order of operations.
// Per step t (1-based), for each parameter p with grad g, at the current lr (set_lr):
//   p    = p * decay_factor(decay, lr, base_lr, weight_decay)
//          decoupled (torch's, the default): p * (1 - lr * weight_decay)
//          independent: p * (1 - (lr / base_lr) * weight_decay), the lr's schedule multiplier
//          times weight_decay, not scaled by the base lr (Optimizer::base_lr: options.lr unless
//          set; OptimizerGroups sets base · lr_mult) (optimizer.hpp, WeightDecayMode)
//   m    = lerp(m, g, 1 - beta1)                     (m + (1 - beta1) * (g - m))
//   v    = v * beta2 + (1 - beta2) * g * g
//   step_size = lr / (1 - beta1^t)
//   denom     = sqrt(v) / sqrt(1 - beta2^t) + eps
//   p    = p - step_size * m / denom
#pragma once

#include "attnlab/optim/optimizer.hpp"

namespace attnlab {

struct AdamWOptions {
  double lr = 1e-3;            // finite, >= 0
  double beta1 = 0.9;          // in [0, 1)
  double beta2 = 0.999;        // in [0, 1)
  double eps = 1e-8;           // finite, > 0
  double weight_decay = 1e-2;  // finite, >= 0 (PyTorch's default)
  // The parameters weight_decay applies to: all (one group) or matrices (rank >= 2; nanoGPT).
  DecayParams decay_params = DecayParams::all;
  // decoupled: p *= 1 - lr_t · weight_decay (torch.optim.AdamW); independent: p *= 1 − (lr_t /
  // η) · weight_decay, η = Optimizer::base_lr(), lr above unless set (optimizer.hpp,
  // WeightDecayMode).
  WeightDecayMode decay = WeightDecayMode::decoupled;
};

// Throws std::invalid_argument "AdamW: <field> expected ..., got ..." for a bad field.
void validate(const AdamWOptions& options);

template <class T>
class AdamW final : public Optimizer<T> {
 public:
  // State: slots "exp_avg" (m) and "exp_avg_sq" (v) per parameter.
  AdamW(ParameterList<T> params, const AdamWOptions& options);
  const AdamWOptions& options() const { return options_; }

 private:
  void update(DeviceOps<T>& ops, T* value, const T* grad, T* const* state, std::size_t n,
              std::size_t t, bool decay) override;
  AdamWOptions options_;
  std::size_t exp_avg_slot_ = 0;
  std::size_t exp_avg_sq_slot_ = 0;
};

extern template class AdamW<float>;
extern template class AdamW<double>;

}  // namespace attnlab
