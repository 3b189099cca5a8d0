#include "attnlab/optim/optimizer.hpp"

#include <cmath>
#include <set>
#include <sstream>
#include <stdexcept>

#include "attnlab/tensor.hpp"

namespace attnlab {

std::string optim_state_name(const std::string& param, const std::string& slot) {
  return "optim." + param + "." + slot;
}

namespace {

std::string to_text(double x) {
  std::ostringstream out;
  out << x;
  return out.str();
}

template <class S>
std::vector<std::size_t> to_extents(const S& shape) {
  return std::vector<std::size_t>(shape.begin(), shape.end());
}

std::vector<std::ptrdiff_t> to_expected(const std::vector<std::size_t>& shape) {
  return std::vector<std::ptrdiff_t>(shape.begin(), shape.end());
}

}  // namespace

template <class T>
Optimizer<T>::Optimizer(std::string name, ParameterList<T> params, double lr)
    : name_(std::move(name)), params_(std::move(params)) {
  check_arg(!params_.empty(), name_, "parameters", "a non-empty list", "an empty list");
  std::set<std::string> names;
  std::set<const Parameter<T>*> seen;
  for (const auto& np : params_) {
    check_arg(!np.name.empty(), name_, "parameter name", "a non-empty name", "\"\"");
    check_arg(np.param != nullptr, name_, "parameter '" + np.name + "'", "a Parameter",
              "a null pointer");
    check_arg(names.insert(np.name).second, name_, "parameter names", "unique names",
              "'" + np.name + "' twice");
    check_arg(seen.insert(np.param).second, name_, "parameter '" + np.name + "'",
              "a distinct Parameter", "one listed under another name already");
    const auto shape = to_extents(np.param->value.shape());
    check_extents(name_, "grad of parameter '" + np.name + "'", to_extents(np.param->grad.shape()),
                  to_expected(shape));
    shapes_.push_back(shape);
  }
  set_lr(lr);
}

template <class T>
void Optimizer<T>::set_lr(double lr) {
  check_arg(std::isfinite(lr) && lr >= 0, name_, "lr", "a finite value >= 0", to_text(lr));
  lr_ = lr;
}

template <class T>
std::size_t Optimizer<T>::add_slot(const std::string& slot) {
  slot_names_.push_back(slot);
  auto& tensors = slots_.emplace_back();
  for (const auto& shape : shapes_) tensors.push_back(xt::zeros<T>(shape));
  return slots_.size() - 1;
}

template <class T>
void Optimizer<T>::step() {
  // Every check before any update, so that a bad parameter leaves all of them untouched.
  for (std::size_t i = 0; i < params_.size(); ++i) {
    const auto& np = params_[i];
    const auto expected = to_expected(shapes_[i]);
    check_extents(name_ + ".step", "value of parameter '" + np.name + "'",
                  to_extents(np.param->value.shape()), expected);
    check_extents(name_ + ".step", "grad of parameter '" + np.name + "'",
                  to_extents(np.param->grad.shape()), expected);
  }
  const std::size_t t = step_ + 1;
  for (std::size_t i = 0; i < params_.size(); ++i) update(i, *params_[i].param, t);
  step_ = t;
}

template <class T>
void Optimizer<T>::zero_grad() {
  for (auto& np : params_) np.param->grad.fill(T(0));
}

template <class T>
std::vector<NamedTensor<T>> Optimizer<T>::state_tensors() const {
  std::vector<NamedTensor<T>> out;
  for (std::size_t i = 0; i < params_.size(); ++i) {
    for (std::size_t s = 0; s < slots_.size(); ++s) {
      out.emplace_back(optim_state_name(params_[i].name, slot_names_[s]), slots_[s][i]);
    }
  }
  return out;
}

template <class T>
void Optimizer<T>::load_state(const std::vector<NamedTensor<T>>& tensors, std::size_t step_count) {
  const std::string op = name_ + ".load_state";
  // name -> (slot, param)
  std::vector<const xt::xarray<T>*> found(slots_.size() * params_.size(), nullptr);
  std::vector<std::string> expected_names(found.size());
  for (std::size_t i = 0; i < params_.size(); ++i) {
    for (std::size_t s = 0; s < slots_.size(); ++s) {
      expected_names[i * slots_.size() + s] = optim_state_name(params_[i].name, slot_names_[s]);
    }
  }
  for (const auto& [name, tensor] : tensors) {
    std::size_t index = found.size();
    for (std::size_t j = 0; j < expected_names.size(); ++j) {
      if (expected_names[j] == name) index = j;
    }
    check_arg(index < found.size(), op, "state tensor '" + name + "'",
              "the name of a state tensor of this " + name_ + " (optim.<param>.<slot>)",
              "an unknown name");
    check_arg(found[index] == nullptr, op, "state tensor '" + name + "'", "once", "twice");
    check_extents(op, "state tensor '" + name + "'", to_extents(tensor.shape()),
                  to_expected(shapes_[index / slots_.size()]));
    found[index] = &tensor;
  }
  for (std::size_t j = 0; j < found.size(); ++j) {
    check_arg(found[j] != nullptr, op, "state tensor '" + expected_names[j] + "'", "present",
              "missing");
  }
  for (std::size_t j = 0; j < found.size(); ++j) {
    slots_[j % slots_.size()][j / slots_.size()] = *found[j];
  }
  step_ = step_count;
}

template class Optimizer<float>;
template class Optimizer<double>;

}  // namespace attnlab
