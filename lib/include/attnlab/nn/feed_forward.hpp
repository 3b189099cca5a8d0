// The transformer MLP: Linear(C, F) -> activation -> Linear(F, C), with biases unless bias =
// false. The activation is GELU (tanh form by default; GPT-2's), ReLU² (So et al. 2021;
// modded-nanogpt's and nanochat's), y = max(x, 0)², or SwiGLU (Shazeer 2020; LLaMA's), whose fc1
// is Linear(C, 2F) = [W_gate | W_up] side by side (one GEMM for both projections) and whose
// activation silu(a) ⊙ b maps its 2F columns to F.
// Parameters: "fc1.w" (C, F) (C, 2F with SwiGLU), "fc1.b" (F,) (2F,), "fc2.w" (F, C), "fc2.b" (C,);
// weights N(0, 1/fan_in).
#pragma once

#include <memory>
#include <string_view>

#include "attnlab/enum_table.hpp"
#include "attnlab/nn/activation.hpp"
#include "attnlab/nn/linear.hpp"

namespace attnlab {

enum class MlpActivation { gelu, relu2, swiglu };

template <>
struct EnumTable<MlpActivation> {
  static constexpr EnumEntry<MlpActivation> entries[] = {
      {MlpActivation::gelu, "gelu", "GELU, tanh form (GPT-2)"},
      {MlpActivation::relu2, "relu2", "max(x, 0)^2 (modded-nanogpt, nanochat)"},
      {MlpActivation::swiglu, "swiglu",
       "silu(x W_gate) * (x W_up) (LLaMA; the width then defaults to 8/3 d_model, rounded up to "
       "a multiple of 16)"},
  };
  static constexpr EnumParseText parse = {"parse_mlp_activation", "mlp"};
};

// The names of EnumTable<MlpActivation>; parse throws std::invalid_argument
// "parse_mlp_activation: mlp expected <the names>, got 'x'".
inline std::string_view to_string(MlpActivation activation) {
  return enum_name(activation);
}
inline MlpActivation parse_mlp_activation(std::string_view text) {
  return parse_enum<MlpActivation>(text);
}

// The multiple that SwiGLU's default width is rounded up to: one AVX-512 vector of floats.
inline constexpr std::size_t kSwigluWidthMultiple = 16;

// The default MLP width F for model width C: 4C, or for SwiGLU LLaMA's rule, 2/3 of 4C (floored)
// rounded up to a multiple of kSwigluWidthMultiple, which keeps its three matrices near the
// parameter count of a 4C two-matrix MLP (C = 384: 1024; C = 64: 176).
std::size_t default_mlp_width(std::size_t C, MlpActivation activation);

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
  std::unique_ptr<SequenceModule<T>> act;  // Gelu, ReluSquared or Swiglu
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
