// The Module contract (DESIGN.md):
//   - forward(x) caches what backward needs and returns y;
//   - backward(dy) returns dx and ADDS into the grads of the module's Parameters;
//   - zero_grad() is the only thing that clears grads;
//   - parameters() lists them with stable hierarchical names ("blocks.0.attn.w_q");
//   - backward before forward throws std::logic_error.
//
// SequenceModule is the common case, a layer (B, T, in) -> (B, T, out). Its public forward and
// backward are non-virtual: they check shapes and the call order, then call the virtual
// forward_impl / backward_impl (the tiny-cuda-nn boundary), so every layer reports errors alike.
#pragma once

#include <algorithm>
#include <array>
#include <cstddef>
#include <stdexcept>
#include <string>
#include <string_view>

#include <xtensor/xarray.hpp>
#include <xtensor/xbuilder.hpp>

#include "attnlab/nn/parameter.hpp"
#include "attnlab/tensor.hpp"

namespace attnlab {

template <class T>
class Module {
 public:
  virtual ~Module() = default;

  // Appends this module's parameters to `out`, each name prefixed with `prefix`. A prefix is empty
  // or ends with '.', e.g. "blocks.0.attn."; children are collected with prefix + "child.".
  virtual void collect_parameters(const std::string& prefix, ParameterList<T>& out) = 0;

  // The parameters, in a fixed order (the order of construction), with hierarchical names.
  ParameterList<T> parameters(const std::string& prefix = "") {
    ParameterList<T> out;
    collect_parameters(prefix, out);
    return out;
  }

  // Sets every parameter's grad to 0.
  void zero_grad() {
    for (auto& p : parameters()) p.param->grad.fill(T(0));
  }

  // Total number of scalar parameters.
  std::size_t num_parameters() {
    std::size_t n = 0;
    for (auto& p : parameters()) n += p.param->value.size();
    return n;
  }
};

template <class T>
class SequenceModule : public Module<T> {
 public:
  // x: (B, T, in_features()). Returns y (B, T, out_features()) and caches what backward needs.
  // Throws ShapeError naming the module when x's width is wrong.
  Tensor3<T> forward(const Tensor3<T>& x) {
    check_input(x);
    Tensor3<T> y = forward_impl(x);
    mark_forward(x.shape()[0], x.shape()[1]);
    return y;
  }

  // The same for a dynamic-rank input: a rank other than 3 throws ShapeError.
  Tensor3<T> forward(const xt::xarray<T>& x) {
    check_extents(type_name(), "x", std::vector<std::size_t>(x.shape().begin(), x.shape().end()),
                  {kAnyExtent, kAnyExtent, static_cast<std::ptrdiff_t>(in_features())});
    return forward(Tensor3<T>(x));
  }

  // dy: (B, T, out_features()) of the last forward. Returns dx (B, T, in_features()) and ADDS
  // into the parameter grads. Throws std::logic_error before any forward, ShapeError on mismatch.
  Tensor3<T> backward(const Tensor3<T>& dy) {
    if (!has_forward_) {
      throw std::logic_error(std::string(type_name()) + "::backward: called before forward");
    }
    check_shape(type_name(), "dy", dy,
                {static_cast<std::ptrdiff_t>(batch_), static_cast<std::ptrdiff_t>(length_),
                 static_cast<std::ptrdiff_t>(out_features())});
    return backward_impl(dy);
  }

  virtual std::size_t in_features() const = 0;
  virtual std::size_t out_features() const = 0;
  // The layer's name in error messages, e.g. "MultiHeadAttention".
  virtual std::string_view type_name() const = 0;

 protected:
  virtual Tensor3<T> forward_impl(const Tensor3<T>& x) = 0;
  virtual Tensor3<T> backward_impl(const Tensor3<T>& dy) = 0;

  void check_input(const Tensor3<T>& x) const {
    check_shape(type_name(), "x", x,
                {kAnyExtent, kAnyExtent, static_cast<std::ptrdiff_t>(in_features())});
  }
  // For derived forward overloads (e.g. attention with a mask): records the (B, T) of the output.
  void mark_forward(std::size_t batch, std::size_t length) {
    has_forward_ = true;
    batch_ = batch;
    length_ = length;
  }

 private:
  bool has_forward_ = false;
  std::size_t batch_ = 0, length_ = 0;
};

// ---- Helpers for module implementations ---------------------------------------------------------

// A parameter holding `value`, with a zero grad of the same shape.
template <class T, class E>
Parameter<T> make_parameter(const E& value) {
  Parameter<T> p;
  p.value = value;
  p.grad = xt::zeros<T>(p.value.shape());
  return p;
}

// An evaluated copy of a parameter's value with a fixed rank, for the ops/ functions.
template <class T, std::size_t N>
Tensor<T, N> tensor_of(const xt::xarray<T>& a) {
  std::array<std::size_t, N> shape;
  std::copy(a.shape().begin(), a.shape().end(), shape.begin());
  Tensor<T, N> t(shape);
  std::copy(a.data(), a.data() + a.size(), t.data());
  return t;
}

// grad += g, element by element (same number of elements; the add-into contract).
template <class T, class E>
void add_into(xt::xarray<T>& grad, const E& g) {
  T* dst = grad.data();
  const T* src = g.data();
  for (std::size_t i = 0; i < grad.size(); ++i) dst[i] += src[i];
}

}  // namespace attnlab
