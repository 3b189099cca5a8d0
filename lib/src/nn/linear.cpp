#include "attnlab/nn/linear.hpp"

#include <cmath>
#include <string>

namespace attnlab {

template <class T>
Linear<T>::Linear(std::size_t in, std::size_t out, Rng& rng, bool bias)
    : in_(in), out_(out), has_bias_(bias) {
  check_arg(in > 0, "Linear", "in", "> 0", std::to_string(in));
  check_arg(out > 0, "Linear", "out", "> 0", std::to_string(out));
  w = make_parameter<T>(randn<T, 2>({in, out}, rng, 1.0 / std::sqrt(double(in))));
  if (bias) b = make_parameter<T>(xt::zeros<T>({out}));
}

template <class T>
void Linear<T>::collect_parameters(const std::string& prefix, ParameterList<T>& out) {
  out.push_back({prefix + "w", &w});
  if (has_bias_) out.push_back({prefix + "b", &b});
}

template <class T>
Tensor3<T> Linear<T>::forward_impl(const Tensor3<T>& x) {
  w_used_ = tensor_of<T, 2>(w.value);
  if (!has_bias_) return linear_forward<T, 3>(cache_, x, w_used_, nullptr);
  const Tensor1<T> bias = tensor_of<T, 1>(b.value);
  return linear_forward<T, 3>(cache_, x, w_used_, &bias);
}

template <class T>
Tensor3<T> Linear<T>::backward_impl(const Tensor3<T>& dy) {
  auto g = linear_backward<T, 3>(dy, cache_, w_used_, has_bias_);
  add_into(w.grad, g.dw);
  if (has_bias_) add_into(b.grad, g.db);
  return std::move(g.dx);
}

template class Linear<float>;
template class Linear<double>;

}  // namespace attnlab
