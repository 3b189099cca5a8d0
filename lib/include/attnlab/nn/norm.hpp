// Normalisation layers over the model width C (ops/layernorm.hpp, ops/rmsnorm.hpp).
//   LayerNorm: parameters "gamma" (C,) ones, "beta" (C,) zeros.
//   RMSNorm:   parameter "gamma" (C,) ones.
// make_norm builds the one a config names, or nullptr for Norm::none (the identity).
#pragma once

#include <memory>
#include <string_view>

#include "attnlab/enum_table.hpp"
#include "attnlab/nn/module.hpp"
#include "attnlab/ops/layernorm.hpp"
#include "attnlab/ops/rmsnorm.hpp"

namespace attnlab {

enum class Norm { layernorm, rmsnorm, none };

template <>
struct EnumTable<Norm> {
  static constexpr EnumEntry<Norm> entries[] = {
      {Norm::layernorm, "layernorm", "LayerNorm"},
      {Norm::rmsnorm, "rmsnorm", "RMSNorm"},
      {Norm::none, "none", "the identity"},
  };
  static constexpr EnumParseText parse = {"parse_norm", "norm"};
};

// The names of EnumTable<Norm>; parse throws std::invalid_argument naming the value.
inline std::string_view to_string(Norm norm) {
  return enum_name(norm);
}
inline Norm parse_norm(std::string_view text) {
  return parse_enum<Norm>(text);
}

template <class T>
class LayerNorm : public SequenceModule<T> {
 public:
  // bias = false: no β (nanoGPT's bias=False): y = γ · x̂, the shift fixed at 0 and not a parameter.
  explicit LayerNorm(std::size_t dim, double eps = kLayerNormEps, bool bias = true);

  void collect_parameters(const std::string& prefix, ParameterList<T>& out) override;
  std::size_t in_features() const override { return dim_; }
  std::size_t out_features() const override { return dim_; }
  std::string_view type_name() const override { return "LayerNorm"; }

  Parameter<T> gamma;  // (C,)
  Parameter<T> beta;   // (C,); zeros, and not collected, without bias
  bool has_bias() const { return has_bias_; }

 protected:
  Buffer<T> forward_impl(const Buffer<T>& x) override;
  Buffer<T> backward_impl(const Buffer<T>& dy) override;

 private:
  std::size_t dim_;
  double eps_;
  bool has_bias_;
  Buffer<T> x_, y_, mean_, rstd_, dx_, dgamma_, dbeta_;
};

template <class T>
class RMSNorm : public SequenceModule<T> {
 public:
  explicit RMSNorm(std::size_t dim, double eps = kRmsNormEps);

  void collect_parameters(const std::string& prefix, ParameterList<T>& out) override;
  std::size_t in_features() const override { return dim_; }
  std::size_t out_features() const override { return dim_; }
  std::string_view type_name() const override { return "RMSNorm"; }

  Parameter<T> gamma;  // (C,)

 protected:
  Buffer<T> forward_impl(const Buffer<T>& x) override;
  Buffer<T> backward_impl(const Buffer<T>& dy) override;

 private:
  std::size_t dim_;
  double eps_;
  Buffer<T> x_, y_, rstd_, dx_, dgamma_;
};

// A LayerNorm or RMSNorm of width dim, or nullptr for Norm::none.
template <class T>
std::unique_ptr<SequenceModule<T>> make_norm(Norm norm, std::size_t dim, bool bias = true);

}  // namespace attnlab
