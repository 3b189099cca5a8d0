// Parameters: a value and its gradient, addressed by a stable hierarchical name
// ("blocks.0.attn.w_q"). Optimizers, checkpoints and metrics find parameters by name.
//
// Where they live follows the Module's backend (Module::to): on the CPU backend the xarrays below
// are the storage itself; on a device backend the values and grads live in the model's device
// arena (device_value / device_grad, views into it) and the xarrays are the host copy, brought up
// to date by Module::copy_to_host and pushed back by Module::copy_to_device.
#pragma once

// First, before any xtensor header.
#include "attnlab/xtensor_config.hpp"

#include <string>
#include <utility>
#include <vector>

#include <xtensor/xarray.hpp>

#include "attnlab/buffer.hpp"

namespace attnlab {

template <class T>
struct Parameter {
  Parameter() = default;
  Parameter(xt::xarray<T> value_in, xt::xarray<T> grad_in)
      : value(std::move(value_in)), grad(std::move(grad_in)) {}

  xt::xarray<T> value;  // contiguous, row-major
  xt::xarray<T> grad;   // same shape as value; backward ADDS into it, only zero_grad clears it
  // Views into the device arena while the owning Module is on a device backend; empty otherwise.
  Buffer<T> device_value, device_grad;

  // Set on a batch replica's parameter (read_values_of): it reads the model's values and holds none
  // of its own (`value` empty), so the threads' kernels read one copy of the weights. A replica
  // never writes them; its gradients stay its own. Null otherwise.
  Parameter* values_of = nullptr;

  // The values and grads where the backend's kernels read and write them.
  bool on_device() const { return device_value.data() != nullptr; }
  T* value_data() {
    return values_of ? values_of->value_data() : on_device() ? device_value.data() : value.data();
  }
  const T* value_data() const {
    return values_of ? values_of->value_data() : on_device() ? device_value.data() : value.data();
  }
  T* grad_data() { return on_device() ? device_grad.data() : grad.data(); }
  const T* grad_data() const { return on_device() ? device_grad.data() : grad.data(); }
  std::size_t size() const { return values_of ? values_of->size() : value.size(); }
  // From now on read the values of `model` (a parameter of the same size on the host, which must
  // outlive this one) and free this parameter's own.
  void read_values_of(Parameter& model) {
    values_of = &model;
    value = xt::xarray<T>::from_shape({0});  // a default xarray is a scalar: one value
  }
};

template <class T>
struct NamedParameter {
  std::string name;
  Parameter<T>* param = nullptr;  // owned by a Module; valid while the Module lives
};

template <class T>
using ParameterList = std::vector<NamedParameter<T>>;

}  // namespace attnlab
