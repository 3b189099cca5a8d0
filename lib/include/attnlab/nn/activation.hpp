// Elementwise activations as layers (ops/gelu.hpp, ops/relu.hpp). No parameters.
#pragma once

#include "attnlab/nn/module.hpp"
#include "attnlab/ops/gelu.hpp"
#include "attnlab/ops/relu.hpp"

namespace attnlab {

template <class T>
class Gelu : public SequenceModule<T> {
 public:
  explicit Gelu(std::size_t dim, GeluApproximation approximation = GeluApproximation::tanh)
      : dim_(dim), approximation_(approximation) {}

  void collect_parameters(const std::string&, ParameterList<T>&) override {}
  std::size_t in_features() const override { return dim_; }
  std::size_t out_features() const override { return dim_; }
  std::string_view type_name() const override { return "Gelu"; }

 protected:
  Tensor3<T> forward_impl(const Tensor3<T>& x) override {
    return gelu_forward(cache_, x, approximation_);
  }
  Tensor3<T> backward_impl(const Tensor3<T>& dy) override { return gelu_backward(dy, cache_); }

 private:
  std::size_t dim_;
  GeluApproximation approximation_;
  GeluCache<T, 3> cache_;
};

template <class T>
class Relu : public SequenceModule<T> {
 public:
  explicit Relu(std::size_t dim) : dim_(dim) {}

  void collect_parameters(const std::string&, ParameterList<T>&) override {}
  std::size_t in_features() const override { return dim_; }
  std::size_t out_features() const override { return dim_; }
  std::string_view type_name() const override { return "Relu"; }

 protected:
  Tensor3<T> forward_impl(const Tensor3<T>& x) override { return relu_forward(cache_, x); }
  Tensor3<T> backward_impl(const Tensor3<T>& dy) override { return relu_backward(dy, cache_); }

 private:
  std::size_t dim_;
  ReluCache<T, 3> cache_;
};

}  // namespace attnlab
