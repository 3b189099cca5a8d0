// The optimizer base: owns the list of named parameters it updates, their per-parameter state
// tensors ("slots" such as exp_avg) and the step count, and makes that state addressable by name
// so that a checkpoint can save and restore it.
//
// An optimizer runs where its parameters live (the backend of the Module they belong to, see
// Module::to): its state is kept there, one flat arena per slot, and it follows the parameters when
// the Module moves. The update is one backend call per parameter, or one for all of them when the
// parameters lie in order in one arena (a Module on a device: one kernel launch per step).
//
// Reference: torch.optim.Optimizer (state_dict / load_state_dict), flattened to named tensors.
#pragma once

// First, before any xtensor header.
#include "attnlab/xtensor_config.hpp"

#include <cstddef>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <xtensor/xarray.hpp>

#include "attnlab/device_ops.hpp"
#include "attnlab/enum_table.hpp"
#include "attnlab/nn/parameter.hpp"

namespace attnlab {

// Which parameters the weight decay applies to. all: every one (one group, torch.optim's default
// when a model's parameters() are passed). matrices: those of rank >= 2 (weights, the embedding
// and position tables, the head), not biases, norm gains and shifts or per-head scales: nanoGPT's
// configure_optimizers groups, `p.dim() >= 2` decayed and the rest with weight_decay 0.
enum class DecayParams { all, matrices };

template <>
struct EnumTable<DecayParams> {
  static constexpr EnumEntry<DecayParams> entries[] = {
      {DecayParams::all, "all", "every parameter (one group)"},
      {DecayParams::matrices, "matrices",
       "rank >= 2: weights, embedding and position tables, head; not biases, norms and per-head "
       "scales, as nanoGPT groups them"},
  };
  static constexpr EnumParseText parse = {"optimizer", "decay_params", NameList::pipes, false};
};

// The names of EnumTable<DecayParams>; std::invalid_argument "optimizer: decay_params expected
// <the names>, got ..." for another.
inline std::string_view to_string(DecayParams v) {
  return enum_name(v);
}
inline DecayParams parse_decay_params(std::string_view text) {
  return parse_enum<DecayParams>(text);
}

// How a decoupled weight decay λ enters the update at step t, whose learning rate lr_t the
// schedule gives (η the base lr, the one the optimizer was built with; s_t = lr_t / η the
// schedule's multiplier):
//   decoupled:   p <- p · (1 − lr_t · λ)         torch.optim.AdamW: λ is scaled by the lr itself
//   independent: p <- p · (1 − s_t · λ)          Loshchilov and Hutter's original form, θ ← θ −
//                                                s_t (η Δ + λ θ); Wortsman et al. 2023,
//                                                "Small-scale proxies for large-scale Transformer
//                                                training instabilities", §3.2.2: λ follows the
//                                                schedule's shape but not η, so a sweep over η
//                                                keeps the decay
// (lib/README.md, "Independent weight decay").
enum class WeightDecayMode { decoupled, independent };

template <>
struct EnumTable<WeightDecayMode> {
  static constexpr EnumEntry<WeightDecayMode> entries[] = {
      {WeightDecayMode::decoupled, "decoupled", "torch's, p *= 1 - lr_t * wd"},
      {WeightDecayMode::independent, "independent",
       "p *= 1 - (lr_t / lr) * wd: the schedule's shape without the base lr; Wortsman et al. "
       "2023"},
  };
  static constexpr EnumParseText parse = {"optimizer", "decay", NameList::pipes, false};
};

// The names of EnumTable<WeightDecayMode>; std::invalid_argument "optimizer: decay expected <the
// names>, got ..." for another.
inline std::string_view to_string(WeightDecayMode v) {
  return enum_name(v);
}
inline WeightDecayMode parse_weight_decay_mode(std::string_view text) {
  return parse_enum<WeightDecayMode>(text);
}
// The multiplier the weight decay applies to a parameter at this step: 1 − lr · weight_decay
// (decoupled) or 1 − (lr / base_lr) · weight_decay (independent). With base_lr 0 the schedule's
// multiplier s_t is taken as 0 (a run whose base lr is 0 never moves its weights), so independent
// gives 1. Throws std::invalid_argument naming the argument unless lr, base_lr and weight_decay
// are finite and >= 0.
double decay_factor(WeightDecayMode mode, double lr, double base_lr, double weight_decay);

// The optimizers that a run config or a parameter group names: AdamW (attnlab/optim/adamw.hpp),
// SGD (sgd.hpp) and Muon (muon.hpp).
enum class OptimizerKind { adamw, sgd, muon };

template <>
struct EnumTable<OptimizerKind> {
  static constexpr EnumEntry<OptimizerKind> entries[] = {
      {OptimizerKind::adamw, "adamw", "AdamW"},
      {OptimizerKind::sgd, "sgd", "SGD with momentum"},
      {OptimizerKind::muon, "muon",
       "Muon for the hidden matrices (at their own lr), AdamW for embeddings, head, norms, "
       "biases and scales"},
  };
  static constexpr EnumParseText parse = {"parse_optimizer_kind", "optimizer", NameList::pipes,
                                          false};
};

// The names of EnumTable<OptimizerKind>; std::invalid_argument naming the text for another.
inline std::string_view to_string(OptimizerKind v) {
  return enum_name(v);
}
inline OptimizerKind parse_optimizer_kind(std::string_view text) {
  return parse_enum<OptimizerKind>(text);
}

// One named state tensor, e.g. {"optim.blocks.0.attn.w_q.exp_avg", (C, C)}.
template <class T>
using NamedTensor = std::pair<std::string, xt::xarray<T>>;

// "optim.<param>.<slot>": the name of a state tensor in state_tensors() and in checkpoints.
std::string optim_state_name(const std::string& param, const std::string& slot);

template <class T>
class Optimizer {
 public:
  virtual ~Optimizer() = default;
  Optimizer(const Optimizer&) = delete;
  Optimizer& operator=(const Optimizer&) = delete;

  // One update of every parameter from its current grad, at the current lr. Reads the grads and
  // does not clear them. Throws ShapeError naming the parameter if a value or grad no longer has
  // the shape the parameter had at construction.
  void step();
  // Assigns 0 to every grad (where the backend keeps it).
  void zero_grad();

  double lr() const { return lr_; }
  // Throws std::invalid_argument unless lr is finite and >= 0.
  void set_lr(double lr);
  // The lr that a schedule's multiplier is relative to (lr₀ of the independent weight decay,
  // WeightDecayMode): the lr at construction unless set (OptimizerGroups sets base · lr_mult).
  double base_lr() const { return base_lr_; }
  void set_base_lr(double lr);
  // Updates taken so far (the t of the bias corrections; 0 before the first step).
  std::size_t step_count() const { return step_; }
  const ParameterList<T>& parameters() const { return params_; }
  // "SGD" or "AdamW"; the op name in error messages.
  const std::string& name() const { return name_; }
  // Whether the weight decay applies to parameters()[i] (DecayParams above).
  bool decays(std::size_t i) const { return decays_.at(i); }

  // Every state tensor, named optim_state_name(param, slot), in parameter order then slot order.
  // The step count is separate: step_count(). The tensors are copies.
  std::vector<NamedTensor<T>> state_tensors() const;
  // The names of state_tensors(), in its order, without copying the tensors.
  std::vector<std::string> state_names() const;
  // Restores what state_tensors() and step_count() returned, for the same parameters (same names
  // and shapes). All checks run before anything is assigned: a missing, unknown or duplicate name
  // throws std::invalid_argument naming the tensor, a wrong shape throws ShapeError.
  void load_state(const std::vector<NamedTensor<T>>& tensors, std::size_t step_count);
  // The checks of load_state alone: throws as it would, assigns nothing (OptimizerGroups checks
  // every child before it loads any).
  void check_state(const std::vector<NamedTensor<T>>& tensors) const;

 protected:
  // Validates the list: non-empty, no null Parameter, no empty or duplicate name, no Parameter
  // listed twice, every grad shaped like its value. Errors name the parameter. `decay` decides
  // which parameters update() is asked to decay.
  Optimizer(std::string name, ParameterList<T> params, double lr,
            DecayParams decay = DecayParams::all);

  // Adds a zero-initialised state tensor per parameter, shaped like the parameter; returns its
  // slot.
  std::size_t add_slot(const std::string& slot);
  // Updates the n values at `value` (backend memory) from `grad`; state[s] points at the same run
  // of slot s. t is the 1-based number of this step; decay: whether the weight decay applies to
  // these values (update as with weight_decay 0 otherwise).
  virtual void update(DeviceOps<T>& ops, T* value, const T* grad, T* const* state, std::size_t n,
                      std::size_t t, bool decay) = 0;
  // An optimizer whose update needs each parameter's shape (Muon: a matrix at a time) returns true
  // here; step() then calls update_matrix once per parameter, never over a run of several.
  virtual bool per_parameter() const { return false; }
  virtual void update_matrix(DeviceOps<T>& ops, const std::vector<std::size_t>& shape, T* value,
                             const T* grad, T* const* state, std::size_t t, bool decay);
  // The shape parameters()[i] had at construction.
  const std::vector<std::size_t>& shape(std::size_t i) const { return shapes_.at(i); }

 private:
  // The parameters' backend; moves the state there first if it is elsewhere.
  DeviceOps<T>& backend();
  // load_state's checks: the tensor for state_names()[j] at [j]; throws as load_state documents.
  std::vector<const xt::xarray<T>*> match_state(const std::vector<NamedTensor<T>>& tensors) const;

  std::string name_;
  ParameterList<T> params_;
  std::vector<std::vector<std::size_t>> shapes_;  // shape of each parameter at construction
  std::vector<std::size_t> offsets_;              // where parameter i starts in a slot's arena
  std::size_t total_ = 0;                         // scalars over all parameters
  std::vector<bool> decays_;                      // per parameter: decayed?
  // Maximal runs of consecutive parameters alike in decays_: [first, last) parameters; the update
  // of parameters lying in order in one arena is one call per run (one, for DecayParams::all).
  struct Run {
    std::size_t first, last;
  };
  std::vector<Run> runs_;
  std::vector<std::string> slot_names_;  // e.g. {"exp_avg", "exp_avg_sq"}
  std::vector<Buffer<T>> slots_;         // one arena per slot, on state_ops_
  DeviceOps<T>* state_ops_ = nullptr;
  double lr_ = 0;
  double base_lr_ = 0;
  std::size_t step_ = 0;
};

}  // namespace attnlab
