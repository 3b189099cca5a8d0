// The study presets: the honest defaults the issue asks for, and a sweep small enough for quick.
#include <doctest/doctest.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <set>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "attnlab/app/study.hpp"
#include "temp_dir.hpp"

using namespace attnlab;
using namespace attnlab::app;

TEST_CASE(
    "study presets: 1 layer, 1 head, attention-only recall with decoupled d_k and AdamW(0.9, "
    "0.95)") {
  const StudyPlan quick = study_preset("quick");
  REQUIRE(quick.groups.size() == 1);
  const StudyGroup& g = quick.groups[0];
  CHECK(g.base.task.kind == TaskKind::recall);
  CHECK(g.base.model.layers == 1);
  CHECK(g.base.model.block.attention.heads == 1);
  CHECK(g.base.model.block.attn_only);
  CHECK(g.base.model.block.attention.d_model == 64);
  CHECK(g.base.model.block.attention.d_v == 64);  // only the q/k width varies with d_k
  CHECK(g.d_k == std::vector<int>{16, 64, 256});
  // Half-decades from 1e-4 to 0.316: wide enough that every mode's window shows both edges.
  CHECK(g.lrs == std::vector<double>{1e-4, 3.16e-4, 1e-3, 3.16e-3, 1e-2, 3.16e-2, 1e-1, 3.16e-1});
  CHECK(g.seeds.size() >= 5);
  CHECK(to_string(g.base.optimizer) == "adamw");
  CHECK(g.base.beta1 == 0.9);
  CHECK(g.base.beta2 == 0.95);
  CHECK(g.base.weight_decay == 0);
  CHECK(g.base.clip == 0);
  CHECK(enum_name(g.base.schedule) == "cosine");
  CHECK(g.base.warmup > 0);
  std::set<std::string> arms;
  for (const auto& a : g.arms) arms.insert(a.name);
  CHECK(arms == std::set<std::string>{"none", "sqrt_dk", "dk"});

  const StudyPlan full = study_preset("full");
  std::set<std::string> groups, full_arms;
  for (const auto& fg : full.groups) {
    groups.insert(fg.name);
    CHECK(fg.seeds.size() >= 2);
    for (const auto& a : fg.arms) full_arms.insert(a.name);
  }
  CHECK(groups == std::set<std::string>{"recall/adamw", "recall/adamw-stabilisers",
                                        "recall/adamw-magnitude", "recall/adamw-modern",
                                        "recall/sgd", "mqar/adamw", "text/adamw"});
  // The modern block's attention: RoPE, each scaling mode with qk-layernorm and with a softcap.
  const auto mod = std::find_if(full.groups.begin(), full.groups.end(), [](const StudyGroup& fg) {
    return fg.name == "recall/adamw-modern";
  });
  REQUIRE(mod != full.groups.end());
  CHECK(mod->base.model.positions == PositionEncoding::rope);
  CHECK(mod->d_k == g.d_k);
  CHECK(mod->lrs == g.lrs);
  std::vector<std::tuple<std::string, Scaling, bool, double>> modern;
  for (const auto& a : mod->arms) modern.emplace_back(a.name, a.scaling, a.qk_norm, a.softcap);
  CHECK(modern == std::vector<std::tuple<std::string, Scaling, bool, double>>{
                      {"sqrt_dk", Scaling::sqrt_dk, false, 0},
                      {"dk", Scaling::dk, false, 0},
                      {"none_qknorm", Scaling::none, true, 0},
                      {"sqrt_dk_qknorm", Scaling::sqrt_dk, true, 0},
                      {"dk_qknorm", Scaling::dk, true, 0},
                      {"none_softcap", Scaling::none, false, 50},
                      {"sqrt_dk_softcap", Scaling::sqrt_dk, false, 50},
                      {"dk_softcap", Scaling::dk, false, 50}});
  // The magnitude control: 1/(4√d_k), 1/√d_k, 1/d_k, 4/d_k and 8/d_k on the same grid.
  const auto mag = std::find_if(full.groups.begin(), full.groups.end(), [](const StudyGroup& fg) {
    return fg.name == "recall/adamw-magnitude";
  });
  REQUIRE(mag != full.groups.end());
  std::vector<std::pair<std::string, double>> arms_and_multipliers;
  for (const auto& a : mag->arms) arms_and_multipliers.emplace_back(a.name, a.scale_multiplier);
  CHECK(arms_and_multipliers ==
        std::vector<std::pair<std::string, double>>{
            {"sqrt_dk_x0.25", 0.25}, {"sqrt_dk", 1}, {"dk", 1}, {"dk_x4", 4}, {"dk_x8", 8}});
  CHECK(mag->d_k == g.d_k);
  CHECK(mag->lrs == g.lrs);
  // The budget axis: the scaling modes' grid at 400 and 1600 steps.
  CHECK(full.groups[0].budgets == std::vector<int>{400, 1600});
  CHECK(full.groups[0].seeds.size() >= 5);
  CHECK(full_arms.count("qk_norm") == 1);
  CHECK(full_arms.count("learnable") == 1);
  CHECK_THROWS_AS(study_preset("huge"), std::invalid_argument);

  // The proxies: one group per width at head dimension 32, Wortsman et al.'s settings and grid,
  // then the ablations at widths 64 and 128 on the same settings, in groups of their own.
  const StudyPlan proxies = study_preset("proxies");
  REQUIRE(proxies.groups.size() == 5);
  const std::vector<std::pair<std::string, std::size_t>> widths = {{"proxies/w64", 64},
                                                                   {"proxies/w128", 128},
                                                                   {"proxies/w256", 256},
                                                                   {"proxies/w64-ablations", 64},
                                                                   {"proxies/w128-ablations", 128}};
  for (std::size_t i = 0; i < widths.size(); ++i) {
    const StudyGroup& p = proxies.groups[i];
    const TrainConfig& b = p.base;
    CAPTURE(p.name);
    CHECK(p.name == widths[i].first);
    CHECK(b.model.block.attention.d_model == widths[i].second);
    CHECK(b.model.block.attention.heads == widths[i].second / 32);
    CHECK(p.d_k == std::vector<int>{32});
    CHECK(b.task.kind == TaskKind::text);
    CHECK(b.task.block == 64);
    CHECK(b.batch == 16);
    CHECK(b.model.layers == 2);
    CHECK(b.model.positions == PositionEncoding::rope);
    CHECK_FALSE(b.model.block.bias);
    CHECK_FALSE(b.model.block.attn_only);
    CHECK(b.model.block.attention.sdpa.causal);
    CHECK(b.beta1 == 0.9);
    CHECK(b.beta2 == 0.95);
    CHECK(b.clip == 1);
    CHECK(b.weight_decay == 1e-4);
    CHECK(to_string(b.decay) == "independent");
    CHECK(b.z_loss == 1e-4);
    CHECK(b.min_lr == 1e-5);
    CHECK(b.warmup == b.steps / 20);
    CHECK(b.steps == kProxiesSteps);
    CHECK(p.lrs == std::vector<double>{3e-4, 1e-3, 3e-3, 1e-2, 3e-2, 1e-1, 3e-1});
    CHECK(p.seeds == std::vector<std::uint64_t>{0, 1, 2, 3, 4});
    std::vector<std::string> names;
    for (const auto& a : p.arms) names.push_back(a.name);
    if (i < 3) {
      CHECK(names == std::vector<std::string>{"sqrt_dk", "qk_norm", "dk", "softcap"});
      continue;
    }
    CHECK(names == std::vector<std::string>{"qk_norm_gain_frozen", "qk_norm_no_shift",
                                            "qk_norm_gain_lr0.1", "sqrt_dk_warmup60",
                                            "sqrt_dk_warmup150", "qk_norm_warmup60",
                                            "qk_norm_warmup150"});
    // What each ablation changes, and nothing else.
    for (const auto& a : p.arms) {
      CAPTURE(a.name);
      CHECK(a.scaling == Scaling::sqrt_dk);
      CHECK(a.softcap == 0);
      CHECK(a.qk_norm == (a.name.rfind("qk_norm", 0) == 0));
      const bool warm = a.name.find("warmup") != std::string::npos;
      CHECK(a.warmup == (warm ? std::stoi(a.name.substr(a.name.find("warmup") + 6)) : -1));
      CHECK(a.param_groups.size() == (warm ? 0u : 1u));
    }
    CHECK(p.arms[0].param_groups[0].match.pattern == "blocks.*.attn.*_norm.gamma");
    CHECK(p.arms[0].param_groups[0].lr_mult == 0.0);
    CHECK(p.arms[1].param_groups[0].match.pattern == "blocks.*.attn.*_norm.beta");
    CHECK(p.arms[1].param_groups[0].lr_mult == 0.0);
    CHECK(p.arms[2].param_groups[0].match.pattern == "blocks.*.attn.*_norm.gamma");
    CHECK(p.arms[2].param_groups[0].lr_mult == 0.1);
  }
}

TEST_CASE("study plans as data: every preset round trips, the committed micro grid is the preset") {
  for (const char* name : {"micro", "quick", "full", "proxies"}) {
    CAPTURE(name);
    const StudyPlan plan = study_preset(name);
    const test::TempDir dir;
    const std::string path = dir.file("plan.json");
    std::ofstream(path) << to_json_text(plan);
    StudyPlan back;
    read_study_file(path, back);
    CHECK(to_json_text(back) == to_json_text(plan));
  }
  StudyPlan committed;
  read_study_file(std::string(ATTNLAB_TEST_DATA_DIR) + "/../../data/configs/study_micro.json",
                  committed);
  CHECK(to_json_text(committed) == to_json_text(study_preset("micro")));
  // A bad grid is refused before any run starts, naming the group and the field.
  StudyPlan bad = study_preset("micro");
  bad.groups[0].base.model.block.attention.d_model = 15;  // two heads do not divide it
  bad.groups[0].base.model.block.attention.heads = 2;
  bad.groups[0].base.model.block.attention.d_v = 0;
  StudyOptions options;
  const test::TempDir out;
  options.out = out.file("study");
  options.progress = false;
  CHECK_THROWS_WITH_AS(run_study(bad, options, Context{}),
                       doctest::Contains("study: group 'recall/adamw'"), std::invalid_argument);
  CHECK_FALSE(std::filesystem::exists(options.out + "/runs"));
}

TEST_CASE(
    "study: an arm's scale multiplier sets the explicit scale, equal runs where the scales meet") {
  // 8/d_k = 1/√d_k at d_k 64 and 4/d_k = 1/√d_k at d_k 16 (exact in binary): the same runs, bit for
  // bit; at d_k 16, 8/d_k is twice 1/√d_k, and the run differs.
  StudyPlan plan = study_preset("micro");
  StudyGroup& g = plan.groups[0];
  g.arms = {StudyArm{"sqrt_dk", Scaling::sqrt_dk, false, false, 1},
            StudyArm{"dk_x4", Scaling::dk, false, false, 4},
            StudyArm{"dk_x8", Scaling::dk, false, false, 8}};
  g.d_k = {16, 64};
  g.lrs = {3e-2};
  const test::TempDir out;
  StudyOptions options;
  options.out = out.file("study");
  options.progress = false;
  const StudyOutcome o = run_study(plan, options, Context{});
  const auto loss = [&](const std::string& mode, int d_k) {
    for (const auto& r : o.runs)
      if (r.mode == mode && r.d_k == d_k) return r.final_eval_loss;
    FAIL("no run " << mode << " " << d_k);
    return 0.0;
  };
  CHECK(loss("dk_x8", 64) == loss("sqrt_dk", 64));
  CHECK(loss("dk_x4", 16) == loss("sqrt_dk", 16));
  CHECK(loss("dk_x8", 16) != loss("sqrt_dk", 16));
  // A multiplier that is not a positive finite number is refused before any run.
  plan.groups[0].arms[2].scale_multiplier = -1;
  options.out = out.file("bad");
  CHECK_THROWS_AS(run_study(plan, options, Context{}), std::invalid_argument);
  CHECK_FALSE(std::filesystem::exists(options.out + "/runs"));
}

TEST_CASE(
    "study: an arm's softcap caps the run's attention scores, and a negative one is refused") {
  StudyPlan plan = study_preset("micro");
  StudyGroup& g = plan.groups[0];
  // A cap of 0.5 binds on the scores of a trained head: the run differs from the uncapped one.
  g.arms = {StudyArm{"sqrt_dk", Scaling::sqrt_dk, false, false, 1},
            StudyArm{"softcap", Scaling::sqrt_dk, false, false, 1, 0.5}};
  g.d_k = {16};
  g.lrs = {3e-2};
  const test::TempDir out;
  StudyOptions options;
  options.out = out.file("study");
  options.progress = false;
  const StudyOutcome o = run_study(plan, options, Context{});
  REQUIRE(o.runs.size() == 2);
  const RunRecord& plain = o.runs[0].mode == "sqrt_dk" ? o.runs[0] : o.runs[1];
  const RunRecord& capped = o.runs[0].mode == "softcap" ? o.runs[0] : o.runs[1];
  CHECK(plain.final_eval_loss != capped.final_eval_loss);
  std::ifstream config(options.out + "/" + capped.dir + "/config.json");
  const auto json = nlohmann::json::parse(config);
  CHECK(json["model"]["block"]["attention"]["sdpa"]["softcap"] == 0.5);
  plan.groups[0].arms[1].softcap = -1;
  options.out = out.file("bad");
  CHECK_THROWS_AS(run_study(plan, options, Context{}), std::invalid_argument);
  CHECK_FALSE(std::filesystem::exists(options.out + "/runs"));
}

TEST_CASE("study --resume: a finished run is reused, a changed or unfinished one trains again") {
  StudyPlan plan = study_preset("micro");
  StudyGroup& g = plan.groups[0];
  g.arms.resize(1);  // "none"
  g.d_k = {4};
  g.lrs = {1e-2, 1e-1};
  const test::TempDir out;
  StudyOptions options;
  options.out = out.file("study");
  options.progress = false;
  const StudyOutcome first = run_study(plan, options, Context{});
  REQUIRE(first.runs.size() == 2);
  CHECK(first.reused == 0);
  const auto loss_at = [](const StudyOutcome& o, double lr) {
    for (const auto& r : o.runs)
      if (r.lr == lr) return r.final_eval_loss;
    FAIL("no run at lr " << lr);
    return 0.0;
  };
  // Every run finished: all reused, with the same numbers and the grid's own fields.
  options.resume = true;
  const StudyOutcome again = run_study(plan, options, Context{});
  CHECK(again.reused == 2);
  for (std::size_t i = 0; i < 2; ++i) {
    CHECK(again.runs[i].final_eval_loss == first.runs[i].final_eval_loss);
    CHECK(again.runs[i].layer0_final.max_logit == first.runs[i].layer0_final.max_logit);
    CHECK(again.runs[i].lr == first.runs[i].lr);
    CHECK(again.runs[i].dir == first.runs[i].dir);
  }
  // A study folder moved elsewhere resumes there: the output path is not part of the test.
  {
    StudyOptions moved = options;
    moved.out = out.file("moved");
    std::filesystem::copy(options.out, moved.out, std::filesystem::copy_options::recursive);
    CHECK(run_study(plan, moved, Context{}).reused == 2);
  }
  // A run without its record (it was killed) and a run the grid gained train; the rest is reused.
  std::filesystem::remove(options.out + "/" + first.runs[0].dir + "/record.csv");
  g.lrs.push_back(3e-2);
  const StudyOutcome grown = run_study(plan, options, Context{});
  CHECK(grown.runs.size() == 3);
  CHECK(grown.reused == 1);
  CHECK(loss_at(grown, 1e-2) == loss_at(first, 1e-2));  // trained again, deterministically
  CHECK(std::filesystem::exists(options.out + "/" + first.runs[0].dir + "/record.csv"));
  // Another config (the eval set's size) trains every run again; so does a study without resume.
  g.base.eval_size = 16;
  CHECK(run_study(plan, options, Context{}).reused == 0);
  options.resume = false;
  CHECK(run_study(plan, options, Context{}).reused == 0);
  std::ifstream json(options.out + "/study.json");
  CHECK(nlohmann::json::parse(json)["reused_runs"] == 0);
}

TEST_CASE("study: an arm's warmup and param groups reach its runs, frozen qk-norm gains stay 1") {
  StudyPlan plan = study_preset("micro");
  StudyGroup& g = plan.groups[0];
  ParamGroupSpec frozen_gain;
  frozen_gain.name = "qk_gain";
  frozen_gain.match.pattern = "blocks.*.attn.*_norm.gamma";
  frozen_gain.lr_mult = 0;
  ParamGroupSpec frozen_shift = frozen_gain;
  frozen_shift.name = "qk_shift";
  frozen_shift.match.pattern = "blocks.*.attn.*_norm.beta";
  StudyArm qk{"qk_norm", Scaling::sqrt_dk, true, false};
  StudyArm gain = qk, shift = qk, warm = qk;
  gain.name = "qk_norm_gain_frozen";
  gain.param_groups = {frozen_gain};
  shift.name = "qk_norm_no_shift";
  shift.param_groups = {frozen_shift};
  warm.name = "qk_norm_warmup5";
  warm.warmup = 5;
  g.arms = {qk, gain, shift, warm};
  g.d_k = {16};
  g.lrs = {1e-1};
  const test::TempDir out;
  StudyOptions options;
  options.out = out.file("study");
  options.progress = false;
  const StudyOutcome o = run_study(plan, options, Context{});
  REQUIRE(o.runs.size() == 4);
  const auto run = [&](const std::string& mode) -> const RunRecord& {
    for (const auto& r : o.runs)
      if (r.mode == mode) return r;
    FAIL("no run " << mode);
    return o.runs.front();
  };
  const auto config = [&](const std::string& mode) {
    std::ifstream in(options.out + "/" + run(mode).dir + "/config.json");
    return nlohmann::json::parse(in);
  };
  // The plain arm's gains and shifts move; lr_mult 0 keeps them at their initial 1 and 0 exactly.
  CHECK(run("qk_norm").layer0_final.qn_gamma_max != 1);
  CHECK(run("qk_norm").layer0_final.qn_beta_norm > 0);
  CHECK(run("qk_norm_gain_frozen").layer0_final.qn_gamma_max == 1);
  CHECK(run("qk_norm_gain_frozen").layer0_final.kn_gamma_max == 1);
  CHECK(run("qk_norm_gain_frozen").layer0_final.qn_beta_norm > 0);
  CHECK(run("qk_norm_no_shift").layer0_final.qn_beta_norm == 0);
  CHECK(run("qk_norm_no_shift").layer0_final.kn_beta_norm == 0);
  CHECK(run("qk_norm_no_shift").layer0_final.qn_gamma_max != 1);
  CHECK(config("qk_norm_gain_frozen")["param_groups"].size() == 1);
  CHECK(config("qk_norm_gain_frozen")["param_groups"][0]["lr_mult"] == 0);
  CHECK(config("qk_norm_warmup5")["warmup"] == 5);
  CHECK(config("qk_norm")["warmup"] == g.base.warmup);
  CHECK(run("qk_norm_warmup5").final_eval_loss != run("qk_norm").final_eval_loss);
  // The fields round trip through a plan file, and a warmup past the run is refused before any run.
  const StudyPlan back = [&] {
    StudyPlan p;
    read_study_text(to_json_text(plan), p);
    return p;
  }();
  CHECK(back.groups[0].arms[3].warmup == 5);
  CHECK(back.groups[0].arms[1].param_groups == std::vector<ParamGroupSpec>{frozen_gain});
  plan.groups[0].arms[3].warmup = g.base.steps + 1;
  options.out = out.file("bad");
  CHECK_THROWS_AS(run_study(plan, options, Context{}), std::invalid_argument);
  CHECK_FALSE(std::filesystem::exists(options.out + "/runs"));
}
