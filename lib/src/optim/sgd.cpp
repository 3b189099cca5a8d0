#include "attnlab/optim/sgd.hpp"

#include <cmath>
#include <sstream>

#include "attnlab/tensor.hpp"

namespace attnlab {

namespace {
std::string to_text(double x) {
  std::ostringstream out;
  out << x;
  return out.str();
}
}  // namespace

void validate(const SgdOptions& options) {
  check_arg(std::isfinite(options.lr) && options.lr >= 0, "SGD", "lr", "a finite value >= 0",
            to_text(options.lr));
  check_arg(options.momentum >= 0 && options.momentum < 1, "SGD", "momentum", "a value in [0, 1)",
            to_text(options.momentum));
  check_arg(std::isfinite(options.weight_decay) && options.weight_decay >= 0, "SGD", "weight_decay",
            "a finite value >= 0", to_text(options.weight_decay));
}

template <class T>
SGD<T>::SGD(ParameterList<T> params, const SgdOptions& options)
    : Optimizer<T>("SGD", std::move(params), options.lr), options_(options) {
  validate(options_);
  if (options_.momentum != 0) buffer_slot_ = this->add_slot("momentum_buffer");
}

template <class T>
void SGD<T>::update(std::size_t i, Parameter<T>& p, std::size_t t) {
  const T lr = static_cast<T>(this->lr());
  const T wd = static_cast<T>(options_.weight_decay);
  const T momentum = static_cast<T>(options_.momentum);
  T* value = p.value.data();
  const T* grad = p.grad.data();
  T* buf = options_.momentum != 0 ? this->state(buffer_slot_, i).data() : nullptr;
  const std::size_t n = p.value.size();
  for (std::size_t j = 0; j < n; ++j) {
    T d = grad[j];
    if (options_.weight_decay != 0) d = d + wd * value[j];  // grad.add(param, alpha=wd)
    if (buf) {
      buf[j] = t == 1 ? d : buf[j] * momentum + d;  // buf = clone(d), then buf.mul_(m).add_(d)
      d = buf[j];
    }
    value[j] = value[j] + (-lr) * d;  // param.add_(d, alpha=-lr)
  }
}

template class SGD<float>;
template class SGD<double>;

}  // namespace attnlab
