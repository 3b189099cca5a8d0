// The study presets: the honest defaults the issue asks for, and a sweep small enough for quick.
#include <doctest/doctest.h>

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
  CHECK(groups == std::set<std::string>{"recall/adamw", "recall/adamw-stabilisers", "recall/sgd",
                                        "mqar/adamw", "text/adamw"});
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
