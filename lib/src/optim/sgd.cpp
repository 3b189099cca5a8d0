#include "attnlab/optim/sgd.hpp"

#include <cmath>

#include "attnlab/tensor.hpp"
#include "option_checks.hpp"

namespace attnlab {

void validate(const SgdOptions& options) {
  option_checks::finite_non_negative("SGD", "lr", options.lr);
  option_checks::below_one("SGD", "momentum", options.momentum);
  option_checks::finite_non_negative("SGD", "weight_decay", options.weight_decay);
}

template <class T>
SGD<T>::SGD(ParameterList<T> params, const SgdOptions& options)
    : Optimizer<T>("SGD", std::move(params), options.lr, options.decay_params), options_(options) {
  validate(options_);
  if (options_.momentum != 0) buffer_slot_ = this->add_slot("momentum_buffer");
}

template <class T>
void SGD<T>::update(DeviceOps<T>& ops, T* value, const T* grad, T* const* state, std::size_t n,
                    std::size_t t, bool decay) {
  // torch's order (kernel_math::sgd_element): d = g + wd·p; buf = d, then buf·momentum + d; p -=
  // lr·d.
  ops.sgd_update(value, options_.momentum != 0 ? state[buffer_slot_] : nullptr, grad, n,
                 static_cast<T>(this->lr()), static_cast<T>(options_.momentum),
                 static_cast<T>(decay ? options_.weight_decay : 0.0), t == 1);
}

template class SGD<float>;
template class SGD<double>;

}  // namespace attnlab
