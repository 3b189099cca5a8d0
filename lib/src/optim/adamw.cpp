#include "attnlab/optim/adamw.hpp"

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

// torch.lerp(start, end, weight): the two-sided form that is exact at both ends.
template <class T>
T lerp(T start, T end, T weight) {
  return std::abs(weight) < T(0.5) ? start + weight * (end - start)
                                   : end - (end - start) * (T(1) - weight);
}
}  // namespace

void validate(const AdamWOptions& options) {
  check_arg(std::isfinite(options.lr) && options.lr >= 0, "AdamW", "lr", "a finite value >= 0",
            to_text(options.lr));
  check_arg(options.beta1 >= 0 && options.beta1 < 1, "AdamW", "beta1", "a value in [0, 1)",
            to_text(options.beta1));
  check_arg(options.beta2 >= 0 && options.beta2 < 1, "AdamW", "beta2", "a value in [0, 1)",
            to_text(options.beta2));
  check_arg(std::isfinite(options.eps) && options.eps > 0, "AdamW", "eps", "a finite value > 0",
            to_text(options.eps));
  check_arg(std::isfinite(options.weight_decay) && options.weight_decay >= 0, "AdamW",
            "weight_decay", "a finite value >= 0", to_text(options.weight_decay));
}

template <class T>
AdamW<T>::AdamW(ParameterList<T> params, const AdamWOptions& options)
    : Optimizer<T>("AdamW", std::move(params), options.lr), options_(options) {
  validate(options_);
  exp_avg_slot_ = this->add_slot("exp_avg");
  exp_avg_sq_slot_ = this->add_slot("exp_avg_sq");
}

template <class T>
void AdamW<T>::update(std::size_t i, Parameter<T>& p, std::size_t t) {
  const double lr = this->lr();
  const double bias_correction1 = 1 - std::pow(options_.beta1, static_cast<double>(t));
  const double bias_correction2 = 1 - std::pow(options_.beta2, static_cast<double>(t));
  // Scalars are formed in double, as PyTorch forms them in Python, then used in T.
  const T decay = static_cast<T>(1 - lr * options_.weight_decay);
  const T one_minus_beta1 = static_cast<T>(1 - options_.beta1);
  const T beta2 = static_cast<T>(options_.beta2);
  const T one_minus_beta2 = static_cast<T>(1 - options_.beta2);
  const T step_size = static_cast<T>(lr / bias_correction1);
  const T bias_correction2_sqrt = static_cast<T>(std::sqrt(bias_correction2));
  const T eps = static_cast<T>(options_.eps);
  const bool decays = options_.weight_decay != 0;

  T* value = p.value.data();
  const T* grad = p.grad.data();
  T* m = this->state(exp_avg_slot_, i).data();
  T* v = this->state(exp_avg_sq_slot_, i).data();
  const std::size_t n = p.value.size();
  for (std::size_t j = 0; j < n; ++j) {
    const T g = grad[j];
    if (decays) value[j] = value[j] * decay;        // param.mul_(1 - lr * wd)
    m[j] = lerp(m[j], g, one_minus_beta1);          // exp_avg.lerp_(grad, 1 - beta1)
    v[j] = v[j] * beta2 + one_minus_beta2 * g * g;  // exp_avg_sq.mul_(b2).addcmul_(g, g, 1 - b2)
    const T denom = std::sqrt(v[j]) / bias_correction2_sqrt + eps;
    value[j] = value[j] + (-step_size) * m[j] / denom;  // param.addcdiv_(m, denom, -step_size)
  }
}

template class AdamW<float>;
template class AdamW<double>;

}  // namespace attnlab
