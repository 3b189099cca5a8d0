// The transformer MLP: Linear(C, F) -> GELU (tanh) -> Linear(F, C), both with bias.
// Parameters: "fc1.w" (C, F), "fc1.b" (F,), "fc2.w" (F, C), "fc2.b" (C,); weights N(0, 1/fan_in).
#pragma once

#include "attnlab/nn/activation.hpp"
#include "attnlab/nn/linear.hpp"

namespace attnlab {

template <class T>
class FeedForward : public SequenceModule<T> {
 public:
  FeedForward(std::size_t dim, std::size_t hidden, Rng& rng,
              GeluApproximation approximation = GeluApproximation::tanh);

  void collect_parameters(const std::string& prefix, ParameterList<T>& out) override;
  std::size_t in_features() const override { return fc1.in_features(); }
  std::size_t out_features() const override { return fc2.out_features(); }
  std::string_view type_name() const override { return "FeedForward"; }

  Linear<T> fc1;
  Gelu<T> act;
  Linear<T> fc2;

 protected:
  Buffer<T> forward_impl(const Buffer<T>& x) override;
  Buffer<T> backward_impl(const Buffer<T>& dy) override;
  void for_each_child(const std::function<void(Module<T>&)>& visit) override {
    visit(fc1);
    visit(act);
    visit(fc2);
  }
};

}  // namespace attnlab
