// Linear layer: y = x W + b, W stored (in, out). Reference: torch.nn.Linear (weight = Wᵀ).
// Parameters: "w" (in, out) drawn from N(0, 1/in) (fan-in init: unit-variance inputs give
// unit-variance outputs), "b" (out,) zeros when the layer has a bias.
#pragma once

#include "attnlab/nn/module.hpp"
#include "attnlab/operand_keep.hpp"
#include "attnlab/random.hpp"

namespace attnlab {

template <class T>
class Linear : public SequenceModule<T> {
 public:
  // Draws w from `rng` (in × out normal draws, row-major). Throws std::invalid_argument on a zero
  // size.
  Linear(std::size_t in, std::size_t out, Rng& rng, bool bias = true);

  void collect_parameters(const std::string& prefix, ParameterList<T>& out) override;
  std::size_t in_features() const override { return in_; }
  std::size_t out_features() const override { return out_; }
  std::string_view type_name() const override { return "Linear"; }
  bool has_bias() const { return has_bias_; }

  Parameter<T> w;  // (in, out)
  Parameter<T> b;  // (out,); empty without bias

 protected:
  Buffer<T> forward_impl(const Buffer<T>& x) override;
  Buffer<T> backward_impl(const Buffer<T>& dy) override;

 private:
  std::size_t in_, out_;
  bool has_bias_;
  Buffer<T> x_, y_, dx_, db_;  // the cached input; reused output and gradient buffers
  OperandKeep keep_;           // x_ and w as the backend uses them (bf16 roundings on the CPU)
};

}  // namespace attnlab
