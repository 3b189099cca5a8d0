// Parameter groups: the parameters of one model split among several optimizers, each with its own
// kind (AdamW, SGD, ...), weight decay and learning-rate multiplier (torch.optim's param_groups,
// nanoGPT's decay / no-decay groups, the Muon recipes' matrices / the rest), chosen by name
// pattern, rank or kind of parameter. lib/README.md, "Parameter groups".
//
// - ParamSelector / matches: which parameters a group claims.
// - ParameterKind / transformer_parameter_kind: what each of a Transformer's parameters is.
// - ParamGroupSpec / assign_param_groups / build_param_groups: the partition, in order; a
//   parameter joins the FIRST group whose selector matches it, the rest form the group "default".
// - OptimizerGroups: the handle a training loop holds over the groups' optimizers; one LR for all,
//   each group's optimizer running at lr · lr_mult; its state named as a single Optimizer names it
//   ("optim.<param>.<slot>"), so a checkpoint of one group and of several read alike.
#pragma once

#include <cstddef>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "attnlab/optim/optimizer.hpp"

namespace attnlab {

// Which parameters a group claims: every condition set must hold; at least one must be set.
struct ParamSelector {
  // A glob over the whole name: '*' matches any run of characters, dots included (so
  // "blocks.*.attn.w_*" takes every block's w_q, w_k, w_v and w_o); every other character matches
  // itself. "" = any name.
  std::string pattern = {};
  int rank = 0;           // 0 = any rank, else exactly this rank (2: the matrices)
  std::string kind = {};  // "" = any kind, else a ParameterKind name (transformer_parameter_kind)
  bool operator==(const ParamSelector&) const = default;
};

// Whether `name` matches `pattern` (ParamSelector::pattern's rule; anchored at both ends).
bool glob_match(std::string_view pattern, std::string_view name);

// Throws std::invalid_argument "ParamSelector: ..." for a selector with nothing set, a negative
// rank or an unknown kind.
void validate(const ParamSelector& selector);

// Whether the parameter `name` of rank `rank` meets every condition of `selector` (validated
// first). A kind condition classifies the name with transformer_parameter_kind, so it throws for a
// name that is not a Transformer's.
bool matches(const ParamSelector& selector, const std::string& name, std::size_t rank);

// A selector as error messages and printouts show it: {pattern "blocks.*.w_*", rank 2}.
std::string to_string(const ParamSelector& selector);

// What a parameter of attnlab's Transformer is (each entry's help says which parameters).
enum class ParameterKind { embedding, attention, mlp, head, norm, bias, scale };

template <>
struct EnumTable<ParameterKind> {
  static constexpr EnumEntry<ParameterKind> entries[] = {
      {ParameterKind::embedding, "embedding",
       "the token tables (embed.fields.<i>.table) and the learned position table (pos.table); "
       "with tie_embeddings the head reads token table 0, which stays embedding (there is no "
       "head.w)"},
      {ParameterKind::attention, "attention", "blocks.<l>.attn.w_q, w_k, w_v, w_o"},
      {ParameterKind::mlp, "mlp", "blocks.<l>.mlp.fc1.w, fc2.w"},
      {ParameterKind::head, "head", "head.w"},
      {ParameterKind::norm, "norm", "every gamma and beta: ln1, ln2, ln_f, attn.q_norm, k_norm"},
      {ParameterKind::bias, "bias", "the MLP's biases, blocks.<l>.mlp.fc1.b, fc2.b"},
      {ParameterKind::scale, "scale",
       "the learnable per-head log-scales, blocks.<l>.attn.log_scale"},
  };
  static constexpr EnumParseText parse = {"parse_parameter_kind", "kind"};
};

// The names of EnumTable<ParameterKind>; std::invalid_argument "parse_parameter_kind: kind
// expected <the names>, got '...'" for another.
inline std::string_view to_string(ParameterKind kind) {
  return enum_name(kind);
}
inline ParameterKind parse_parameter_kind(std::string_view text) {
  return parse_enum<ParameterKind>(text);
}
// The kind of a Transformer parameter by its name (transformer_parameter_shapes' names);
// std::invalid_argument naming the parameter for a name a Transformer does not have.
ParameterKind transformer_parameter_kind(const std::string& name);

// One group of a partition.
struct ParamGroupSpec {
  std::string name = {};  // unique, not empty, not "default" (the group of the rest)
  ParamSelector match = {};
  std::string optimizer = {};          // the factory's kind (an OptimizerKind name); "" = default
  std::optional<double> lr_mult = {};  // finite, >= 0; none = 1
  std::optional<double> weight_decay = {};  // finite, >= 0; none = the default group's
  bool operator==(const ParamGroupSpec&) const = default;
};

// The name of the group of the parameters that no spec claims.
inline constexpr std::string_view kDefaultParamGroup = "default";

// Checks the specs alone: names (unique, not empty, not "default"), selectors (validate above),
// lr_mult and weight_decay (finite, >= 0). std::invalid_argument
// "param_groups[i].<key> (group '<name>') expected ..., got ...".
void validate(const std::vector<ParamGroupSpec>& specs);

// The partition of the parameters named `names` (of ranks `ranks`, alike in length): for each
// parameter, the index of the first spec whose selector matches it, or specs.size() for the
// default group. Validates the specs first; a spec that claims no parameter throws
// std::invalid_argument "param_groups[i].match (group '<name>') expected a selector that matches
// a parameter, got {...}: ..." (whether it matched none, or only parameters of earlier groups).
std::vector<std::size_t> assign_param_groups(const std::vector<ParamGroupSpec>& specs,
                                             const std::vector<std::string>& names,
                                             const std::vector<std::size_t>& ranks);

// One group of OptimizerGroups: its name, its optimizer over its parameters, and the factor its
// optimizer's lr is of the base lr (OptimizerGroups::set_lr).
template <class T>
struct OptimizerGroup {
  std::string name;
  std::unique_ptr<Optimizer<T>> optimizer;
  double lr_mult = 1;
};

// What OptimizerGroups::groups() reports of one group, for printouts and checks.
struct ParamGroupInfo {
  std::string name;
  std::string optimizer;  // Optimizer::name(): "AdamW", "SGD"
  double lr_mult = 1;
  std::vector<std::string> parameters;  // in the optimizer's order
  std::size_t values = 0;               // scalars over those parameters
};

// The training loop's handle over one or more optimizers with disjoint parameters. Not an
// Optimizer: it owns them and forwards, so each keeps its own update, state and step count (they
// step together, so the counts agree).
template <class T>
class OptimizerGroups {
 public:
  // At least one group; names unique and not empty; lr_mult finite and >= 0; no parameter in two
  // groups (std::invalid_argument naming the group or the parameter). The optimizers' lr as
  // constructed is the base lr and must agree (set it, don't scale it: lr_mult scales it); each
  // is then set to base · lr_mult.
  explicit OptimizerGroups(std::vector<OptimizerGroup<T>> groups);

  // One update of every group, in group order (Optimizer::step).
  void step();
  void zero_grad();
  // The base lr: each group's optimizer gets lr · its lr_mult (std::invalid_argument unless lr and
  // each product are finite and >= 0; nothing is changed then).
  void set_lr(double lr);
  double lr() const { return lr_; }
  // The first group's (every group steps together).
  std::size_t step_count() const;

  // Every group's state_tensors(), in group order; the names are the optimizers' own
  // (optim.<param>.<slot>), so one group's list is that of a single optimizer over the same
  // parameters.
  std::vector<NamedTensor<T>> state_tensors() const;
  // Gives each tensor to the group whose optimizer has a state tensor of that name, then loads
  // each group (Optimizer::load_state). Every check runs before anything is assigned: an unknown
  // or repeated name throws std::invalid_argument naming the tensor; a missing one or a wrong shape
  // throws as Optimizer::load_state does.
  void load_state(const std::vector<NamedTensor<T>>& tensors, std::size_t step_count);

  // Every group's parameters, in group order.
  ParameterList<T> parameters() const;
  // Whether the weight decay (of its group's optimizer) applies to parameters()[i]
  // (Optimizer::decays).
  bool decays(std::size_t i) const;
  std::vector<ParamGroupInfo> groups() const;
  std::size_t size() const { return groups_.size(); }
  const OptimizerGroup<T>& group(std::size_t g) const { return groups_.at(g); }

 private:
  std::vector<OptimizerGroup<T>> groups_;
  double lr_ = 0;
};

// Makes one group's optimizer: the kind (a spec's optimizer, or the default's), its parameters and
// its weight decay. The lr it is made with is the base lr (OptimizerGroups' constructor).
template <class T>
using OptimizerFactory = std::function<std::unique_ptr<Optimizer<T>>(
    const std::string& optimizer, ParameterList<T> params, double weight_decay)>;

// The groups of `params` by `specs` (assign_param_groups on the parameters' names and ranks): one
// per spec, in order, then "default" with the parameters no spec claims (left out when there are
// none), each parameter list in the order of `params`. Each group's optimizer comes from
// make(spec.optimizer or default_optimizer, its parameters, spec.weight_decay or
// default_weight_decay), its lr_mult from spec.lr_mult or 1. No specs: one group "default" over
// `params`, exactly the optimizer make(default_optimizer, params, default_weight_decay) is alone.
template <class T>
OptimizerGroups<T> build_param_groups(const ParameterList<T>& params,
                                      const std::vector<ParamGroupSpec>& specs,
                                      const std::string& default_optimizer,
                                      double default_weight_decay, const OptimizerFactory<T>& make);

extern template class OptimizerGroups<float>;
extern template class OptimizerGroups<double>;
extern template OptimizerGroups<float> build_param_groups<float>(const ParameterList<float>&,
                                                                 const std::vector<ParamGroupSpec>&,
                                                                 const std::string&, double,
                                                                 const OptimizerFactory<float>&);
extern template OptimizerGroups<double> build_param_groups<double>(
    const ParameterList<double>&, const std::vector<ParamGroupSpec>&, const std::string&, double,
    const OptimizerFactory<double>&);

}  // namespace attnlab
