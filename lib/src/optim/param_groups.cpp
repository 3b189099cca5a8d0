#include "attnlab/optim/param_groups.hpp"

#include <cmath>
#include <map>
#include <set>
#include <stdexcept>

#include "attnlab/tensor.hpp"
#include "option_checks.hpp"

namespace attnlab {

namespace {

std::string in_quotes(std::string_view s) {
  return "'" + std::string(s) + "'";
}

// "param_groups[i].<key> (group '<name>') expected <what>, got <got>".
[[noreturn]] void refuse(std::size_t i, const std::string& group, const std::string& key,
                         const std::string& what, const std::string& got) {
  std::string where = "param_groups[" + std::to_string(i) + "]." + key;
  if (!group.empty()) where += " (group " + in_quotes(group) + ")";
  throw std::invalid_argument(where + " expected " + what + ", got " + got);
}

}  // namespace

bool glob_match(std::string_view pattern, std::string_view name) {
  // Iterative matching with one backtrack point (the last '*'): linear in practice, never
  // exponential.
  std::size_t p = 0, n = 0, star = std::string_view::npos, resume = 0;
  while (n < name.size()) {
    if (p < pattern.size() && pattern[p] == '*') {
      star = p++;
      resume = n;
    } else if (p < pattern.size() && pattern[p] == name[n]) {
      ++p;
      ++n;
    } else if (star != std::string_view::npos) {
      p = star + 1;
      n = ++resume;
    } else {
      return false;
    }
  }
  while (p < pattern.size() && pattern[p] == '*') ++p;
  return p == pattern.size();
}

ParameterKind transformer_parameter_kind(const std::string& name) {
  // transformer_parameter_shapes' names (lib/src/nn/transformer.cpp), most specific first.
  static const std::vector<std::pair<std::string_view, ParameterKind>> rules = {
      {"embed.fields.*.table", ParameterKind::embedding},
      {"pos.table", ParameterKind::embedding},
      {"blocks.*.attn.w_q", ParameterKind::attention},
      {"blocks.*.attn.w_k", ParameterKind::attention},
      {"blocks.*.attn.w_v", ParameterKind::attention},
      {"blocks.*.attn.w_o", ParameterKind::attention},
      {"blocks.*.attn.log_scale", ParameterKind::scale},
      {"blocks.*.mlp.fc1.w", ParameterKind::mlp},
      {"blocks.*.mlp.fc2.w", ParameterKind::mlp},
      {"blocks.*.mlp.fc1.b", ParameterKind::bias},
      {"blocks.*.mlp.fc2.b", ParameterKind::bias},
      {"head.w", ParameterKind::head},
      {"blocks.*.ln1.gamma", ParameterKind::norm},
      {"blocks.*.ln1.beta", ParameterKind::norm},
      {"blocks.*.ln2.gamma", ParameterKind::norm},
      {"blocks.*.ln2.beta", ParameterKind::norm},
      {"blocks.*.attn.q_norm.gamma", ParameterKind::norm},
      {"blocks.*.attn.q_norm.beta", ParameterKind::norm},
      {"blocks.*.attn.k_norm.gamma", ParameterKind::norm},
      {"blocks.*.attn.k_norm.beta", ParameterKind::norm},
      {"ln_f.gamma", ParameterKind::norm},
      {"ln_f.beta", ParameterKind::norm},
  };
  for (const auto& [pattern, kind] : rules) {
    if (glob_match(pattern, name)) return kind;
  }
  check_arg(false, "transformer_parameter_kind", "parameter " + in_quotes(name),
            "the name of a Transformer's parameter (embed.fields.<i>.table, pos.table, "
            "blocks.<l>.attn.*, blocks.<l>.mlp.*, blocks.<l>.ln1.*, blocks.<l>.ln2.*, ln_f.*, "
            "head.w)",
            "another name");
  return ParameterKind::embedding;
}

namespace {

// What is wrong with a selector: the field ("" for the whole), what it expects and what it got.
struct SelectorProblem {
  std::string field, expected, got;
};

std::optional<SelectorProblem> selector_problem(const ParamSelector& s) {
  if (s.pattern.empty() && s.rank == 0 && s.kind.empty())
    return SelectorProblem{"", "at least one of pattern, rank, kind",
                           "none (a selector with nothing set)"};
  if (s.rank < 0) return SelectorProblem{"rank", ">= 0 (0: any rank)", std::to_string(s.rank)};
  if (!s.kind.empty() && !find_enum<ParameterKind>(s.kind))
    return SelectorProblem{"kind", enum_names<ParameterKind>() + " or \"\" (any kind)",
                           in_quotes(s.kind)};
  return std::nullopt;
}

}  // namespace

void validate(const ParamSelector& s) {
  if (const auto problem = selector_problem(s))
    check_arg(false, "ParamSelector", problem->field.empty() ? "selector" : problem->field,
              problem->expected, problem->got);
}

bool matches(const ParamSelector& s, const std::string& name, std::size_t rank) {
  validate(s);
  if (s.rank != 0 && rank != static_cast<std::size_t>(s.rank)) return false;
  if (!s.pattern.empty() && !glob_match(s.pattern, name)) return false;
  if (!s.kind.empty() && transformer_parameter_kind(name) != parse_parameter_kind(s.kind))
    return false;
  return true;
}

std::string to_string(const ParamSelector& s) {
  std::string out;
  const auto add = [&](const std::string& part) { out += (out.empty() ? "" : ", ") + part; };
  if (!s.pattern.empty()) add("pattern \"" + s.pattern + "\"");
  if (s.rank != 0) add("rank " + std::to_string(s.rank));
  if (!s.kind.empty()) add("kind " + s.kind);
  return "{" + out + "}";
}

void validate(const std::vector<ParamGroupSpec>& specs) {
  std::map<std::string, std::size_t> seen;
  for (std::size_t i = 0; i < specs.size(); ++i) {
    const ParamGroupSpec& g = specs[i];
    if (g.name.empty()) refuse(i, "", "name", "a non-empty name", "\"\"");
    if (g.name == kDefaultParamGroup)
      refuse(i, "", "name",
             "a name other than 'default' (the group of the parameters no selector claims)",
             in_quotes(g.name));
    if (const auto [it, fresh] = seen.emplace(g.name, i); !fresh)
      refuse(i, "", "name", "a name no other group has",
             in_quotes(g.name) + ", the name of param_groups[" + std::to_string(it->second) + "]");
    if (const auto problem = selector_problem(g.match))
      refuse(i, g.name, problem->field.empty() ? "match" : "match." + problem->field,
             problem->expected, problem->got);
    if (g.lr_mult && !(std::isfinite(*g.lr_mult) && *g.lr_mult >= 0))
      refuse(i, g.name, "lr_mult", "a finite value >= 0", number_text(*g.lr_mult));
    if (g.weight_decay && !(std::isfinite(*g.weight_decay) && *g.weight_decay >= 0))
      refuse(i, g.name, "weight_decay", "a finite value >= 0", number_text(*g.weight_decay));
  }
}

std::vector<std::size_t> assign_param_groups(const std::vector<ParamGroupSpec>& specs,
                                             const std::vector<std::string>& names,
                                             const std::vector<std::size_t>& ranks) {
  check_arg(names.size() == ranks.size(), "assign_param_groups", "ranks",
            "one per name (" + std::to_string(names.size()) + ")", std::to_string(ranks.size()));
  validate(specs);
  std::vector<std::size_t> group(names.size(), specs.size());
  std::vector<std::size_t> claimed(specs.size(), 0), matched(specs.size(), 0);
  std::vector<std::string> first_taken(specs.size());  // a match that an earlier group had
  for (std::size_t p = 0; p < names.size(); ++p) {
    for (std::size_t i = 0; i < specs.size(); ++i) {
      bool match = false;
      try {
        match = matches(specs[i].match, names[p], ranks[p]);
      } catch (const std::invalid_argument&) {  // a kind selector over a name it cannot classify
        refuse(i, specs[i].name, "match.kind",
               "a selector over a Transformer's parameters (kind classifies their names)",
               in_quotes(specs[i].match.kind) + " for the parameter " + in_quotes(names[p]));
      }
      if (!match) continue;
      ++matched[i];
      if (group[p] == specs.size()) {
        group[p] = i;
        ++claimed[i];
      } else if (first_taken[i].empty()) {
        first_taken[i] = names[p] + " (in '" + specs[group[p]].name + "')";
      }
    }
  }
  for (std::size_t i = 0; i < specs.size(); ++i) {
    if (claimed[i] > 0) continue;
    const std::string why =
        matched[i] == 0
            ? "it matched none of the " + std::to_string(names.size()) + " parameters"
            : "it matched only parameters that earlier groups claimed (a parameter joins the first "
              "group that matches it), e.g. " +
                  first_taken[i];
    refuse(i, specs[i].name, "match", "a selector that matches a parameter",
           to_string(specs[i].match) + ": " + why);
  }
  return group;
}

template <class T>
OptimizerGroups<T>::OptimizerGroups(std::vector<OptimizerGroup<T>> groups)
    : groups_(std::move(groups)) {
  const char* op = "OptimizerGroups";
  check_arg(!groups_.empty(), op, "groups", "at least one group", "none");
  std::set<std::string> names;
  std::map<const Parameter<T>*, std::string> owner;  // parameter -> its group
  std::map<std::string, std::string> owner_by_name;  // parameter name -> its group
  for (const OptimizerGroup<T>& g : groups_) {
    check_arg(!g.name.empty(), op, "group name", "a non-empty name", "\"\"");
    check_arg(names.insert(g.name).second, op, "group names", "unique names",
              in_quotes(g.name) + " twice");
    check_arg(g.optimizer != nullptr, op, "group " + in_quotes(g.name), "an optimizer",
              "a null pointer");
    check_arg(std::isfinite(g.lr_mult) && g.lr_mult >= 0, op,
              "lr_mult of group " + in_quotes(g.name), "a finite value >= 0",
              number_text(g.lr_mult));
    const double base = groups_[0].optimizer->lr();
    check_arg(g.optimizer->lr() == base, op, "lr of group " + in_quotes(g.name),
              number_text(base) + ", the first group's (the base lr, which lr_mult scales)",
              number_text(g.optimizer->lr()));
    for (const auto& np : g.optimizer->parameters()) {
      const auto [it, fresh] = owner.emplace(np.param, g.name);
      check_arg(fresh, op, "parameter " + in_quotes(np.name), "in one group only",
                "in " + in_quotes(it->second) + " and " + in_quotes(g.name));
      const auto [at, fresh_name] = owner_by_name.emplace(np.name, g.name);
      check_arg(fresh_name, op, "parameter name " + in_quotes(np.name), "in one group only",
                "in " + in_quotes(at->second) + " and " + in_quotes(g.name));
    }
  }
  const double base = groups_[0].optimizer->lr();
  for (OptimizerGroup<T>& g : groups_) g.optimizer->set_base_lr(base * g.lr_mult);
  set_lr(base);
}

template <class T>
void OptimizerGroups<T>::step() {
  for (auto& g : groups_) g.optimizer->step();
}

template <class T>
void OptimizerGroups<T>::zero_grad() {
  for (auto& g : groups_) g.optimizer->zero_grad();
}

template <class T>
void OptimizerGroups<T>::set_lr(double lr) {
  option_checks::finite_non_negative("OptimizerGroups", "lr", lr);
  for (const auto& g : groups_) {
    const double scaled = lr * g.lr_mult;
    check_arg(std::isfinite(scaled), "OptimizerGroups",
              "lr · lr_mult of group " + in_quotes(g.name), "a finite value",
              number_text(lr) + " · " + number_text(g.lr_mult));
  }
  for (auto& g : groups_) g.optimizer->set_lr(lr * g.lr_mult);
  lr_ = lr;
}

template <class T>
std::size_t OptimizerGroups<T>::step_count() const {
  return groups_[0].optimizer->step_count();
}

template <class T>
std::vector<NamedTensor<T>> OptimizerGroups<T>::state_tensors() const {
  std::vector<NamedTensor<T>> out;
  for (const auto& g : groups_) {
    for (auto& t : g.optimizer->state_tensors()) out.push_back(std::move(t));
  }
  return out;
}

template <class T>
void OptimizerGroups<T>::load_state(const std::vector<NamedTensor<T>>& tensors,
                                    std::size_t step_count) {
  const char* op = "OptimizerGroups.load_state";
  std::map<std::string, std::size_t> owner;  // state tensor name -> group
  for (std::size_t g = 0; g < groups_.size(); ++g) {
    for (auto& name : groups_[g].optimizer->state_names()) owner.emplace(std::move(name), g);
  }
  std::vector<std::vector<NamedTensor<T>>> parts(groups_.size());
  std::set<std::string> seen;
  for (const auto& t : tensors) {
    const auto it = owner.find(t.first);
    check_arg(it != owner.end(), op, "state tensor " + in_quotes(t.first),
              "the name of a state tensor of one of the groups (optim.<param>.<slot>)",
              "an unknown name");
    check_arg(seen.insert(t.first).second, op, "state tensor " + in_quotes(t.first), "once",
              "twice");
    parts[it->second].push_back(t);
  }
  for (std::size_t g = 0; g < groups_.size(); ++g) groups_[g].optimizer->check_state(parts[g]);
  for (std::size_t g = 0; g < groups_.size(); ++g)
    groups_[g].optimizer->load_state(parts[g], step_count);
}

template <class T>
ParameterList<T> OptimizerGroups<T>::parameters() const {
  ParameterList<T> out;
  for (const auto& g : groups_) {
    const auto& p = g.optimizer->parameters();
    out.insert(out.end(), p.begin(), p.end());
  }
  return out;
}

template <class T>
bool OptimizerGroups<T>::decays(std::size_t i) const {
  for (const auto& g : groups_) {
    const std::size_t n = g.optimizer->parameters().size();
    if (i < n) return g.optimizer->decays(i);
    i -= n;
  }
  throw std::out_of_range("OptimizerGroups::decays: no parameter " + std::to_string(i));
}

template <class T>
std::vector<ParamGroupInfo> OptimizerGroups<T>::groups() const {
  std::vector<ParamGroupInfo> out;
  for (const auto& g : groups_) {
    ParamGroupInfo info{g.name, g.optimizer->name(), g.lr_mult, {}, 0};
    for (const auto& np : g.optimizer->parameters()) {
      info.parameters.push_back(np.name);
      info.values += np.param->size();
    }
    out.push_back(std::move(info));
  }
  return out;
}

template <class T>
OptimizerGroups<T> build_param_groups(const ParameterList<T>& params,
                                      const std::vector<ParamGroupSpec>& specs,
                                      const std::string& default_optimizer,
                                      double default_weight_decay,
                                      const OptimizerFactory<T>& make) {
  std::vector<std::string> names;
  std::vector<std::size_t> ranks;
  for (const auto& np : params) {
    check_arg(np.param != nullptr, "build_param_groups", "parameter " + in_quotes(np.name),
              "a Parameter", "a null pointer");
    names.push_back(np.name);
    ranks.push_back(np.param->value.dimension());
  }
  const std::vector<std::size_t> assigned = assign_param_groups(specs, names, ranks);
  std::vector<ParameterList<T>> lists(specs.size() + 1);
  for (std::size_t p = 0; p < params.size(); ++p) lists[assigned[p]].push_back(params[p]);
  std::vector<OptimizerGroup<T>> groups;
  for (std::size_t i = 0; i < specs.size(); ++i) {
    const ParamGroupSpec& s = specs[i];
    const std::string& kind = s.optimizer.empty() ? default_optimizer : s.optimizer;
    groups.push_back(
        {s.name, make(kind, std::move(lists[i]), s.weight_decay.value_or(default_weight_decay)),
         s.lr_mult.value_or(1.0)});
  }
  // The rest; with no specs, every parameter (an empty list then reaches the optimizer, which
  // refuses it as it would alone).
  if (specs.empty() || !lists.back().empty()) {
    groups.push_back({std::string(kDefaultParamGroup),
                      make(default_optimizer, std::move(lists.back()), default_weight_decay), 1.0});
  }
  for (std::size_t i = 0; i < groups.size(); ++i) {
    check_arg(groups[i].optimizer != nullptr, "build_param_groups",
              "the optimizer of group " + in_quotes(groups[i].name), "one made by the factory",
              "a null pointer");
  }
  return OptimizerGroups<T>(std::move(groups));
}

template class OptimizerGroups<float>;
template class OptimizerGroups<double>;
template OptimizerGroups<float> build_param_groups<float>(const ParameterList<float>&,
                                                          const std::vector<ParamGroupSpec>&,
                                                          const std::string&, double,
                                                          const OptimizerFactory<float>&);
template OptimizerGroups<double> build_param_groups<double>(const ParameterList<double>&,
                                                            const std::vector<ParamGroupSpec>&,
                                                            const std::string&, double,
                                                            const OptimizerFactory<double>&);

}  // namespace attnlab
