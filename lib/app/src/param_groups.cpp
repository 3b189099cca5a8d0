#include "attnlab/app/param_groups.hpp"

#include <algorithm>
#include <stdexcept>

#include "attnlab/app/config_bounds.hpp"
#include "attnlab/optim/adamw.hpp"
#include "attnlab/optim/muon.hpp"
#include "attnlab/optim/sgd.hpp"
#include "attnlab/tensor.hpp"

namespace attnlab::app {

namespace {

// 49152 -> "49,152".
std::string with_commas(std::size_t n) {
  std::string digits = std::to_string(n), out;
  for (std::size_t i = 0; i < digits.size(); ++i) {
    if (i > 0 && (digits.size() - i) % 3 == 0) out += ',';
    out += digits[i];
  }
  return out;
}

// The model's parameter names and shapes, worked out from the config.
std::vector<ParameterShape> model_shapes(const TrainConfig& c) {
  return transformer_parameter_shapes(resolve_model(c.model, task_shape(c.task)));
}

// The optimizer of a group: its own, or the default group's for "" (the spec's optimizer is a
// checked OptimizerKind name: checked_assignment).
OptimizerKind group_optimizer(const ParamGroupSpec& spec, OptimizerKind fallback) {
  return spec.optimizer.empty() ? fallback : parse_optimizer_kind(spec.optimizer);
}

// The Muon hybrid's group: every block's matrices (attention and MLP weights), at muon_lr; named
// after its optimizer.
ParamGroupSpec muon_group(const TrainConfig& c) {
  ParamGroupSpec g;
  g.name = enum_name(OptimizerKind::muon);
  g.match.pattern = "blocks.*";
  g.match.rank = 2;
  g.optimizer = enum_name(OptimizerKind::muon);
  g.lr_mult = c.muon_lr / c.lr;
  return g;
}

// The groups a run forms: c.param_groups, then with optimizer muon the group "muon" when it still
// claims a parameter (the user's groups may have taken every hidden matrix), and the default
// group's optimizer (AdamW when the config's optimizer is muon: Muon takes matrices only).
struct EffectiveGroups {
  std::vector<ParamGroupSpec> specs;
  OptimizerKind default_optimizer = OptimizerKind::adamw;
};

EffectiveGroups effective_groups(const TrainConfig& c, const std::vector<std::string>& names,
                                 const std::vector<std::size_t>& ranks) {
  EffectiveGroups e{c.param_groups, c.optimizer};
  if (c.optimizer != OptimizerKind::muon) return e;
  e.default_optimizer = OptimizerKind::adamw;
  const ParamGroupSpec hidden = muon_group(c);
  if (std::any_of(c.param_groups.begin(), c.param_groups.end(),
                  [&hidden](const ParamGroupSpec& g) { return g.name == hidden.name; }))
    return e;  // the user named a group as the Muon group: theirs is the Muon group
  const std::vector<std::size_t> before = assign_param_groups(c.param_groups, names, ranks);
  for (std::size_t p = 0; p < names.size(); ++p) {
    if (before[p] == c.param_groups.size() && matches(hidden.match, names[p], ranks[p])) {
      e.specs.push_back(hidden);
      break;
    }
  }
  return e;
}

// check_param_groups' work: the groups and the partition when they pass.
struct Assignment {
  EffectiveGroups groups;
  std::vector<std::size_t> assigned;  // per parameter: its group, or specs.size() for default
};

Assignment checked_assignment(const TrainConfig& c, const std::vector<ParameterShape>& shapes) {
  const char* op = "train";
  const FieldBound& decay_bound = field_bound("weight_decay");
  for (std::size_t i = 0; i < c.param_groups.size(); ++i) {
    const ParamGroupSpec& g = c.param_groups[i];
    const std::string key = "param_groups[" + std::to_string(i) + "].";
    const std::string group = g.name.empty() ? "" : " (group '" + g.name + "')";
    check_arg(g.optimizer.empty() || find_enum<OptimizerKind>(g.optimizer).has_value(), op,
              key + "optimizer" + group,
              enum_names<OptimizerKind>() + ", or \"\" (the config's, " +
                  std::string(enum_name(c.optimizer)) + ")",
              "'" + g.optimizer + "'");
    if (g.weight_decay) {
      const std::string problem =
          bound_problem(decay_bound, *g.weight_decay, number_text(*g.weight_decay), true);
      if (!problem.empty())
        throw std::invalid_argument(std::string(op) + ": " + key + "weight_decay" + group + " " +
                                    problem);
    }
  }
  std::vector<std::string> names;
  std::vector<std::size_t> ranks;
  for (const ParameterShape& p : shapes) {
    names.push_back(p.name);
    ranks.push_back(p.shape.size());
  }
  Assignment a;
  try {
    a.groups = effective_groups(c, names, ranks);
    a.assigned = assign_param_groups(a.groups.specs, names, ranks);
  } catch (const std::invalid_argument& e) {
    throw std::invalid_argument(std::string(op) + ": " + e.what());
  }
  // Muon takes matrices only: a Muon group that claims another rank is named with its parameter.
  for (std::size_t p = 0; p < names.size(); ++p) {
    const std::size_t g = a.assigned[p];
    if (g == a.groups.specs.size() || ranks[p] == 2) continue;
    const ParamGroupSpec& spec = a.groups.specs[g];
    if (group_optimizer(spec, a.groups.default_optimizer) != OptimizerKind::muon) continue;
    const std::string key =
        g < c.param_groups.size() ? "param_groups[" + std::to_string(g) + "].match" : "optimizer";
    check_arg(false, op, key + " (group '" + spec.name + "')",
              "matrices only for optimizer " + std::string(enum_name(OptimizerKind::muon)) +
                  " (route the rest to " + std::string(enum_name(OptimizerKind::adamw)) + ")",
              "'" + names[p] + "' of rank " + std::to_string(ranks[p]));
  }
  return a;
}

}  // namespace

void check_param_groups(const TrainConfig& c) {
  if (c.param_groups.empty() && c.optimizer != OptimizerKind::muon) return;
  checked_assignment(c, model_shapes(c));
}

std::vector<ParamGroupPlan> plan_param_groups(const TrainConfig& c) {
  const std::vector<ParameterShape> shapes = model_shapes(c);
  const Assignment a = checked_assignment(c, shapes);
  const std::vector<ParamGroupSpec>& specs = a.groups.specs;
  const OptimizerKind fallback = a.groups.default_optimizer;
  const std::size_t n = specs.size();
  std::vector<ParamGroupPlan> plan(n + 1);
  for (std::size_t i = 0; i < n; ++i) {
    const ParamGroupSpec& g = specs[i];
    plan[i] = {g.name,
               group_optimizer(g, fallback),
               g.lr_mult.value_or(1.0),
               g.weight_decay.value_or(c.weight_decay),
               {},
               0};
  }
  plan[n] = {std::string(kDefaultParamGroup), fallback, 1.0, c.weight_decay, {}, 0};
  for (std::size_t p = 0; p < shapes.size(); ++p) {
    std::size_t size = 1;
    for (const std::size_t d : shapes[p].shape) size *= d;
    plan[a.assigned[p]].parameters.push_back(shapes[p].name);
    plan[a.assigned[p]].values += size;
  }
  if (n > 0 && plan[n].parameters.empty()) plan.pop_back();  // every parameter is in a group
  return plan;
}

std::string param_groups_text(const std::vector<ParamGroupPlan>& plan) {
  std::string out = "param groups:";
  for (std::size_t i = 0; i < plan.size(); ++i) {
    const ParamGroupPlan& g = plan[i];
    const std::size_t tensors = g.parameters.size();
    out += (i ? "; " : " ") + g.name + " " + std::string(enum_name(g.optimizer)) + " lr×" +
           number_text(g.lr_mult) + " wd " + number_text(g.weight_decay) + ": " +
           std::to_string(tensors) + (tensors == 1 ? " tensor (" : " tensors (") +
           with_commas(g.values) + " values)";
  }
  return out;
}

double optimizer_state_values(const std::vector<ParamGroupPlan>& plan) {
  double floats = 0;
  for (const ParamGroupPlan& g : plan)  // AdamW two moments, SGD and Muon one buffer
    floats += (g.optimizer == OptimizerKind::adamw ? 2.0 : 1.0) * static_cast<double>(g.values);
  return floats;
}

std::unique_ptr<Optimizer<float>> make_group_optimizer(const TrainConfig& c, OptimizerKind kind,
                                                       ParameterList<float> params,
                                                       double weight_decay) {
  switch (kind) {
    case OptimizerKind::adamw:
      return std::make_unique<AdamW<float>>(
          std::move(params),
          AdamWOptions{c.lr, c.beta1, c.beta2, 1e-8, weight_decay, c.decay_params, c.decay});
    case OptimizerKind::sgd:
      return std::make_unique<SGD<float>>(
          std::move(params), SgdOptions{c.lr, c.momentum, weight_decay, c.decay_params});
    case OptimizerKind::muon: {
      MuonOptions o;
      o.lr = c.lr;  // the base lr: the group's lr_mult makes it muon_lr
      o.momentum = c.muon_momentum;
      o.nesterov = c.muon_nesterov;
      o.ns_steps = c.muon_ns_steps;
      o.weight_decay = weight_decay;
      o.decay = c.decay;
      o.scale = c.muon_scale;
      o.decay_params = c.decay_params;
      return std::make_unique<Muon<float>>(std::move(params), o);
    }
  }
  check_arg(false, "train", "optimizer", enum_names<OptimizerKind>(), enum_name(kind));
  return nullptr;
}

OptimizerGroups<float> make_optimizer_groups(const TrainConfig& c,
                                             const ParameterList<float>& params) {
  std::vector<std::string> names;
  std::vector<std::size_t> ranks;
  for (const auto& np : params) {
    names.push_back(np.name);
    ranks.push_back(np.param->value.dimension());
  }
  const EffectiveGroups e = effective_groups(c, names, ranks);
  return build_param_groups<float>(
      params, e.specs, std::string(enum_name(e.default_optimizer)), c.weight_decay,
      [&c](const std::string& kind, ParameterList<float> list, double weight_decay) {
        return make_group_optimizer(c, parse_optimizer_kind(kind), std::move(list), weight_decay);
      });
}

}  // namespace attnlab::app
