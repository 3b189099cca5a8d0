// Parameter groups in a run config (TrainConfig::param_groups): the JSON and its errors by path,
// the checks that name param_groups[i].<key>, the groups a run forms and their printout, the
// memory estimate, and train_model: no key is today's single group, groups that change nothing
// give the same bits, lr_mult 0 freezes a group, and a resume must keep the groups.
#include <doctest/doctest.h>

#include <cstring>
#include <map>
#include <string>
#include <vector>

#include "attnlab/app/context.hpp"
#include "attnlab/app/model.hpp"
#include "attnlab/app/param_groups.hpp"
#include "attnlab/app/run_config.hpp"
#include "attnlab/app/trainer.hpp"
#include "attnlab/io/config_json.hpp"
#include "attnlab/io/safetensors.hpp"
#include "temp_dir.hpp"

using namespace attnlab;
using namespace attnlab::app;

namespace {

const Context kCpu{.threads = 1, .backend = Backend::cpu};

// recall, one attention-only layer, C 16 (as the CLI's tiny recall run): 12 tensors, 1552 values;
// w_q, w_k, w_v and w_o hold 1024 of them.
TrainConfig tiny(const std::string& out = "") {
  TrainConfig c;
  c.task.kind = TaskKind::recall;
  c.task.keys = 8;
  c.task.values = 8;
  c.task.pairs = 4;
  c.model.block.attention.d_model = 16;
  c.model.block.attention.heads = 1;
  c.lr = 1e-2;
  c.weight_decay = 0.5;
  c.steps = 12;
  c.batch = 8;
  c.eval_every = 4;
  c.eval_size = 32;
  c.progress = false;
  c.out = out;
  return c;
}

TrainConfig with_groups(TrainConfig c, const std::string& groups_json) {
  read_json_text(R"({"param_groups": )" + groups_json + "}", c);
  return c;
}

std::string problem(const TrainConfig& c) {
  try {
    validate(c);
  } catch (const std::invalid_argument& e) {
    return e.what();
  }
  return "";
}

std::string read_problem(const std::string& groups_json) {
  TrainConfig c = tiny();
  try {
    read_json_text(R"({"param_groups": )" + groups_json + "}", c);
  } catch (const std::invalid_argument& e) {
    return e.what();
  }
  return "";
}

// Every tensor of a run's checkpoint (weights and optimizer state), by name.
std::vector<StoredTensor> tensors(const std::string& run) {
  return load_safetensors(run + "/model.safetensors").tensors;
}

// The same names with the same shapes and bytes, in any order (the optimizer state is saved in
// group order).
bool same_tensors(const std::vector<StoredTensor>& a, const std::vector<StoredTensor>& b) {
  const auto by_name = [](const std::vector<StoredTensor>& list) {
    std::map<std::string, const StoredTensor*> out;
    for (const StoredTensor& t : list) out[t.name] = &t;
    return out;
  };
  const auto ma = by_name(a), mb = by_name(b);
  if (a.size() != b.size() || ma.size() != a.size() || mb.size() != b.size()) return false;
  for (const auto& [name, t] : ma) {
    const auto it = mb.find(name);
    if (it == mb.end() || it->second->shape != t->shape || it->second->data != t->data) {
      MESSAGE("tensor " << name << " differs");
      return false;
    }
  }
  return true;
}

const StoredTensor& tensor(const std::vector<StoredTensor>& all, const std::string& name) {
  for (const StoredTensor& t : all)
    if (t.name == name) return t;
  FAIL("no tensor " << name);
  return all.front();
}

}  // namespace

TEST_CASE("param_groups config: JSON round trip, and bad keys named by their path") {
  const TrainConfig c = with_groups(tiny(), R"([
    {"name": "hidden", "match": {"pattern": "blocks.*.attn.w_*", "rank": 2, "kind": "attention"},
     "optimizer": "sgd", "lr_mult": 10, "weight_decay": 0},
    {"name": "norms", "match": {"kind": "norm"}}])");
  REQUIRE(c.param_groups.size() == 2);
  const ParamGroupSpec& h = c.param_groups[0];
  CHECK(h.name == "hidden");
  CHECK(h.match == ParamSelector{"blocks.*.attn.w_*", 2, "attention"});
  CHECK(h.optimizer == "sgd");
  CHECK(h.lr_mult == 10.0);
  CHECK(h.weight_decay == 0.0);
  CHECK(c.param_groups[1].optimizer.empty());
  CHECK_FALSE(c.param_groups[1].lr_mult);
  CHECK_FALSE(c.param_groups[1].weight_decay);
  // The effective config writes every field (null: not set) and reads back to the same groups.
  const std::string text = to_json_text(c);
  CHECK(text.find("\"lr_mult\": null") != std::string::npos);
  TrainConfig back = tiny();
  read_json_text(text, back);
  CHECK(back.param_groups == c.param_groups);
  CHECK(tiny().param_groups.empty());  // the default: one group

  CHECK(read_problem(R"([{"name": "a", "lr": 2}])") ==
        "config key 'param_groups[0].lr': unknown key in ParamGroupSpec (expected one of: name, "
        "match, optimizer, lr_mult, weight_decay)");
  CHECK(read_problem(R"([{"name": "a", "match": {"knd": "norm"}}])") ==
        "config key 'param_groups[0].match.knd': unknown key in ParamSelector (expected one of: "
        "pattern, rank, kind)");
  CHECK(read_problem(R"([{"name": "a", "match": {"rank": 2}, "lr_mult": "fast"}])") ==
        "config key 'param_groups[0].lr_mult': expected a number, got \"fast\"");
  CHECK(read_problem(R"([{"name": "a", "match": {"rank": 2.5}}])")
            .starts_with("config key 'param_groups[0].match.rank': expected an integer"));
  CHECK(read_problem(R"({"name": "a"})") ==
        "config key 'param_groups': expected a JSON array, got {\"name\":\"a\"}");
  CHECK(read_problem(R"([{"name": "a", "match": "w_*"}])") ==
        "config key 'param_groups[0].match': expected a JSON object (ParamSelector), got string");
}

TEST_CASE("param_groups config: validate names the group index, the key and the value") {
  CHECK(
      problem(with_groups(tiny(), R"([{"name": "x", "match": {"pattern": "blocks.*.mlp.*"}}])")) ==
      "train: param_groups[0].match (group 'x') expected a selector that matches a parameter, "
      "got {pattern \"blocks.*.mlp.*\"}: it matched none of the 12 parameters");
  CHECK(problem(
            with_groups(tiny(), R"([{"name": "x", "match": {"rank": 2}, "optimizer": "lion"}])")) ==
        "train: param_groups[0].optimizer (group 'x') expected adamw|sgd|muon, or \"\" (the "
        "config's, "
        "adamw), got 'lion'");
  CHECK(problem(with_groups(tiny(),
                            R"([{"name": "x", "match": {"rank": 2}, "weight_decay": 5000}])")) ==
        "train: param_groups[0].weight_decay (group 'x') expected a number in [0, 1000], got "
        "5000");
  CHECK(problem(with_groups(tiny(), R"([{"name": "x", "match": {"rank": 2}, "lr_mult": -1}])")) ==
        "train: param_groups[0].lr_mult (group 'x') expected a finite value >= 0, got -1");
  CHECK(problem(with_groups(tiny(), R"([{"name": "x", "match": {"rank": 2}},
                                        {"name": "x", "match": {"rank": 1}}])")) ==
        "train: param_groups[1].name expected a name no other group has, got 'x', the name of "
        "param_groups[0]");
  CHECK(problem(with_groups(tiny(), R"([{"name": "default", "match": {"rank": 2}}])"))
            .starts_with("train: param_groups[0].name expected a name other than 'default'"));
  CHECK(problem(with_groups(tiny(), R"([{"name": "x"}])")) ==
        "train: param_groups[0].match (group 'x') expected at least one of pattern, rank, kind, "
        "got none (a selector with nothing set)");
  CHECK(problem(with_groups(tiny(), R"([{"name": "x", "match": {"kind": "weights"}}])"))
            .starts_with("train: param_groups[0].match.kind (group 'x') expected embedding|"));
  CHECK(problem(with_groups(tiny(), R"([{"name": "x", "match": {"rank": 2}}])")).empty());
}

TEST_CASE("param_groups config: the groups a run forms, printed and counted in the memory") {
  const TrainConfig c = with_groups(
      tiny(), R"([{"name": "hidden", "match": {"pattern": "blocks.*.attn.w_*"}, "lr_mult": 10,
                   "weight_decay": 0}])");
  const std::vector<ParamGroupPlan> plan = plan_param_groups(c);
  REQUIRE(plan.size() == 2);
  CHECK(plan[0].parameters == std::vector<std::string>{"blocks.0.attn.w_q", "blocks.0.attn.w_k",
                                                       "blocks.0.attn.w_v", "blocks.0.attn.w_o"});
  CHECK(plan[1].name == "default");
  CHECK(plan[1].parameters.size() == 8);
  CHECK(param_groups_text(plan) ==
        "param groups: hidden adamw lr×10 wd 0: 4 tensors (1,024 values); default adamw lr×1 wd "
        "0.5: 8 tensors (528 values)");
  // No groups: "default" with everything.
  const std::vector<ParamGroupPlan> one = plan_param_groups(tiny());
  REQUIRE(one.size() == 1);
  CHECK(one[0].values == 1552);
  // The memory estimate counts each group's state: AdamW 2 floats per value, SGD 1.
  CHECK(estimate_memory(tiny()).optimizer == 2.0 * 1552 * 4);
  const TrainConfig sgd = with_groups(
      tiny(),
      R"([{"name": "hidden", "match": {"pattern": "blocks.*.attn.w_*"}, "optimizer": "sgd"}])");
  CHECK(estimate_memory(sgd).optimizer == (1.0 * 1024 + 2.0 * 528) * 4);
  // The groups the trainer builds are the ones planned.
  Rng rng(c.seed);
  Model model(resolve_model(c.model, task_shape(c.task)), rng);
  const OptimizerGroups<float> groups = make_optimizer_groups(c, model.parameters());
  const std::vector<ParamGroupInfo> info = groups.groups();
  REQUIRE(info.size() == plan.size());
  for (std::size_t g = 0; g < plan.size(); ++g) {
    CHECK(info[g].name == plan[g].name);
    CHECK(info[g].parameters == plan[g].parameters);
    CHECK(info[g].values == plan[g].values);
    CHECK(info[g].lr_mult == plan[g].lr_mult);
  }
  CHECK(groups.group(0).optimizer->lr() == c.lr * 10);
}

TEST_CASE(
    "param_groups run: no key is one group, and groups that change nothing give the same bits") {
  test::TempDir dir;
  TrainConfig plain = tiny(dir.file("plain"));
  const TrainResult r_plain = train_model(plain, kCpu);
  REQUIRE_FALSE(r_plain.diverged);
  CHECK(r_plain.decayed_tensors == 12);  // every parameter, at the config's weight decay
  // One group of every parameter with the default's settings, and a split into two alike groups.
  for (const std::string groups :
       {R"([{"name": "all", "match": {"pattern": "*"}}])",
        R"([{"name": "matrices", "match": {"rank": 2}, "optimizer": "adamw", "lr_mult": 1,
             "weight_decay": 0.5}])"}) {
    CAPTURE(groups);
    test::TempDir other;
    const TrainConfig c = with_groups(tiny(other.file("run")), groups);
    const TrainResult r = train_model(c, kCpu);
    CHECK(r.final_eval_loss == r_plain.final_eval_loss);
    CHECK(same_tensors(tensors(c.out), tensors(plain.out)));
  }
}

TEST_CASE("param_groups run: lr_mult 0 freezes its group, and a resume must keep the groups") {
  test::TempDir dir;
  const std::string frozen_groups =
      R"([{"name": "frozen", "match": {"kind": "attention"}, "lr_mult": 0}])";
  const TrainConfig c = with_groups(tiny(dir.file("frozen")), frozen_groups);
  const TrainResult r = train_model(c, kCpu);
  CHECK(r.decayed_tensors == 12);  // both groups decay (weight decay 0.5), at lr 0 for "frozen"
  Rng rng(c.seed);
  Model init(resolve_model(c.model, task_shape(c.task)), rng);
  const std::vector<StoredTensor> saved = tensors(c.out);
  for (const auto& p : init.parameters()) {
    CAPTURE(p.name);
    const StoredTensor& t = tensor(saved, p.name);
    const bool same = std::memcmp(t.data.data(), p.param->value.data(), t.data.size()) == 0;
    CHECK(same == (transformer_parameter_kind(p.name) == ParameterKind::attention));
  }
  // A group at weight decay 0 leaves the decay count to the others.
  const TrainConfig no_decay =
      with_groups(tiny(dir.file("no_decay")),
                  R"([{"name": "hidden", "match": {"kind": "attention"}, "weight_decay": 0}])");
  CHECK(train_model(no_decay, kCpu).decayed_tensors == 8);

  // Stopped, then resumed with other groups: refused, naming param_groups.
  TrainConfig first = c;
  first.out = dir.file("split");
  first.stop_after = 6;
  CHECK(train_model(first, kCpu).interrupted);
  TrainConfig other = with_groups(tiny(dir.file("split")), R"([{"name": "frozen",
      "match": {"kind": "attention"}, "lr_mult": 2}])");
  other.resume = dir.file("split");
  CHECK_THROWS_WITH_AS(train_model(other, kCpu), doctest::Contains("train: resume: param_groups"),
                       std::invalid_argument);
  TrainConfig none = tiny(dir.file("split"));
  none.resume = dir.file("split");
  CHECK_THROWS_WITH_AS(train_model(none, kCpu), doctest::Contains("train: resume: param_groups"),
                       std::invalid_argument);
  // With the same groups it continues to the unbroken run's bits.
  TrainConfig same = c;
  same.out = dir.file("split");
  same.resume = dir.file("split");
  train_model(same, kCpu);
  CHECK(same_tensors(tensors(same.out), tensors(c.out)));
}
