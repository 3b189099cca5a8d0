#include "attnlab/nn/norm.hpp"

#include <string>

namespace attnlab {

std::string_view to_string(Norm norm) {
  switch (norm) {
    case Norm::layernorm:
      return "layernorm";
    case Norm::rmsnorm:
      return "rmsnorm";
    case Norm::none:
      return "none";
  }
  return "?";
}

Norm parse_norm(std::string_view text) {
  if (text == "layernorm") return Norm::layernorm;
  if (text == "rmsnorm") return Norm::rmsnorm;
  if (text == "none") return Norm::none;
  throw std::invalid_argument("parse_norm: norm expected layernorm|rmsnorm|none, got '" +
                              std::string(text) + "'");
}

template <class T>
LayerNorm<T>::LayerNorm(std::size_t dim, double eps) : dim_(dim), eps_(eps) {
  check_arg(dim > 0, "LayerNorm", "dim", "> 0", std::to_string(dim));
  gamma = make_parameter<T>(xt::ones<T>({dim}));
  beta = make_parameter<T>(xt::zeros<T>({dim}));
}

template <class T>
void LayerNorm<T>::collect_parameters(const std::string& prefix, ParameterList<T>& out) {
  out.push_back({prefix + "gamma", &gamma});
  out.push_back({prefix + "beta", &beta});
}

template <class T>
Tensor3<T> LayerNorm<T>::forward_impl(const Tensor3<T>& x) {
  gamma_used_ = tensor_of<T, 1>(gamma.value);
  return layernorm_forward<T, 3>(cache_, x, gamma_used_, tensor_of<T, 1>(beta.value), eps_);
}

template <class T>
Tensor3<T> LayerNorm<T>::backward_impl(const Tensor3<T>& dy) {
  auto g = layernorm_backward<T, 3>(dy, cache_, gamma_used_);
  add_into(gamma.grad, g.dgamma);
  add_into(beta.grad, g.dbeta);
  return std::move(g.dx);
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
Tensor3<T> RMSNorm<T>::forward_impl(const Tensor3<T>& x) {
  gamma_used_ = tensor_of<T, 1>(gamma.value);
  return rmsnorm_forward<T, 3>(cache_, x, gamma_used_, eps_);
}

template <class T>
Tensor3<T> RMSNorm<T>::backward_impl(const Tensor3<T>& dy) {
  auto g = rmsnorm_backward<T, 3>(dy, cache_, gamma_used_);
  add_into(gamma.grad, g.dgamma);
  return std::move(g.dx);
}

template <class T>
std::unique_ptr<SequenceModule<T>> make_norm(Norm norm, std::size_t dim) {
  switch (norm) {
    case Norm::layernorm:
      return std::make_unique<LayerNorm<T>>(dim);
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
template std::unique_ptr<SequenceModule<float>> make_norm<float>(Norm, std::size_t);
template std::unique_ptr<SequenceModule<double>> make_norm<double>(Norm, std::size_t);

}  // namespace attnlab
