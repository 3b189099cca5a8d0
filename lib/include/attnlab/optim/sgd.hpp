// Stochastic gradient descent with momentum and (coupled, L2) weight decay.
//
// Reference: torch.optim.SGD with dampening 0 and nesterov false. Per step, for each parameter p
// with grad g:
//   g   = g + weight_decay * p
//   buf = g                      on the first step
//   buf = momentum * buf + g     afterwards           (only when momentum != 0)
//   p   = p - lr * buf           (p - lr * g when momentum == 0)
#pragma once

#include "attnlab/optim/optimizer.hpp"

namespace attnlab {

struct SgdOptions {
  double lr = 1e-2;         // finite, >= 0
  double momentum = 0;      // in [0, 1)
  double weight_decay = 0;  // finite, >= 0
  // The parameters weight_decay applies to: all (one group) or matrices (rank >= 2; nanoGPT).
  DecayParams decay_params = DecayParams::all;
};

// Throws std::invalid_argument "SGD: <field> expected ..., got ..." for a bad field.
void validate(const SgdOptions& options);

template <class T>
class SGD final : public Optimizer<T> {
 public:
  // State: one slot "momentum_buffer" per parameter when momentum != 0, none otherwise.
  SGD(ParameterList<T> params, const SgdOptions& options);
  const SgdOptions& options() const { return options_; }

 private:
  void update(DeviceOps<T>& ops, T* value, const T* grad, T* const* state, std::size_t n,
              std::size_t t, bool decay) override;
  SgdOptions options_;
  std::size_t buffer_slot_ = 0;
};

extern template class SGD<float>;
extern template class SGD<double>;

}  // namespace attnlab
