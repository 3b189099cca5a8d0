#include "attnlab/nn/norm.hpp"

#include <string>

namespace attnlab {

template <class T>
LayerNorm<T>::LayerNorm(std::size_t dim, double eps, bool bias)
    : dim_(dim), eps_(eps), has_bias_(bias) {
  check_arg(dim > 0, "LayerNorm", "dim", "> 0", std::to_string(dim));
  gamma = make_parameter<T>(xt::ones<T>({dim}));
  beta = make_parameter<T>(xt::zeros<T>({dim}));
}

template <class T>
void LayerNorm<T>::collect_parameters(const std::string& prefix, ParameterList<T>& out) {
  out.push_back({prefix + "gamma", &gamma});
  if (has_bias_) out.push_back({prefix + "beta", &beta});
}

template <class T>
Buffer<T> LayerNorm<T>::forward_impl(const Buffer<T>& x) {
  DeviceOps<T>& ops = this->ops();
  const std::size_t rows = x.dim(0) * x.dim(1);
  x_ = x;
  Buffer<T>& y = Buffer<T>::reuse(y_, ops, x.shape());
  ops.layernorm_forward(y.data(), Buffer<T>::reuse(mean_, ops, {rows}).data(),
                        Buffer<T>::reuse(rstd_, ops, {rows}).data(), x.data(), gamma.value_data(),
                        has_bias_ ? beta.value_data() : nullptr, rows, dim_, static_cast<T>(eps_));
  return y;
}

template <class T>
Buffer<T> LayerNorm<T>::backward_impl(const Buffer<T>& dy) {
  DeviceOps<T>& ops = this->ops();
  const std::size_t rows = dy.dim(0) * dy.dim(1);
  Buffer<T>& dx = Buffer<T>::reuse(dx_, ops, dy.shape());
  Buffer<T>& dgamma = Buffer<T>::reuse(dgamma_, ops, {dim_});
  T* dbeta = has_bias_ ? Buffer<T>::reuse(dbeta_, ops, {dim_}).data() : nullptr;
  ops.layernorm_backward(dx.data(), dgamma.data(), dbeta, dy.data(), x_.data(), mean_.data(),
                         rstd_.data(), gamma.value_data(), rows, dim_);
  add_into(ops, gamma, dgamma);
  if (has_bias_) add_into(ops, beta, dbeta_);
  return dx;
}

template <class T>
RMSNorm<T>::RMSNorm(std::size_t dim, double eps) : dim_(dim), eps_(eps) {
  check_arg(dim > 0, "RMSNorm", "dim", "> 0", std::to_string(dim));
  gamma = make_parameter<T>(xt::ones<T>({dim}));
}

template <class T>
void RMSNorm<T>::collect_parameters(const std::string& prefix, ParameterList<T>& out) {
  out.push_back({prefix + "gamma", &gamma});
}

template <class T>
Buffer<T> RMSNorm<T>::forward_impl(const Buffer<T>& x) {
  DeviceOps<T>& ops = this->ops();
  const std::size_t rows = x.dim(0) * x.dim(1);
  x_ = x;
  Buffer<T>& y = Buffer<T>::reuse(y_, ops, x.shape());
  ops.rmsnorm_forward(y.data(), Buffer<T>::reuse(rstd_, ops, {rows}).data(), x.data(),
                      gamma.value_data(), rows, dim_, static_cast<T>(eps_));
  return y;
}

template <class T>
Buffer<T> RMSNorm<T>::backward_impl(const Buffer<T>& dy) {
  DeviceOps<T>& ops = this->ops();
  const std::size_t rows = dy.dim(0) * dy.dim(1);
  Buffer<T>& dx = Buffer<T>::reuse(dx_, ops, dy.shape());
  Buffer<T>& dgamma = Buffer<T>::reuse(dgamma_, ops, {dim_});
  ops.rmsnorm_backward(dx.data(), dgamma.data(), dy.data(), x_.data(), rstd_.data(),
                       gamma.value_data(), rows, dim_);
  add_into(ops, gamma, dgamma);
  return dx;
}

template <class T>
std::unique_ptr<SequenceModule<T>> make_norm(Norm norm, std::size_t dim, bool bias) {
  switch (norm) {
    case Norm::layernorm:
      return std::make_unique<LayerNorm<T>>(dim, kLayerNormEps, bias);
    case Norm::rmsnorm:
      return std::make_unique<RMSNorm<T>>(dim);
    case Norm::none:
      return nullptr;
  }
  return nullptr;
}

template class LayerNorm<float>;
template class LayerNorm<double>;
template class RMSNorm<float>;
template class RMSNorm<double>;
template std::unique_ptr<SequenceModule<float>> make_norm<float>(Norm, std::size_t, bool);
template std::unique_ptr<SequenceModule<double>> make_norm<double>(Norm, std::size_t, bool);

}  // namespace attnlab
