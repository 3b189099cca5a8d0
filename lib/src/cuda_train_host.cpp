// Host-side pieces of attnlab/cuda_train.hpp that need no device.
#include <cmath>

#include "attnlab/cuda_train.hpp"

namespace attnlab::cuda {

// The scalars of attnlab::AdamW::update (optim/adamw.cpp), formed in double, then cast to T.
template <class T>
cuda_math::AdamWScalars<T> adamw_scalars(double lr, double beta1, double beta2, double eps,
                                         double weight_decay, std::size_t t) {
  const double bias_correction1 = 1 - std::pow(beta1, static_cast<double>(t));
  const double bias_correction2 = 1 - std::pow(beta2, static_cast<double>(t));
  cuda_math::AdamWScalars<T> s;
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

template cuda_math::AdamWScalars<float> adamw_scalars<float>(double, double, double, double, double,
                                                             std::size_t);
template cuda_math::AdamWScalars<double> adamw_scalars<double>(double, double, double, double,
                                                               double, std::size_t);

}  // namespace attnlab::cuda
