// Parameters: a value and its gradient, addressed by a stable hierarchical name
// ("blocks.0.attn.w_q"). Optimizers, checkpoints and metrics find parameters by name.
#pragma once

#include <string>
#include <vector>

#include <xtensor/xarray.hpp>

namespace attnlab {

template <class T>
struct Parameter {
  xt::xarray<T> value;  // contiguous, row-major
  xt::xarray<T> grad;   // same shape as value; backward ADDS into it, only zero_grad clears it
};

template <class T>
struct NamedParameter {
  std::string name;
  Parameter<T>* param = nullptr;  // owned by a Module; valid while the Module lives
};

template <class T>
using ParameterList = std::vector<NamedParameter<T>>;

}  // namespace attnlab
