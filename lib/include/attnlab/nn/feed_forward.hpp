// The transformer MLP: Linear(C, F) -> activation -> Linear(F, C), both with bias. The activation
// is GELU (tanh form by default; GPT-2's) or ReLU² (So et al. 2021; modded-nanogpt's and
// nanochat's), y = max(x, 0)².
// Parameters: "fc1.w" (C, F), "fc1.b" (F,), "fc2.w" (F, C), "fc2.b" (C,); weights N(0, 1/fan_in).
#pragma once

#include <memory>
#include <string_view>

#include "attnlab/nn/activation.hpp"
#include "attnlab/nn/linear.hpp"

namespace attnlab {

enum class MlpActivation { gelu, relu2 };

// "gelu" | "relu2"; parse throws std::invalid_argument "parse_mlp_activation: mlp expected
// gelu|relu2, got 'x'".
std::string_view to_string(MlpActivation activation);
MlpActivation parse_mlp_activation(std::string_view text);

template <class T>
class FeedForward : public SequenceModule<T> {
 public:
  FeedForward(std::size_t dim, std::size_t hidden, Rng& rng,
              GeluApproximation approximation = GeluApproximation::tanh);
  // With the activation named (the GELU's form applies to gelu only); bias = false: fc1 and fc2
  // without biases.
  FeedForward(std::size_t dim, std::size_t hidden, Rng& rng, MlpActivation activation,
              GeluApproximation approximation = GeluApproximation::tanh, bool bias = true);

  void collect_parameters(const std::string& prefix, ParameterList<T>& out) override;
  std::size_t in_features() const override { return fc1.in_features(); }
  std::size_t out_features() const override { return fc2.out_features(); }
  std::string_view type_name() const override { return "FeedForward"; }

  MlpActivation activation() const { return activation_; }

  Linear<T> fc1;
  std::unique_ptr<SequenceModule<T>> act;  // Gelu or ReluSquared
  Linear<T> fc2;

 protected:
  Buffer<T> forward_impl(const Buffer<T>& x) override;
  Buffer<T> backward_impl(const Buffer<T>& dy) override;
  void for_each_child(const std::function<void(Module<T>&)>& visit) override {
    visit(fc1);
    visit(*act);
    visit(fc2);
  }

 private:
  MlpActivation activation_;
};

}  // namespace attnlab
