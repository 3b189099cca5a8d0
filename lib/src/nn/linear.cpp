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
Buffer<T> Linear<T>::forward_impl(const Buffer<T>& x) {
  DeviceOps<T>& ops = this->ops();
  const std::size_t rows = x.dim(0) * x.dim(1);
  x_ = x;
  keep_.clear();
  Buffer<T>& y = Buffer<T>::reuse(y_, ops, {x.dim(0), x.dim(1), out_});
  ops.linear_forward(y.data(), x.data(), w.value_data(), has_bias_ ? b.value_data() : nullptr, rows,
                     in_, out_, /*w_transposed=*/false, &keep_);
  return y;
}

template <class T>
Buffer<T> Linear<T>::backward_impl(const Buffer<T>& dy) {
  DeviceOps<T>& ops = this->ops();
  const std::size_t rows = dy.dim(0) * dy.dim(1);
  Buffer<T>& dx = Buffer<T>::reuse(dx_, ops, {dy.dim(0), dy.dim(1), in_});
  T* db = has_bias_ ? Buffer<T>::reuse(db_, ops, {out_}).data() : nullptr;
  // dW is added into w's gradient by the GEMM (β = 1); db goes through a buffer.
  ops.linear_backward(dx.data(), w.grad_data(), db, dy.data(), x_.data(), w.value_data(), rows, in_,
                      out_, /*w_transposed=*/false, /*accumulate_dw=*/true, &keep_);
  if (has_bias_) add_into(ops, b, db_);
  return dx;
}

template class Linear<float>;
template class Linear<double>;

}  // namespace attnlab
