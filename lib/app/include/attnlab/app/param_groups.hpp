// A run's parameter groups (TrainConfig::param_groups; lib/README.md, "Parameter groups"): the
// check of the config, the groups a run will form, worked out from the config before a model is
// built (what `attnlab train` prints and what the memory estimate counts), and the optimizers the
// trainer makes for them (the library's build_param_groups with this app's optimizer kinds).
#pragma once

#include <cstddef>
#include <memory>
#include <string>
#include <vector>

#include "attnlab/app/run_config.hpp"
#include "attnlab/optim/param_groups.hpp"

namespace attnlab::app {

// One group as the run forms it, every value resolved (the config's where the group names none).
struct ParamGroupPlan {
  std::string name;
  OptimizerKind optimizer = OptimizerKind::adamw;
  double lr_mult = 1;
  double weight_decay = 0;
  std::vector<std::string> parameters;  // in the model's order
  std::size_t values = 0;               // scalars over those parameters
};

// The checks of c.param_groups (validate(TrainConfig) calls it; c's model must resolve against its
// task): each group's optimizer (an OptimizerKind name, "" for the config's), weight_decay (the
// bound of the config's weight_decay), then the library's rules (names, selectors, lr_mult, a match
// for every group). std::invalid_argument "train: param_groups[i].<key> ... expected ..., got ...".
void check_param_groups(const TrainConfig& c);

// The groups of the run: one per c.param_groups entry, in order, then (optimizer muon) the group
// of every block's matrices at muon_lr, named after OptimizerKind::muon, when it still claims one
// and no entry has its name, then "default" with the
// parameters no entry claims (left out when there are none); no entries: "default" alone. From
// transformer_parameter_shapes of the resolved model, so nothing is allocated. Checks first
// (check_param_groups).
std::vector<ParamGroupPlan> plan_param_groups(const TrainConfig& c);

// One line: "param groups: hidden adamw lr×10 wd 0: 8 tensors (49,152 values); default adamw
// lr×1 wd 0.1: 13 tensors (1,040 values)".
std::string param_groups_text(const std::vector<ParamGroupPlan>& plan);

// The floats of optimizer state the groups keep: AdamW two per value, SGD and Muon one (the
// momentum buffer; an upper estimate for SGD when momentum is 0).
double optimizer_state_values(const std::vector<ParamGroupPlan>& plan);

// One group's optimizer of kind `kind`, with the config's lr (the base lr), betas, momentum,
// Muon's settings and decay_params, and `weight_decay`.
std::unique_ptr<Optimizer<float>> make_group_optimizer(const TrainConfig& c, OptimizerKind kind,
                                                       ParameterList<float> params,
                                                       double weight_decay);

// The run's optimizers over the model's parameters: build_param_groups with c.param_groups, the
// config's optimizer and weight_decay as the default group's, and make_group_optimizer. No
// param_groups: one group, the optimizer the run made before groups existed.
OptimizerGroups<float> make_optimizer_groups(const TrainConfig& c,
                                             const ParameterList<float>& params);

}  // namespace attnlab::app
