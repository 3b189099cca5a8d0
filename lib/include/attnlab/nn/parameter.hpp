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
#include <string_view>
#include <utility>
#include <vector>

#include <xtensor/xarray.hpp>

#include "attnlab/buffer.hpp"
#include "attnlab/tensor.hpp"

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
  // From now on read the values of `model` and free this parameter's own. `model` must be another
  // parameter of the same shape, on the host, holding its own values (not reading a third's), and
  // must outlive this one; this one must be on the host. Throws std::invalid_argument otherwise,
  // and then changes nothing.
  void read_values_of(Parameter& model) {
    const xt::xarray<T>& mine = values_of ? values_of->value : value;
    const std::string what = "another host parameter of shape " + format_shape_of(mine.shape()) +
                             " that holds its own values";
    const auto given = [&](std::string_view why) {
      const xt::xarray<T>& theirs = model.values_of ? model.values_of->value : model.value;
      return std::string(why) + " of shape " + format_shape_of(theirs.shape());
    };
    check_arg(&model != this, "Parameter::read_values_of", "model", what, given("itself"));
    check_arg(!on_device(), "Parameter::read_values_of", "this", "a parameter on the host",
              "one on a device backend");
    check_arg(!model.on_device(), "Parameter::read_values_of", "model", what,
              given("one on a device backend"));
    check_arg(model.values_of == nullptr, "Parameter::read_values_of", "model", what,
              given("one that reads a third's values"));
    check_arg(model.value.shape() == mine.shape(), "Parameter::read_values_of", "model", what,
              given("one"));
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
