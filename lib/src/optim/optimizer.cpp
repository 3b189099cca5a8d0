#include "attnlab/optim/optimizer.hpp"

#include <cmath>
#include <set>
#include <stdexcept>

#include "attnlab/backends/cpu.hpp"
#include "attnlab/tensor.hpp"
#include "option_checks.hpp"

namespace attnlab {

std::string optim_state_name(const std::string& param, const std::string& slot) {
  return "optim." + param + "." + slot;
}

namespace {

template <class S>
std::vector<std::size_t> to_extents(const S& shape) {
  return std::vector<std::size_t>(shape.begin(), shape.end());
}

std::vector<std::ptrdiff_t> to_expected(const std::vector<std::size_t>& shape) {
  return std::vector<std::ptrdiff_t>(shape.begin(), shape.end());
}

}  // namespace

double decay_factor(WeightDecayMode mode, double lr, double base_lr, double weight_decay) {
  option_checks::finite_non_negative("decay_factor", "lr", lr);
  option_checks::finite_non_negative("decay_factor", "base_lr", base_lr);
  option_checks::finite_non_negative("decay_factor", "weight_decay", weight_decay);
  if (mode == WeightDecayMode::decoupled) return 1 - lr * weight_decay;
  const double multiplier = base_lr > 0 ? lr / base_lr : 0.0;  // s_t
  return 1 - multiplier * weight_decay;
}

template <class T>
Optimizer<T>::Optimizer(std::string name, ParameterList<T> params, double lr, DecayParams decay)
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
    offsets_.push_back(total_);
    total_ += np.param->value.size();
    decays_.push_back(decay == DecayParams::all || shape.size() >= 2);
    if (runs_.empty() || decays_[runs_.back().first] != decays_.back())
      runs_.push_back({decays_.size() - 1, decays_.size()});
    else
      runs_.back().last = decays_.size();
  }
  set_lr(lr);
  set_base_lr(lr);
  state_ops_ = &backend();
}

template <class T>
DeviceOps<T>& Optimizer<T>::backend() {
  const auto ops_of = [](const Parameter<T>& p) -> DeviceOps<T>* {
    if (!p.on_device()) return &cpu_ops<T>();
    return dynamic_cast<DeviceOps<T>*>(p.device_value.memory());
  };
  DeviceOps<T>* ops = ops_of(*params_[0].param);
  for (const auto& np : params_) {
    DeviceOps<T>* other = ops_of(*np.param);
    check_arg(other == ops, name_, "parameter '" + np.name + "'",
              "on the backend of '" + params_[0].name + "' (" + ops->name() + ")",
              other ? other->name() : std::string("an unknown backend"));
  }
  if (state_ops_ != nullptr && state_ops_ != ops) {  // the Module moved: the state follows
    for (auto& slot : slots_) {
      std::vector<T> host = slot.to_vector();
      slot = Buffer<T>::from_host(*ops, host.data(), slot.shape());
    }
  }
  state_ops_ = ops;
  return *ops;
}

template <class T>
void Optimizer<T>::set_lr(double lr) {
  option_checks::finite_non_negative(name_, "lr", lr);
  lr_ = lr;
}

template <class T>
void Optimizer<T>::set_base_lr(double lr) {
  option_checks::finite_non_negative(name_, "base_lr", lr);
  base_lr_ = lr;
}

template <class T>
std::size_t Optimizer<T>::add_slot(const std::string& slot) {
  slot_names_.push_back(slot);
  slots_.push_back(Buffer<T>::zeros(*state_ops_, {total_}));
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
  DeviceOps<T>& ops = backend();
  const std::size_t t = step_ + 1;
  // One call over everything when the values and the grads each lie in order in one arena.
  bool contiguous = true;
  for (std::size_t i = 1; i < params_.size() && contiguous; ++i) {
    const Parameter<T>& p = *params_[i].param;
    contiguous = p.value_data() == params_[0].param->value_data() + offsets_[i] &&
                 p.grad_data() == params_[0].param->grad_data() + offsets_[i];
  }
  std::vector<T*> state(slots_.size());
  const auto run = [&](std::size_t i, std::size_t n) {
    for (std::size_t s = 0; s < slots_.size(); ++s) state[s] = slots_[s].data() + offsets_[i];
    Parameter<T>& p = *params_[i].param;
    if (per_parameter()) {
      update_matrix(ops, shapes_[i], p.value_data(), p.grad_data(), state.data(), t, decays_[i]);
    } else {
      update(ops, p.value_data(), p.grad_data(), state.data(), n, t, decays_[i]);
    }
  };
  if (contiguous &&
      !per_parameter()) {  // one call per run of like parameters (one run for DecayParams::all)
    for (const Run& r : runs_) {
      const std::size_t end = r.last < params_.size() ? offsets_[r.last] : total_;
      run(r.first, end - offsets_[r.first]);
    }
  } else {
    for (std::size_t i = 0; i < params_.size(); ++i) run(i, params_[i].param->size());
  }
  step_ = t;
}

template <class T>
void Optimizer<T>::update_matrix(DeviceOps<T>& ops, const std::vector<std::size_t>& shape, T* value,
                                 const T* grad, T* const* state, std::size_t t, bool decay) {
  std::size_t n = 1;
  for (const std::size_t d : shape) n *= d;
  update(ops, value, grad, state, n, t, decay);
}

template <class T>
void Optimizer<T>::zero_grad() {
  DeviceOps<T>& ops = backend();
  for (auto& np : params_) ops.zero(np.param->grad_data(), np.param->size() * sizeof(T));
}

template <class T>
std::vector<NamedTensor<T>> Optimizer<T>::state_tensors() const {
  std::vector<NamedTensor<T>> out;
  for (std::size_t i = 0; i < params_.size(); ++i) {
    for (std::size_t s = 0; s < slots_.size(); ++s) {
      xt::xarray<T> value = xt::xarray<T>::from_shape(shapes_[i]);
      if (value.size() > 0) {
        state_ops_->download(value.data(), slots_[s].data() + offsets_[i],
                             value.size() * sizeof(T));
      }
      out.emplace_back(optim_state_name(params_[i].name, slot_names_[s]), std::move(value));
    }
  }
  return out;
}

template <class T>
std::vector<std::string> Optimizer<T>::state_names() const {
  std::vector<std::string> names;
  names.reserve(params_.size() * slots_.size());
  for (std::size_t i = 0; i < params_.size(); ++i) {
    for (std::size_t s = 0; s < slots_.size(); ++s)
      names.push_back(optim_state_name(params_[i].name, slot_names_[s]));
  }
  return names;
}

template <class T>
std::vector<const xt::xarray<T>*> Optimizer<T>::match_state(
    const std::vector<NamedTensor<T>>& tensors) const {
  const std::string op = name_ + ".load_state";
  // [i * slots + s]: the tensor of parameter i's slot s
  const std::vector<std::string> expected_names = state_names();
  std::vector<const xt::xarray<T>*> found(expected_names.size(), nullptr);
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
  return found;
}

template <class T>
void Optimizer<T>::check_state(const std::vector<NamedTensor<T>>& tensors) const {
  match_state(tensors);
}

template <class T>
void Optimizer<T>::load_state(const std::vector<NamedTensor<T>>& tensors, std::size_t step_count) {
  const std::vector<const xt::xarray<T>*> found = match_state(tensors);
  DeviceOps<T>& ops = backend();
  for (std::size_t j = 0; j < found.size(); ++j) {
    const std::size_t s = j % slots_.size(), i = j / slots_.size();
    if (found[j]->size() > 0) {
      ops.upload(slots_[s].data() + offsets_[i], found[j]->data(), found[j]->size() * sizeof(T));
    }
  }
  step_ = step_count;
}

template class Optimizer<float>;
template class Optimizer<double>;

}  // namespace attnlab
