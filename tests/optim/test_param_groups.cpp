// Parameter groups (attnlab/optim/param_groups.hpp): the glob and the selectors, the kinds of a
// Transformer's parameters, the partition (first match wins, the rest in "default") and its
// errors, and OptimizerGroups against single optimizers: lr multipliers, weight decay per group,
// and a saved and restored state that continues bit-identically.
#include <doctest/doctest.h>

#include <cmath>
#include <limits>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include <xtensor/xarray.hpp>
#include <xtensor/xbuilder.hpp>

#include "attnlab/backends/emulated.hpp"
#include "attnlab/nn/transformer.hpp"
#include "attnlab/optim/adamw.hpp"
#include "attnlab/optim/param_groups.hpp"
#include "attnlab/optim/sgd.hpp"
#include "attnlab/random.hpp"
#include "helpers.hpp"

using namespace attnlab;

namespace {

// Every kind of parameter: tables, weights, biases, norm gains and shifts, QK-norm's, log-scales.
TransformerConfig groups_config() {
  TransformerConfig c;
  c.vocab_sizes = {5};
  c.out_vocab = 4;
  c.max_len = 4;
  c.layers = 2;
  c.block.attention.d_model = 8;
  c.block.attention.heads = 2;
  c.block.attention.qk_norm = true;
  c.block.attention.learnable_scale = true;
  c.block.d_ff = 12;
  return c;
}

ParamGroupSpec spec(std::string name, ParamSelector match, std::string optimizer = "",
                    std::optional<double> lr_mult = std::nullopt,
                    std::optional<double> weight_decay = std::nullopt) {
  return {std::move(name), std::move(match), std::move(optimizer), lr_mult, weight_decay};
}

// The groups' base lr (dyadic: lr · 2 and lr · 10 are exact).
constexpr double kLr = 0.0625;

// AdamW or SGD (momentum 0.9 unless told) by kind, at the base lr and weight_decay.
OptimizerFactory<double> factory(double momentum = 0.9) {
  return [momentum](const std::string& kind, ParameterList<double> params,
                    double weight_decay) -> std::unique_ptr<Optimizer<double>> {
    if (kind == "adamw")
      return std::make_unique<AdamW<double>>(std::move(params),
                                             AdamWOptions{kLr, 0.9, 0.95, 1e-8, weight_decay});
    if (kind == "sgd")
      return std::make_unique<SGD<double>>(std::move(params),
                                           SgdOptions{kLr, momentum, weight_decay});
    throw std::invalid_argument("test factory: no optimizer '" + kind + "'");
  };
}

// The same random grads for every model built from the same seed: one Rng per run.
void fill_grads(const ParameterList<double>& params, Rng& grads) {
  for (const auto& p : params)
    for (auto& g : p.param->grad) g = grads.normal();
}

std::map<std::string, xt::xarray<double>> values(const ParameterList<double>& params) {
  std::map<std::string, xt::xarray<double>> out;
  for (const auto& p : params) out[p.name] = p.param->value;
  return out;
}

// A fresh model (seed 5), its weights zero when asked.
struct Fresh {
  explicit Fresh(bool zero = false) : rng(5), model(groups_config(), rng) {
    params = model.parameters();
    if (zero)
      for (const auto& p : params) p.param->value.fill(0);
  }
  Rng rng;
  Transformer<double> model;
  ParameterList<double> params;
};

// `steps` steps of `specs` over a fresh model with the grads of Rng(6); the final values.
std::map<std::string, xt::xarray<double>> train_groups(const std::vector<ParamGroupSpec>& specs,
                                                       const std::string& default_kind,
                                                       double default_wd, int steps,
                                                       double momentum = 0.9,
                                                       bool zero_weights = false) {
  Fresh fresh(zero_weights);
  const ParameterList<double>& params = fresh.params;
  OptimizerGroups<double> groups =
      build_param_groups<double>(params, specs, default_kind, default_wd, factory(momentum));
  Rng grads(6);
  for (int step = 0; step < steps; ++step) {
    fill_grads(params, grads);
    groups.step();
  }
  return values(params);
}

// The same with one optimizer over every parameter.
std::map<std::string, xt::xarray<double>> train_single(const std::string& kind, double wd,
                                                       int steps, double lr = 0,
                                                       double momentum = 0.9,
                                                       bool zero_weights = false) {
  Fresh fresh(zero_weights);
  const ParameterList<double>& params = fresh.params;
  auto opt = factory(momentum)(kind, params, wd);
  if (lr > 0) opt->set_lr(lr);
  Rng grads(6);
  for (int step = 0; step < steps; ++step) {
    fill_grads(params, grads);
    opt->step();
  }
  return values(params);
}

std::map<std::string, xt::xarray<double>> initial_values() {
  return values(Fresh().params);
}

}  // namespace

TEST_CASE("param groups: the glob's '*' spans dots, any number of stars, anchored at both ends") {
  CHECK(glob_match("blocks.*.attn.w_*", "blocks.0.attn.w_q"));
  CHECK(glob_match("blocks.*.attn.w_*", "blocks.11.attn.w_o"));
  CHECK(glob_match("blocks.*.w_*", "blocks.0.attn.w_q"));  // '*' takes "0.attn"
  CHECK_FALSE(glob_match("blocks.*.attn.w_*", "blocks.0.attn.q_norm.gamma"));
  CHECK_FALSE(glob_match("blocks.*.attn.w_q", "xblocks.0.attn.w_q"));  // anchored at the start
  CHECK_FALSE(glob_match("blocks.*.attn.w_q", "blocks.0.attn.w_q2"));  // and at the end
  CHECK_FALSE(glob_match("ln_f.gamma", "ln_fxgamma"));                 // '.' is itself
  CHECK(glob_match("*.gamma", "ln_f.gamma"));
  CHECK(glob_match("*.gamma", "blocks.1.attn.q_norm.gamma"));
  CHECK_FALSE(glob_match("*.gamma", "gamma"));
  CHECK(glob_match("*", "head.w"));
  CHECK(glob_match("*", ""));
  CHECK(glob_match("**", "a.b"));
  CHECK(glob_match("*a*b*c*", "xxaxxbxxcxx"));
  CHECK_FALSE(glob_match("*a*b*c*", "xxcxxbxxaxx"));
  CHECK(glob_match("a*a*a", "aaaaa"));
  CHECK_FALSE(glob_match("a*a*a", "aa"));
  CHECK(glob_match("head.w", "head.w"));
  CHECK_FALSE(glob_match("", "head.w"));
  CHECK(glob_match("", ""));
  // A pathological pattern stays fast (one backtrack point).
  CHECK_FALSE(glob_match("*a*a*a*a*a*a*a*a*b", std::string(10000, 'a')));
}

TEST_CASE("param groups: the kinds of a Transformer's parameters") {
  std::map<std::string, std::string> kinds;
  for (const ParameterShape& p : transformer_parameter_shapes(groups_config()))
    kinds[p.name] = std::string(to_string(transformer_parameter_kind(p.name)));
  CHECK(kinds.at("embed.fields.0.table") == "embedding");
  CHECK(kinds.at("pos.table") == "embedding");
  for (const char* w : {"w_q", "w_k", "w_v", "w_o"})
    CHECK(kinds.at(std::string("blocks.1.attn.") + w) == "attention");
  CHECK(kinds.at("blocks.0.mlp.fc1.w") == "mlp");
  CHECK(kinds.at("blocks.0.mlp.fc2.w") == "mlp");
  CHECK(kinds.at("blocks.0.mlp.fc1.b") == "bias");
  CHECK(kinds.at("blocks.0.mlp.fc2.b") == "bias");
  CHECK(kinds.at("head.w") == "head");
  for (const char* n :
       {"blocks.0.ln1.gamma", "blocks.0.ln1.beta", "blocks.1.ln2.gamma", "blocks.1.ln2.beta",
        "blocks.0.attn.q_norm.gamma", "blocks.0.attn.q_norm.beta", "blocks.0.attn.k_norm.gamma",
        "blocks.0.attn.k_norm.beta", "ln_f.gamma", "ln_f.beta"})
    CHECK(kinds.at(n) == "norm");
  CHECK(kinds.at("blocks.1.attn.log_scale") == "scale");
  // Every name is classified (the map has every parameter), and all seven kinds occur.
  CHECK(kinds.size() == transformer_parameter_shapes(groups_config()).size());
  std::set<std::string> seen;
  for (const auto& [name, kind] : kinds) seen.insert(kind);
  CHECK(seen.size() == 7);
  // A tied model has no head.w: its one table (the head's weight too) is an embedding.
  TransformerConfig tied = groups_config();
  tied.vocab_sizes = {4};
  tied.tie_embeddings = true;
  for (const ParameterShape& p : transformer_parameter_shapes(tied)) CHECK(p.name != "head.w");
  CHECK(transformer_parameter_kind("embed.fields.0.table") == ParameterKind::embedding);
  // Names and parsing.
  for (const ParameterKind k :
       {ParameterKind::embedding, ParameterKind::attention, ParameterKind::mlp, ParameterKind::head,
        ParameterKind::norm, ParameterKind::bias, ParameterKind::scale})
    CHECK(parse_parameter_kind(to_string(k)) == k);
  CHECK_THROWS_WITH_AS(
      parse_parameter_kind("weights"),
      "parse_parameter_kind: kind expected embedding|attention|mlp|head|norm|bias|scale, got "
      "'weights'",
      std::invalid_argument);
  CHECK_THROWS_WITH_AS(transformer_parameter_kind("conv.weight"),
                       doctest::Contains("parameter 'conv.weight' expected the name of a "
                                         "Transformer's parameter"),
                       std::invalid_argument);
}

TEST_CASE("param groups: selectors by pattern, rank and kind, every condition must hold") {
  CHECK(matches({.pattern = "blocks.*"}, "blocks.0.attn.w_q", 2));
  CHECK_FALSE(matches({.pattern = "blocks.*"}, "head.w", 2));
  CHECK(matches({.rank = 2}, "anything", 2));
  CHECK_FALSE(matches({.rank = 2}, "anything", 1));
  CHECK(matches({.rank = 1}, "anything", 1));
  CHECK(matches({.kind = "norm"}, "blocks.0.attn.k_norm.beta", 1));
  CHECK_FALSE(matches({.kind = "norm"}, "blocks.0.attn.log_scale", 1));
  CHECK(matches({.pattern = "blocks.1.*", .rank = 2, .kind = "attention"}, "blocks.1.attn.w_v", 2));
  CHECK_FALSE(
      matches({.pattern = "blocks.1.*", .rank = 2, .kind = "attention"}, "blocks.0.attn.w_v", 2));
  CHECK_FALSE(
      matches({.pattern = "blocks.1.*", .rank = 2, .kind = "attention"}, "blocks.1.mlp.fc1.w", 2));
  CHECK_FALSE(
      matches({.pattern = "blocks.1.*", .rank = 1, .kind = "attention"}, "blocks.1.attn.w_v", 2));
  CHECK_THROWS_WITH_AS(matches({}, "head.w", 2),
                       "ParamSelector: selector expected at least one of pattern, rank, kind, got "
                       "none (a selector with nothing set)",
                       std::invalid_argument);
  CHECK_THROWS_WITH_AS(matches({.rank = -1}, "head.w", 2),
                       "ParamSelector: rank expected >= 0 (0: any rank), got -1",
                       std::invalid_argument);
  CHECK_THROWS_WITH_AS(matches({.kind = "weights"}, "head.w", 2),
                       doctest::Contains("ParamSelector: kind expected embedding|attention|"),
                       std::invalid_argument);
  CHECK(to_string(ParamSelector{.pattern = "a.*", .rank = 2, .kind = "mlp"}) ==
        "{pattern \"a.*\", rank 2, kind mlp}");
  CHECK(to_string(ParamSelector{.rank = 1}) == "{rank 1}");
}

TEST_CASE("param groups: the first matching group wins and the rest form 'default'") {
  const std::vector<std::string> names = {"embed.fields.0.table", "blocks.0.attn.w_q",
                                          "blocks.0.attn.w_k", "blocks.0.ln1.gamma", "head.w"};
  const std::vector<std::size_t> ranks = {2, 2, 2, 1, 2};
  const std::vector<ParamGroupSpec> specs = {spec("q", {.pattern = "*.w_q"}),
                                             spec("matrices", {.rank = 2})};
  // w_q matches both: the first group takes it; the 1-D gain is left to "default" (index 2).
  CHECK(assign_param_groups(specs, names, ranks) == std::vector<std::size_t>{1, 0, 1, 2, 1});
  // Order decides: with the groups swapped, "matrices" takes w_q and "q" matches only a taken one.
  const std::vector<ParamGroupSpec> swapped = {specs[1], specs[0]};
  CHECK_THROWS_WITH_AS(
      assign_param_groups(swapped, names, ranks),
      "param_groups[1].match (group 'q') expected a selector that matches a parameter, got "
      "{pattern \"*.w_q\"}: it matched only parameters that earlier groups claimed (a parameter "
      "joins the first group that matches it), e.g. blocks.0.attn.w_q (in 'matrices')",
      std::invalid_argument);
  // No specs: everything in "default".
  CHECK(assign_param_groups({}, names, ranks) == std::vector<std::size_t>(5, 0));

  // Built over a model: the groups, in spec order then "default", each in the model's order.
  Rng rng(5);
  Transformer<double> model(groups_config(), rng);
  const ParameterList<double> params = model.parameters();
  const OptimizerGroups<double> groups = build_param_groups<double>(
      params,
      {spec("hidden", {.pattern = "blocks.*.attn.w_*", .rank = 2, .kind = "attention"}, "sgd", 10.0,
            0.0),
       spec("norms", {.kind = "norm"})},
      "adamw", 0.1, factory());
  const std::vector<ParamGroupInfo> info = groups.groups();
  REQUIRE(info.size() == 3);
  CHECK(info[0].name == "hidden");
  CHECK(info[0].optimizer == "SGD");
  CHECK(info[0].lr_mult == 10.0);
  CHECK(info[0].parameters == std::vector<std::string>{"blocks.0.attn.w_q", "blocks.0.attn.w_k",
                                                       "blocks.0.attn.w_v", "blocks.0.attn.w_o",
                                                       "blocks.1.attn.w_q", "blocks.1.attn.w_k",
                                                       "blocks.1.attn.w_v", "blocks.1.attn.w_o"});
  CHECK(info[0].values == 8 * 64);
  CHECK(info[1].name == "norms");
  CHECK(info[1].optimizer == "AdamW");
  CHECK(info[1].parameters.size() == 2 * 8 + 2);  // ln1, ln2, q_norm, k_norm (γ, β) per block, ln_f
  CHECK(info[2].name == "default");
  CHECK(info[2].lr_mult == 1.0);
  std::size_t total = 0;
  for (const auto& g : info) total += g.parameters.size();
  CHECK(total == params.size());
  CHECK(groups.parameters().size() == params.size());
  CHECK(groups.parameters()[0].name == "blocks.0.attn.w_q");
  // The lr of each group is the base lr times its multiplier.
  CHECK(groups.lr() == kLr);  // the factory's: the base lr
  CHECK(groups.group(0).optimizer->lr() == kLr * 10);
  CHECK(groups.group(1).optimizer->lr() == kLr);
  CHECK(groups.group(2).optimizer->lr() == kLr);
  // Every parameter claimed: no "default" group.
  const OptimizerGroups<double> all = build_param_groups<double>(
      params, {spec("matrices", {.rank = 2}), spec("rest", {.pattern = "*"})}, "adamw", 0,
      factory());
  CHECK(all.size() == 2);
  CHECK(all.groups()[1].name == "rest");
}

TEST_CASE("param groups: bad specs are refused naming the group, the key and the value") {
  const std::vector<std::string> names = {"blocks.0.attn.w_q", "head.w"};
  const std::vector<std::size_t> ranks = {2, 2};
  const auto refused = [&](const std::vector<ParamGroupSpec>& specs, const std::string& message) {
    CAPTURE(message);
    CHECK_THROWS_WITH_AS(assign_param_groups(specs, names, ranks), message.c_str(),
                         std::invalid_argument);
  };
  refused({spec("hidden", {.pattern = "blocks.*.mlp.*"})},
          "param_groups[0].match (group 'hidden') expected a selector that matches a parameter, "
          "got {pattern \"blocks.*.mlp.*\"}: it matched none of the 2 parameters");
  refused({spec("a", {.rank = 2}), spec("a", {.rank = 1})},
          "param_groups[1].name expected a name no other group has, got 'a', the name of "
          "param_groups[0]");
  refused({spec("", {.rank = 2})}, "param_groups[0].name expected a non-empty name, got \"\"");
  refused({spec("default", {.rank = 2})},
          "param_groups[0].name expected a name other than 'default' (the group of the "
          "parameters no selector claims), got 'default'");
  refused({spec("a", {})},
          "param_groups[0].match (group 'a') expected at least one of pattern, rank, kind, got "
          "none (a selector with nothing set)");
  refused({spec("a", {.rank = -2})},
          "param_groups[0].match.rank (group 'a') expected >= 0 (0: any rank), got -2");
  refused({spec("a", {.kind = "matrix"})},
          "param_groups[0].match.kind (group 'a') expected "
          "embedding|attention|mlp|head|norm|bias|scale or \"\" (any kind), got 'matrix'");
  refused({spec("a", {.rank = 2}, "", -1.0)},
          "param_groups[0].lr_mult (group 'a') expected a finite value >= 0, got -1");
  refused({spec("a", {.rank = 2}, "", std::numeric_limits<double>::quiet_NaN())},
          "param_groups[0].lr_mult (group 'a') expected a finite value >= 0, got nan");
  refused({spec("a", {.rank = 2}, "", std::numeric_limits<double>::infinity())},
          "param_groups[0].lr_mult (group 'a') expected a finite value >= 0, got inf");
  refused({spec("a", {.rank = 2}, "", 1.0, -0.5)},
          "param_groups[0].weight_decay (group 'a') expected a finite value >= 0, got -0.5");
  // A kind over names that are not a Transformer's names the group.
  CHECK_THROWS_WITH_AS(assign_param_groups({spec("a", {.kind = "norm"})}, {"conv.weight"}, {4}),
                       doctest::Contains("param_groups[0].match.kind (group 'a')"),
                       std::invalid_argument);
  // The factory's refusal of a kind reaches the caller.
  Rng rng(5);
  Transformer<double> model(groups_config(), rng);
  CHECK_THROWS_WITH_AS(
      build_param_groups<double>(model.parameters(), {spec("a", {.rank = 2}, "lion")}, "adamw", 0,
                                 factory()),
      "test factory: no optimizer 'lion'", std::invalid_argument);
}

TEST_CASE("param groups: OptimizerGroups refuses overlapping groups, naming the parameter") {
  Rng rng(5);
  Transformer<double> model(groups_config(), rng);
  const ParameterList<double> params = model.parameters();
  const auto adamw = [&](ParameterList<double> list, double lr = 1e-2) {
    return std::make_unique<AdamW<double>>(std::move(list), AdamWOptions{.lr = lr});
  };
  const auto group = [](std::string name, std::unique_ptr<Optimizer<double>> opt, double mult = 1) {
    return OptimizerGroup<double>{std::move(name), std::move(opt), mult};
  };
  const ParameterList<double> first(params.begin(), params.begin() + 3);
  const ParameterList<double> overlap(params.begin() + 2, params.end());
  {
    std::vector<OptimizerGroup<double>> g;
    g.push_back(group("a", adamw(first)));
    g.push_back(group("b", adamw(overlap)));
    CHECK_THROWS_WITH_AS(OptimizerGroups<double>(std::move(g)),
                         ("OptimizerGroups: parameter '" + params[2].name +
                          "' expected in one group only, got in 'a' and 'b'")
                             .c_str(),
                         std::invalid_argument);
  }
  const ParameterList<double> rest(params.begin() + 3, params.end());
  {
    std::vector<OptimizerGroup<double>> g;
    g.push_back(group("a", adamw(first)));
    g.push_back(group("a", adamw(rest)));
    CHECK_THROWS_WITH_AS(OptimizerGroups<double>(std::move(g)),
                         "OptimizerGroups: group names expected unique names, got 'a' twice",
                         std::invalid_argument);
  }
  {
    std::vector<OptimizerGroup<double>> g;
    g.push_back(group("a", adamw(first)));
    g.push_back(group("b", adamw(rest, 2e-2)));
    CHECK_THROWS_WITH_AS(OptimizerGroups<double>(std::move(g)),
                         "OptimizerGroups: lr of group 'b' expected 0.01, the first group's (the "
                         "base lr, which lr_mult scales), got 0.02",
                         std::invalid_argument);
  }
  {
    std::vector<OptimizerGroup<double>> g;
    g.push_back(group("a", adamw(first), -1));
    CHECK_THROWS_WITH_AS(OptimizerGroups<double>(std::move(g)),
                         "OptimizerGroups: lr_mult of group 'a' expected a finite value >= 0, got "
                         "-1",
                         std::invalid_argument);
  }
  CHECK_THROWS_WITH_AS(OptimizerGroups<double>(std::vector<OptimizerGroup<double>>{}),
                       "OptimizerGroups: groups expected at least one group, got none",
                       std::invalid_argument);
  // set_lr refuses a bad lr and changes nothing.
  std::vector<OptimizerGroup<double>> g;
  g.push_back(group("a", adamw(first), 4));
  g.push_back(group("b", adamw(rest)));
  OptimizerGroups<double> ok(std::move(g));
  CHECK(ok.group(0).optimizer->lr() == 4e-2);
  ok.set_lr(0.5);
  CHECK(ok.lr() == 0.5);
  CHECK(ok.group(0).optimizer->lr() == 2.0);
  CHECK(ok.group(1).optimizer->lr() == 0.5);
  CHECK_THROWS_AS(ok.set_lr(-1), std::invalid_argument);
  CHECK(ok.lr() == 0.5);
  CHECK(ok.group(0).optimizer->lr() == 2.0);
}

TEST_CASE("param groups: no specs is the single optimizer, bit for bit") {
  CHECK(train_groups({}, "adamw", 0.1, 4) == train_single("adamw", 0.1, 4));
  CHECK(train_groups({}, "sgd", 0.1, 4) == train_single("sgd", 0.1, 4));
  // Groups that split the parameters with the same settings change nothing either.
  CHECK(train_groups({spec("matrices", {.rank = 2}), spec("norms", {.kind = "norm"})}, "adamw", 0.1,
                     4) == train_single("adamw", 0.1, 4));
}

TEST_CASE("param groups: lr_mult 0 freezes its group, lr_mult 2 moves SGD exactly twice as far") {
  const auto init = initial_values();
  const auto frozen =
      train_groups({spec("frozen", {.kind = "attention"}, "", 0.0)}, "adamw", 0.1, 4);
  const auto moving = train_single("adamw", 0.1, 4);
  for (const auto& [name, value] : frozen) {
    CAPTURE(name);
    if (transformer_parameter_kind(name) == ParameterKind::attention) {
      CHECK(value == init.at(name));  // unchanged, exactly
    } else {
      CHECK(value != init.at(name));
      CHECK(value == moving.at(name));  // the other groups as if alone
    }
  }
  // SGD, momentum 0, from zero weights: the attention group at lr·2 moves exactly twice as far
  // as at lr (p = 0 − lr·g, and doubling is exact), and equals an SGD at twice the lr.
  const auto doubled =
      train_groups({spec("fast", {.kind = "attention"}, "sgd", 2.0)}, "sgd", 0, 1, 0.0, true);
  const auto once = train_single("sgd", 0, 1, 0, 0.0, true);
  const auto twice_lr = train_single("sgd", 0, 1, 2 * kLr, 0.0, true);
  std::size_t fast = 0;
  for (const auto& [name, value] : doubled) {
    CAPTURE(name);
    CHECK(value != xt::xarray<double>(xt::zeros_like(value)));  // every parameter moved
    if (transformer_parameter_kind(name) == ParameterKind::attention) {
      CHECK(value == twice_lr.at(name));
      CHECK(value == xt::xarray<double>(2.0 * once.at(name)));
      ++fast;
    } else {
      CHECK(value == once.at(name));
    }
  }
  CHECK(fast == 2 * 4);
}

TEST_CASE("param groups: each group decays with its own weight decay") {
  // Matrices at weight decay 0.5, the rest at the default's 0: each parameter equals the run of a
  // single optimizer at its group's decay, exactly, for AdamW and SGD.
  for (const char* kind : {"adamw", "sgd"}) {
    CAPTURE(kind);
    const auto grouped =
        train_groups({spec("decayed", {.rank = 2}, "", std::nullopt, 0.5)}, kind, 0, 4);
    const auto decayed = train_single(kind, 0.5, 4);
    const auto plain = train_single(kind, 0, 4);
    std::size_t n_decayed = 0, n_plain = 0;
    for (const auto& [name, value] : grouped) {
      CAPTURE(name);
      CHECK(decayed.at(name) != plain.at(name));  // both comparisons below could fail
      if (value.dimension() == 2) {
        CHECK(value == decayed.at(name));
        ++n_decayed;
      } else {
        CHECK(value == plain.at(name));
        ++n_plain;
      }
    }
    CHECK(n_decayed == 2 + 2 * 6 + 1);
    CHECK(n_plain == 2 * 11 + 2);
  }
}

TEST_CASE("param groups: saved and restored state continues bit-identically") {
  const std::vector<ParamGroupSpec> specs = {
      spec("hidden", {.pattern = "blocks.*.attn.w_*"}, "sgd", 3.0, 0.0),
      spec("norms", {.kind = "norm"}, "adamw", 0.5)};
  const auto make = [&](const ParameterList<double>& params) {
    return build_param_groups<double>(params, specs, "adamw", 0.1, factory());
  };
  // Uninterrupted: 6 steps.
  Rng rng_a(5);
  Transformer<double> a(groups_config(), rng_a);
  const ParameterList<double> pa = a.parameters();
  OptimizerGroups<double> ga = make(pa);
  Rng grads_a(6);
  std::vector<NamedTensor<double>> saved;
  std::map<std::string, xt::xarray<double>> weights_at_3;
  for (int step = 0; step < 6; ++step) {
    if (step == 3) {
      saved = ga.state_tensors();
      weights_at_3 = values(pa);
    }
    ga.set_lr(1.0 - 0.1 * step);  // a schedule: every group follows it
    fill_grads(pa, grads_a);
    ga.step();
  }
  CHECK(ga.step_count() == 6);
  // State names are the single optimizers' (optim.<param>.<slot>), in group order.
  REQUIRE(!saved.empty());
  CHECK(saved.front().first == "optim.blocks.0.attn.w_q.momentum_buffer");
  // Interrupted after 3: a fresh model with those weights, a fresh groups object, the state.
  Rng rng_b(5);
  Transformer<double> b(groups_config(), rng_b);
  const ParameterList<double> pb = b.parameters();
  for (const auto& p : pb) p.param->value = weights_at_3.at(p.name);
  OptimizerGroups<double> gb = make(pb);
  gb.load_state(saved, 3);
  CHECK(gb.step_count() == 3);
  Rng grads_b(6);
  for (int step = 0; step < 3; ++step) fill_grads(pb, grads_b);  // the data stream's position
  for (int step = 3; step < 6; ++step) {
    gb.set_lr(1.0 - 0.1 * step);
    fill_grads(pb, grads_b);
    gb.step();
  }
  CHECK(values(pb) == values(pa));
  const auto sa = ga.state_tensors(), sb = gb.state_tensors();
  REQUIRE(sa.size() == sb.size());
  for (std::size_t i = 0; i < sa.size(); ++i) {
    CHECK(sa[i].first == sb[i].first);
    CHECK(sa[i].second == sb[i].second);
  }
}

TEST_CASE("param groups: load_state names a foreign or missing tensor and assigns nothing") {
  const std::vector<ParamGroupSpec> specs = {spec("hidden", {.rank = 2}, "sgd")};
  Rng rng(5);
  Transformer<double> model(groups_config(), rng);
  const ParameterList<double> params = model.parameters();
  OptimizerGroups<double> groups = build_param_groups<double>(params, specs, "adamw", 0, factory());
  Rng grads(6);
  fill_grads(params, grads);
  groups.step();
  const auto before = groups.state_tensors();
  // A single AdamW's state (every parameter has exp_avg): unknown names for the SGD group.
  std::vector<NamedTensor<double>> single;
  for (const auto& p : params) {
    single.emplace_back(optim_state_name(p.name, "exp_avg"), p.param->value * 0 + 7);
    single.emplace_back(optim_state_name(p.name, "exp_avg_sq"), p.param->value * 0 + 7);
  }
  CHECK_THROWS_WITH_AS(groups.load_state(single, 9),
                       "OptimizerGroups.load_state: state tensor "
                       "'optim.embed.fields.0.table.exp_avg' expected the name of a state tensor "
                       "of one of the groups (optim.<param>.<slot>), got an unknown name",
                       std::invalid_argument);
  // One tensor missing: named by the group's optimizer, before any group is loaded.
  std::vector<NamedTensor<double>> missing = before;
  for (auto& t : missing) t.second.fill(7);
  missing.pop_back();
  CHECK_THROWS_WITH_AS(
      groups.load_state(missing, 9),
      ("AdamW.load_state: state tensor '" + before.back().first + "' expected present, got missing")
          .c_str(),
      std::invalid_argument);
  std::vector<NamedTensor<double>> twice = before;
  twice.push_back(before.front());
  CHECK_THROWS_WITH_AS(groups.load_state(twice, 9),
                       ("OptimizerGroups.load_state: state tensor '" + before.front().first +
                        "' expected once, got twice")
                           .c_str(),
                       std::invalid_argument);
  const auto after = groups.state_tensors();
  REQUIRE(after.size() == before.size());
  for (std::size_t i = 0; i < after.size(); ++i) CHECK(after[i].second == before[i].second);
  CHECK(groups.step_count() == 1);
}

TEST_CASE("param groups: on the emulated device, in the model's arena, as on the CPU") {
  // The groups' parameters are scattered over the arena: each group's optimizer updates them one
  // call each; the state follows the model there and back.
  const auto device = emulated::make_device_ops<double>();  // outlives the models on it
  const std::vector<ParamGroupSpec> specs = {
      spec("hidden", {.pattern = "blocks.*.attn.w_*"}, "sgd", 3.0, 0.0),
      spec("norms", {.kind = "norm"}, "adamw", 0.5)};
  std::map<std::string, xt::xarray<double>> result[2];
  std::vector<NamedTensor<double>> state[2];
  for (const bool on_device : {false, true}) {
    Fresh fresh;
    if (on_device) fresh.model.to(*device);
    OptimizerGroups<double> groups =
        build_param_groups<double>(fresh.params, specs, "adamw", 0.1, factory());
    Rng grads(6);
    for (int step = 0; step < 4; ++step) {
      fill_grads(fresh.params, grads);
      if (on_device)
        for (const auto& p : fresh.params)
          device->upload(p.param->device_grad.data(), p.param->grad.data(),
                         p.param->size() * sizeof(double));
      groups.step();
    }
    fresh.model.copy_to_host();
    result[on_device] = values(fresh.params);
    state[on_device] = groups.state_tensors();
  }
  const auto init = initial_values();
  for (const auto& [name, value] : result[0]) {
    CAPTURE(name);
    CHECK(value != init.at(name));
    CHECK(test::rel_error(result[1].at(name), value) < 1e-14);
  }
  REQUIRE(state[0].size() == state[1].size());
  for (std::size_t i = 0; i < state[0].size(); ++i) {
    CAPTURE(state[0][i].first);
    CHECK(state[0][i].first == state[1][i].first);
    CHECK(test::rel_error(state[1][i].second, state[0][i].second) < 1e-14);
  }
}
