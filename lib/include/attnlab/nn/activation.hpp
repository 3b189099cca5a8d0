// Activations as layers (the arithmetic of ops/gelu.hpp, ops/relu.hpp, ops/swiglu.hpp, on the
// module's backend). No parameters.
#pragma once

#include "attnlab/nn/module.hpp"
#include "attnlab/ops/gelu.hpp"

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
  Buffer<T> forward_impl(const Buffer<T>& x) override {
    x_ = x;
    Buffer<T>& y = Buffer<T>::reuse(y_, this->ops(), x.shape());
    this->ops().gelu_forward(y.data(), x.data(), x.size(), exact());
    return y;
  }
  Buffer<T> backward_impl(const Buffer<T>& dy) override {
    Buffer<T>& dx = Buffer<T>::reuse(dx_, this->ops(), dy.shape());
    this->ops().gelu_backward(dx.data(), dy.data(), x_.data(), dy.size(), exact());
    return dx;
  }

 private:
  bool exact() const { return approximation_ == GeluApproximation::exact; }

  std::size_t dim_;
  GeluApproximation approximation_;
  Buffer<T> x_, y_, dx_;
};

// ReLU, y = max(x, 0), or with `squared` ReLU² (So et al. 2021, "Primer"; the MLP of
// modded-nanogpt and nanochat), y = max(x, 0)²: the relu / relu_squared device ops.
template <class T>
class Relu : public SequenceModule<T> {
 public:
  explicit Relu(std::size_t dim, bool squared = false) : dim_(dim), squared_(squared) {}

  void collect_parameters(const std::string&, ParameterList<T>&) override {}
  std::size_t in_features() const override { return dim_; }
  std::size_t out_features() const override { return dim_; }
  std::string_view type_name() const override { return squared_ ? "ReluSquared" : "Relu"; }
  bool squared() const { return squared_; }

 protected:
  Buffer<T> forward_impl(const Buffer<T>& x) override {
    x_ = x;
    Buffer<T>& y = Buffer<T>::reuse(y_, this->ops(), x.shape());
    if (squared_) {
      this->ops().relu_squared_forward(y.data(), x.data(), x.size());
    } else {
      this->ops().relu_forward(y.data(), x.data(), x.size());
    }
    return y;
  }
  Buffer<T> backward_impl(const Buffer<T>& dy) override {
    Buffer<T>& dx = Buffer<T>::reuse(dx_, this->ops(), dy.shape());
    if (squared_) {
      this->ops().relu_squared_backward(dx.data(), dy.data(), x_.data(), dy.size());
    } else {
      this->ops().relu_backward(dx.data(), dy.data(), x_.data(), dy.size());
    }
    return dx;
  }

 private:
  std::size_t dim_;
  bool squared_;
  Buffer<T> x_, y_, dx_;
};

// SwiGLU's gate (attnlab/ops/swiglu.hpp; LLaMA's MLP): (..., 2F) = [a | b] -> (..., F) =
// silu(a) ⊙ b, the swiglu device op. in_features 2F, out_features F.
template <class T>
class Swiglu : public SequenceModule<T> {
 public:
  explicit Swiglu(std::size_t width) : width_(width) {}

  void collect_parameters(const std::string&, ParameterList<T>&) override {}
  std::size_t in_features() const override { return 2 * width_; }
  std::size_t out_features() const override { return width_; }
  std::string_view type_name() const override { return "Swiglu"; }

 protected:
  Buffer<T> forward_impl(const Buffer<T>& h) override {
    h_ = h;
    auto shape = h.shape();
    shape.back() = width_;
    Buffer<T>& y = Buffer<T>::reuse(y_, this->ops(), shape);
    this->ops().swiglu_forward(y.data(), h.data(), y.size() / width_, width_);
    return y;
  }
  Buffer<T> backward_impl(const Buffer<T>& dy) override {
    Buffer<T>& dh = Buffer<T>::reuse(dh_, this->ops(), h_.shape());
    this->ops().swiglu_backward(dh.data(), dy.data(), h_.data(), dy.size() / width_, width_);
    return dh;
  }

 private:
  std::size_t width_;
  Buffer<T> h_, y_, dh_;
};

// ReLU² as a layer of its own name.
template <class T>
class ReluSquared : public Relu<T> {
 public:
  explicit ReluSquared(std::size_t dim) : Relu<T>(dim, true) {}
};

}  // namespace attnlab
