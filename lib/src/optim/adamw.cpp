#include "attnlab/optim/adamw.hpp"

#include <cmath>

#include "attnlab/device_ops.hpp"
#include "attnlab/tensor.hpp"
#include "option_checks.hpp"

namespace attnlab {

void validate(const AdamWOptions& options) {
  option_checks::finite_non_negative("AdamW", "lr", options.lr);
  option_checks::below_one("AdamW", "beta1", options.beta1);
  option_checks::below_one("AdamW", "beta2", options.beta2);
  option_checks::finite_positive("AdamW", "eps", options.eps);
  option_checks::finite_non_negative("AdamW", "weight_decay", options.weight_decay);
}

template <class T>
AdamW<T>::AdamW(ParameterList<T> params, const AdamWOptions& options)
    : Optimizer<T>("AdamW", std::move(params), options.lr, options.decay_params),
      options_(options) {
  validate(options_);
  exp_avg_slot_ = this->add_slot("exp_avg");
  exp_avg_sq_slot_ = this->add_slot("exp_avg_sq");
}

template <class T>
void AdamW<T>::update(DeviceOps<T>& ops, T* value, const T* grad, T* const* state, std::size_t n,
                      std::size_t t, bool decay) {
  // Scalars are formed in double, as PyTorch forms them in Python, then used in T; the element
  // update is torch's, in its order (kernel_math::adamw_element). The decay multiplier is
  // decay_factor's: for decoupled the 1 − lr · weight_decay that adamw_scalars forms, the same
  // double; for independent the schedule's multiplier lr / base_lr() takes lr's place.
  const double weight_decay = decay ? options_.weight_decay : 0.0;
  kernel_math::AdamWScalars<T> s =
      adamw_scalars<T>(this->lr(), options_.beta1, options_.beta2, options_.eps, weight_decay, t);
  s.decay = static_cast<T>(decay_factor(options_.decay, this->lr(), this->base_lr(), weight_decay));
  ops.adamw_update(value, state[exp_avg_slot_], state[exp_avg_sq_slot_], grad, n, s);
}

template class AdamW<float>;
template class AdamW<double>;

// The scalars of attnlab::AdamW::update (optim/adamw.cpp), formed in double, then cast to T.
template <class T>
kernel_math::AdamWScalars<T> adamw_scalars(double lr, double beta1, double beta2, double eps,
                                           double weight_decay, std::size_t t) {
  const double bias_correction1 = 1 - std::pow(beta1, static_cast<double>(t));
  const double bias_correction2 = 1 - std::pow(beta2, static_cast<double>(t));
  kernel_math::AdamWScalars<T> s;
  s.decay = static_cast<T>(1 - lr * weight_decay);
  s.one_minus_beta1 = static_cast<T>(1 - beta1);
  s.beta2 = static_cast<T>(beta2);
  s.one_minus_beta2 = static_cast<T>(1 - beta2);
  s.step_size = static_cast<T>(lr / bias_correction1);
  s.bias_correction2_sqrt = static_cast<T>(std::sqrt(bias_correction2));
  s.eps = static_cast<T>(eps);
  s.decays = weight_decay != 0;
  return s;
}

template kernel_math::AdamWScalars<float> adamw_scalars<float>(double, double, double, double,
                                                               double, std::size_t);
template kernel_math::AdamWScalars<double> adamw_scalars<double>(double, double, double, double,
                                                                 double, std::size_t);

}  // namespace attnlab
