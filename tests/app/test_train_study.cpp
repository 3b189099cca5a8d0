// The study presets: the honest defaults the issue asks for, and a sweep small enough for quick.
#include <doctest/doctest.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <set>

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
  CHECK(g.base.optimizer == "adamw");
  CHECK(g.base.beta1 == 0.9);
  CHECK(g.base.beta2 == 0.95);
  CHECK(g.base.weight_decay == 0);
  CHECK(g.base.clip == 0);
  CHECK(g.base.schedule == "cosine");
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
                                        "recall/adamw-magnitude", "recall/sgd", "mqar/adamw",
                                        "text/adamw"});
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
}

TEST_CASE("study plans as data: every preset round trips, the committed micro grid is the preset") {
  for (const char* name : {"micro", "quick", "full"}) {
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
