// The modern knobs through the CLI: tied embeddings, decay of the matrices only, parameter groups,
// the WSD schedule, independent decay, outlier skipping, z-loss and gradient accumulation, each
// kept by the config and resumed exactly.
#include <doctest/doctest.h>
#include <unistd.h>

#ifdef ATTNLAB_CLI_PATH

#include <sys/wait.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <limits>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "attnlab/app/config_bounds.hpp"
#include "attnlab/blas.hpp"
#include "attnlab/cuda.hpp"
#include "attnlab/distributed.hpp"
#include "attnlab/io/safetensors.hpp"
#include "attnlab/threads.hpp"
#include "cli_runner.hpp"

namespace fs = std::filesystem;
using namespace attnlab::test;

TEST_CASE("cli: --tie-embeddings trains a model whose head is the token table, and eval reads it") {
  const auto dir = scratch("tied_run");
  const auto out = dir / "run";
  const Run r = cli(std::string("train ") + kTinySort + " --steps 20 --d-ff 16 --tie-embeddings " +
                        "--out '" + out.string() + "'",
                    dir);
  REQUIRE(r.status == 0);
  CHECK(nlohmann::json::parse(slurp(out / "config.json"))["model"]["tie_embeddings"] == true);
  const auto file = attnlab::load_safetensors((out / "model.safetensors").string());
  CHECK(file.find("embed.fields.0.table") != nullptr);
  CHECK(file.find("head.w") == nullptr);
  CHECK(cli("eval --checkpoint '" + out.string() + "'", dir).status == 0);
  // Two input fields (recall: keys and values) have no one table to share.
  check_bad_input(std::string("train --tie-embeddings ") + kTinyRecall, dir,
                  "vocab_sizes expected one token field when tie_embeddings is set");
  // A checkpoint whose config says the other kind: refused, naming head.w.
  const fs::path untied_as_tied = run_with_edited_meta(
      dir, "untied", [](nlohmann::json& c) { c["model"]["tie_embeddings"] = true; });
  check_bad_input("eval --checkpoint '" + untied_as_tied.string() + "'", dir,
                  "the file holds 'head.w', which the config's model does not have");
  const std::string path = (out / "model.safetensors").string();
  attnlab::SafetensorsFile tied = attnlab::load_safetensors(path);
  auto config = nlohmann::json::parse(tied.metadata.at("model_config"));
  config["model"]["tie_embeddings"] = false;
  tied.metadata["model_config"] = config.dump();
  attnlab::save_safetensors(path, tied.tensors, tied.metadata);
  check_bad_input("eval --checkpoint '" + out.string() + "'", dir,
                  "the config's model has 'head.w' (8, 6), which the file does not hold");
}

TEST_CASE("cli: --decay-params matrices decays the 2-D parameters only, and resumes exactly") {
  const auto dir = scratch("decay_params");
  const std::string common = std::string("train ") + kTinyRecall +
                             " --steps 30 --eval-every 5 --lr 0.01 --seed 3 --weight-decay 0.5";
  const Run full =
      cli(common + " --decay-params matrices --out '" + (dir / "full").string() + "'", dir);
  REQUIRE(full.status == 0);
  // recall, one attention-only layer, C 16: the tables (8 + 8 + 5 rows), w_q, w_k, w_v, w_o and
  // the head are decayed; ln1's and ln_f's gamma and beta (4 × 16 values) are not.
  CHECK(full.out.find("weight decay 0.5 (decay_params matrices): 8 of 12 parameter tensors, 1488 "
                      "of 1552 values") != std::string::npos);
  CHECK(nlohmann::json::parse(slurp(dir / "full" / "config.json"))["decay_params"] == "matrices");
  const Run first = cli(
      common + " --decay-params matrices --stop-after 15 --out '" + (dir / "split").string() + "'",
      dir);
  CHECK(first.status == 130);
  const Run second =
      cli("train --quiet --resume '" + (dir / "split").string() + "' --threads 1", dir);
  REQUIRE(second.status == 0);
  CHECK(second.out.find("decay_params matrices") != std::string::npos);  // kept by the checkpoint
  const std::string metrics = slurp(dir / "full" / "metrics.csv");
  CHECK(metrics.size() > 100);
  CHECK(metrics == slurp(dir / "split" / "metrics.csv"));
  // The default decays every parameter: another run.
  const Run all = cli(common + " --out '" + (dir / "all").string() + "'", dir);
  REQUIRE(all.status == 0);
  CHECK(all.out.find("(decay_params all): 12 of 12 parameter tensors") != std::string::npos);
  CHECK(slurp(dir / "all" / "metrics.csv") != metrics);
  check_bad_input("train --decay-params biases", dir, "--decay-params");
  check_bad_input("train --resume '" + (dir / "full").string() + "' --decay-params all", dir,
                  "--decay-params cannot be given with --resume");
  std::ofstream(dir / "bad.json") << R"({"decay_params": "some"})";
  check_bad_input("train --config '" + (dir / "bad.json").string() + "'", dir, "decay_params");
}

TEST_CASE(
    "cli: --optimizer muon: Muon for the hidden matrices, AdamW for the rest, resumed exactly") {
  const auto dir = scratch("muon");
  const std::string common =
      "train --task recall --keys 8 --values 8 --pairs 4 --d-model 16 --heads 1 --attn-only "
      "--batch 16 --eval-size 64 --threads 1 --steps 30 --eval-every 5 --lr 0.01 --seed 3 "
      "--optimizer muon --muon-lr 0.05";
  // The four attention matrices (16 x 16) to Muon at 0.05 = 5 x lr; tables, head, norms to AdamW.
  const std::string groups_line =
      "param groups: muon muon lr×5 wd 0: 4 tensors (1,024 values); default adamw lr×1 wd 0: 8 "
      "tensors (528 values)\n";
  const Run full = cli(common + " --out '" + (dir / "full").string() + "'", dir);
  REQUIRE(full.status == 0);
  CHECK(full.out.find(groups_line) != std::string::npos);
  const auto config = nlohmann::json::parse(slurp(dir / "full" / "config.json"));
  CHECK(config["optimizer"] == "muon");
  CHECK(config["muon_lr"] == 0.05);
  CHECK(config["muon_ns_steps"] == 5);
  // Stopped and resumed: the momentum buffers travel in the checkpoint, so the metrics agree.
  const Run first =
      cli(common + " --stop-after 15 --quiet --out '" + (dir / "split").string() + "'", dir);
  CHECK(first.status == 130);
  const Run second = cli("train --resume '" + (dir / "split").string() + "' --threads 1", dir);
  REQUIRE(second.status == 0);
  const std::string metrics = slurp(dir / "full" / "metrics.csv");
  CHECK(metrics.size() > 100);
  CHECK(metrics == slurp(dir / "split" / "metrics.csv"));
  // AdamW alone trains otherwise.
  const Run adamw = cli(std::string("train ") + kTinyRecall +
                            " --steps 30 --eval-every 5 --lr 0.01 --seed 3 --out '" +
                            (dir / "adamw").string() + "'",
                        dir);
  REQUIRE(adamw.status == 0);
  CHECK(slurp(dir / "adamw" / "metrics.csv") != metrics);
  // Bad values: one line, status 2, naming the flag and the value.
  const std::string tiny = std::string("train ") + kTinyRecall + " --steps 2 --optimizer muon ";
  check_bad_input(tiny + "--muon-momentum -0.1", dir, "--muon-momentum");
  check_bad_input(tiny + "--muon-ns-steps 0", dir, "--muon-ns-steps");
  check_bad_input(tiny + "--muon-scale spectal", dir, "--muon-scale");
  check_bad_input(tiny + "--muon-lr 0", dir, "--muon-lr");
  check_bad_input(std::string("train ") + kTinyRecall + " --optimizer lion", dir, "--optimizer");
}

TEST_CASE("cli: param_groups in a config file: the groups are printed, and a resume is exact") {
  const auto dir = scratch("param_groups");
  std::ofstream(dir / "groups.json") << R"({"param_groups": [
    {"name": "hidden", "match": {"pattern": "blocks.*.attn.w_*", "rank": 2}, "lr_mult": 10,
     "weight_decay": 0}]})";
  // kTinyRecall without --quiet: the groups line is progress output.
  const std::string common =
      "train --config '" + (dir / "groups.json").string() +
      "' --task recall --keys 8 --values 8 --pairs 4 --d-model 16 --heads 1 --attn-only "
      "--batch 16 --eval-size 64 --threads 1 --steps 30 --eval-every 5 --lr 0.01 --seed 3 "
      "--weight-decay 0.5";
  const std::string groups_line =
      "param groups: hidden adamw lr×10 wd 0: 4 tensors (1,024 values); default adamw lr×1 wd "
      "0.5: 8 tensors (528 values)\n";
  const Run full = cli(common + " --out '" + (dir / "full").string() + "'", dir);
  REQUIRE(full.status == 0);
  const std::size_t at = full.out.find(groups_line);
  CHECK(at != std::string::npos);
  CHECK(full.out.find("param groups:", at + 1) == std::string::npos);  // once
  // The 8 parameters of "default" decay; "hidden" has weight decay 0.
  CHECK(full.out.find("8 of 12 parameter tensors, 528 of 1552 values") != std::string::npos);
  const auto config = nlohmann::json::parse(slurp(dir / "full" / "config.json"));
  CHECK(config["param_groups"][0]["name"] == "hidden");
  CHECK(config["param_groups"][0]["lr_mult"] == 10);
  // Stopped and resumed (its config, groups included, from the checkpoint): the same metrics.
  const Run first =
      cli(common + " --stop-after 15 --quiet --out '" + (dir / "split").string() + "'", dir);
  CHECK(first.status == 130);
  CHECK(first.out.find("param groups:") == std::string::npos);  // --quiet
  const Run second = cli("train --resume '" + (dir / "split").string() + "' --threads 1", dir);
  REQUIRE(second.status == 0);
  CHECK(second.out.find(groups_line) != std::string::npos);
  const std::string metrics = slurp(dir / "full" / "metrics.csv");
  CHECK(metrics.size() > 100);
  CHECK(metrics == slurp(dir / "split" / "metrics.csv"));
  // Without groups the run differs.
  const Run plain = cli(std::string("train ") + kTinyRecall +
                            " --steps 30 --eval-every 5 --lr 0.01 --seed 3 --weight-decay 0.5 "
                            "--out '" +
                            (dir / "plain").string() + "'",
                        dir);
  REQUIRE(plain.status == 0);
  CHECK(plain.out.find("param groups:") == std::string::npos);
  CHECK(slurp(dir / "plain" / "metrics.csv") != metrics);
  // Bad groups: one line, status 2, naming the key and the value.
  const std::vector<std::pair<std::string, std::string>> bad = {
      {R"([{"name": "x", "match": {"pattern": "blocks.*.mlp.*"}}])",
       "train: param_groups[0].match (group 'x') expected a selector that matches a parameter, "
       "got {pattern \"blocks.*.mlp.*\"}: it matched none of the 12 parameters"},
      {R"([{"name": "x", "match": {"rank": 2}, "lr_mult": -1}])",
       "param_groups[0].lr_mult (group 'x') expected a finite value >= 0, got -1"},
      {R"([{"name": "x", "match": {"rank": 2}, "optimizer": "lion"}])",
       "param_groups[0].optimizer (group 'x') expected adamw|sgd|muon"},
      {R"([{"name": "x", "match": {"rank": 1}, "optimizer": "muon"}])",
       "param_groups[0].match (group 'x') expected matrices only for optimizer muon (route the "
       "rest to adamw), got '"},
      {R"([{"name": "x", "lr": 2}])", "config key 'param_groups[0].lr': unknown key"},
      {R"([{"name": "x", "match": {"kind": "weights"}}])", "param_groups[0].match.kind"},
  };
  int i = 0;
  for (const auto& [groups, needle] : bad) {
    const fs::path file = dir / ("bad" + std::to_string(i++) + ".json");
    std::ofstream(file) << R"({"param_groups": )" << groups << "}";
    check_bad_input(
        std::string("train ") + kTinyRecall + " --steps 2 --config '" + file.string() + "'", dir,
        needle);
  }
}

TEST_CASE("cli: --schedule wsd logs the warmup, the flat part and the line, and resumes exactly") {
  const auto dir = scratch("wsd");
  const std::string recipe = std::string("train ") + kTinyRecall +
                             " --steps 40 --eval-every 5 --lr 0.01 --seed 3 --schedule wsd "
                             "--warmup 4 --warmdown 0.5 --min-lr 0.001";
  REQUIRE(cli(recipe + " --out '" + (dir / "full").string() + "'", dir).status == 0);
  const auto config = nlohmann::json::parse(slurp(dir / "full" / "config.json"));
  CHECK(config.at("schedule") == "wsd");
  CHECK(config.at("warmdown") == 0.5);
  // The LR of the step each row logs (row r: step r - 1): warmup over 4 steps, base_lr to step
  // N - D = 20, then the line to min_lr over the last D = 20 steps.
  const std::string metrics = slurp(dir / "full" / "metrics.csv");
  const auto rows = csv_rows(metrics);
  REQUIRE(rows.size() == 9);  // steps 0, 5, ..., 40
  const auto lr_of_step = [](int s) {
    if (s < 4) return 0.01 * (s + 1) / 4;
    if (s <= 20) return 0.01;
    return 0.001 + 0.009 * (40 - s) / 20.0;
  };
  for (const auto& row : rows) {
    const int step = std::stoi(row.at("step"));
    CAPTURE(step);
    CHECK(std::stod(row.at("lr")) ==
          doctest::Approx(lr_of_step(std::max(step - 1, 0))).epsilon(1e-6));
  }
  // The effective config repeats the run; a resumed run continues it exactly.
  REQUIRE(cli("train --quiet --config '" + (dir / "full" / "config.json").string() +
                  "' --threads 1 --out '" + (dir / "again").string() + "'",
              dir)
              .status == 0);
  CHECK(slurp(dir / "again" / "metrics.csv") == metrics);
  CHECK(cli(recipe + " --stop-after 20 --out '" + (dir / "split").string() + "'", dir).status ==
        130);
  REQUIRE(
      cli("train --quiet --resume '" + (dir / "split").string() + "' --threads 1", dir).status ==
      0);
  CHECK(slurp(dir / "split" / "metrics.csv") == metrics);
  check_bad_input("train --resume '" + (dir / "full").string() + "' --warmdown 0.2", dir,
                  "--warmdown cannot be given with --resume");
  check_bad_input("train --warmdown 1.5", dir, "--warmdown: expected a number in [0, 1], got 1.5");
  check_bad_input("train --warmdown -0.1", dir, "--warmdown");
  check_bad_input("train --warmdown nan", dir, "--warmdown");
  std::ofstream(dir / "bad.json") << R"({"warmdown": 2})";
  check_bad_input("train --config '" + (dir / "bad.json").string() + "'", dir,
                  "config key 'warmdown': expected a number in [0, 1], got 2");
  std::ofstream(dir / "bad.json") << R"({"schedule": "linear"})";
  check_bad_input("train --config '" + (dir / "bad.json").string() + "'", dir,
                  "schedule expected constant|cosine|wsd, got linear");
}

TEST_CASE("cli: --decay independent is kept by the config and the checkpoint, sgd refuses it") {
  const auto dir = scratch("decay_mode");
  const std::string common = std::string("train ") + kTinyRecall +
                             " --steps 30 --eval-every 5 --lr 0.01 --seed 3 --weight-decay 0.1";
  const Run full =
      cli(common + " --decay independent --out '" + (dir / "full").string() + "'", dir);
  REQUIRE(full.status == 0);
  CHECK(full.out.find("weight decay 0.1 (decay_params all, independent of the base lr)") !=
        std::string::npos);
  CHECK(nlohmann::json::parse(slurp(dir / "full" / "config.json")).at("decay") == "independent");
  const std::string metrics = slurp(dir / "full" / "metrics.csv");
  CHECK(
      cli(common + " --decay independent --stop-after 15 --out '" + (dir / "split").string() + "'",
          dir)
          .status == 130);
  const Run second =
      cli("train --quiet --resume '" + (dir / "split").string() + "' --threads 1", dir);
  REQUIRE(second.status == 0);
  CHECK(second.out.find("independent of the base lr") != std::string::npos);  // kept
  CHECK(slurp(dir / "split" / "metrics.csv") == metrics);
  // torch's decoupled decay (the default) is another run: 1 - lr · wd against 1 - wd per step.
  const Run plain = cli(common + " --out '" + (dir / "plain").string() + "'", dir);
  REQUIRE(plain.status == 0);
  CHECK(plain.out.find("(decay_params all): ") != std::string::npos);
  CHECK(nlohmann::json::parse(slurp(dir / "plain" / "config.json")).at("decay") == "decoupled");
  CHECK(slurp(dir / "plain" / "metrics.csv") != metrics);
  check_bad_input("train --resume '" + (dir / "full").string() + "' --decay decoupled", dir,
                  "--decay cannot be given with --resume");
  check_bad_input("train --decay coupled", dir, "--decay");
  check_bad_input("train --optimizer sgd --decay independent", dir,
                  "decay expected decoupled (the default) with optimizer sgd");
  std::ofstream(dir / "bad.json") << R"({"decay": "l2"})";
  check_bad_input("train --config '" + (dir / "bad.json").string() + "'", dir,
                  "decay expected decoupled|independent, got l2");
}

TEST_CASE("cli: --skip-outliers adds the skipped column and count, resumes, refuses bad values") {
  const auto dir = scratch("skip_outliers");
  const std::string common =
      std::string("train ") + kTinyRecall + " --steps 40 --eval-every 5 --lr 0.01 --seed 3";
  const Run full = cli(common + " --skip-outliers 4 --out '" + (dir / "full").string() + "'", dir);
  REQUIRE(full.status == 0);
  CHECK(full.out.find("skipped the update") == std::string::npos);  // 40 steps: window not full
  CHECK(nlohmann::json::parse(slurp(dir / "full" / "config.json")).at("skip_outliers") == 4);
  CHECK(nlohmann::json::parse(slurp(dir / "full" / "summary.json")).at("skipped_steps") == 0);
  const std::string metrics = slurp(dir / "full" / "metrics.csv");
  for (const auto& row : csv_rows(metrics)) CHECK(row.at("skipped") == "0");
  const std::string jsonl = slurp(dir / "full" / "metrics.jsonl");
  CHECK(nlohmann::json::parse(jsonl.substr(0, jsonl.find('\n'))).at("skipped") == 0);
  // Until the window fills nothing is skipped: the run is the run without skipping, row for row.
  REQUIRE(cli(common + " --out '" + (dir / "plain").string() + "'", dir).status == 0);
  const auto with = csv_rows(metrics), without = csv_rows(slurp(dir / "plain" / "metrics.csv"));
  REQUIRE(with.size() == without.size());
  CHECK(without[0].count("skipped") == 0);  // no column in a run without skipping
  for (std::size_t i = 0; i < with.size(); ++i) CHECK(with[i].at("loss") == without[i].at("loss"));
  CHECK(cli(common + " --skip-outliers 4 --stop-after 20 --out '" + (dir / "split").string() + "'",
            dir)
            .status == 130);
  REQUIRE(
      cli("train --quiet --resume '" + (dir / "split").string() + "' --threads 1", dir).status ==
      0);
  CHECK(slurp(dir / "split" / "metrics.csv") == metrics);
  check_bad_input("train --resume '" + (dir / "full").string() + "' --skip-outliers 3", dir,
                  "--skip-outliers cannot be given with --resume");
  check_bad_input("train --skip-outliers 0", dir, "--skip-outliers: expected a number in (0, ");
  check_bad_input("train --skip-outliers -2", dir, "--skip-outliers");
  check_bad_input("train --skip-outliers nan", dir, "--skip-outliers");
  check_bad_input("train --skip-outliers inf", dir, "--skip-outliers");
  std::ofstream(dir / "bad.json") << R"({"skip_outliers": -3})";
  check_bad_input("train --config '" + (dir / "bad.json").string() + "'", dir,
                  "config key 'skip_outliers'");
  // 0 in a file is off, as other zero-means keys: a run without the column.
  std::ofstream(dir / "off.json") << R"({"skip_outliers": 0})";
  REQUIRE(cli(common + " --config '" + (dir / "off.json").string() + "' --out '" +
                  (dir / "off").string() + "'",
              dir)
              .status == 0);
  CHECK(csv_rows(slurp(dir / "off" / "metrics.csv"))[0].count("skipped") == 0);
}

TEST_CASE("cli: --z-loss adds the z_loss column beside the cross-entropy, bad values exit 2") {
  const auto dir = scratch("z_loss");
  const std::string common = std::string("train ") + kAccumRecall + " --batch 16";
  REQUIRE(cli(common + " --z-loss 1e-3 --out '" + (dir / "z").string() + "'", dir).status == 0);
  REQUIRE(cli(common + " --out '" + (dir / "plain").string() + "'", dir).status == 0);
  const auto z = csv_rows(slurp(dir / "z" / "metrics.csv"));
  const auto plain = csv_rows(slurp(dir / "plain" / "metrics.csv"));
  REQUIRE(z.size() == 7);  // steps 0, 5, ..., 30
  REQUIRE(plain.size() == z.size());
  CHECK(plain[0].count("z_loss") == 0);  // a run without z-loss keeps its columns
  REQUIRE(z[0].count("z_loss") == 1);
  CHECK(z[0].at("z_loss") == "nan");  // no training step yet
  // The same weights at step 0: the eval loss is the cross-entropy alone in both runs.
  CHECK(z[0].at("eval_loss") == plain[0].at("eval_loss"));
  for (std::size_t i = 1; i < z.size(); ++i) {
    const double z_term = std::stod(z[i].at("z_loss")), ce = std::stod(z[i].at("loss"));
    CAPTURE(i);
    CHECK(z_term > 0);
    CHECK(std::isfinite(z_term));
    CHECK(std::isfinite(ce));
  }
  CHECK(z.back().at("loss") != plain.back().at("loss"));  // the term trained the model
  const std::string jsonl = slurp(dir / "z" / "metrics.jsonl");
  CHECK(nlohmann::json::parse(jsonl.substr(0, jsonl.find('\n'))).contains("z_loss"));
  CHECK(slurp(dir / "z" / "config.json").find("\"z_loss\": 0.001") != std::string::npos);
  check_bad_input("train --z-loss -1e-4", dir, "--z-loss: expected a number in [0, 1], got -1e-4");
  check_bad_input("train --z-loss nan", dir, "--z-loss");
}

TEST_CASE("cli: --grad-accum 2 resumes exactly, and follows one batch of twice the rows") {
  const auto dir = scratch("grad_accum");
  const std::string accum = std::string("train ") + kAccumRecall + " --batch 8 --grad-accum 2";
  REQUIRE(cli(accum + " --out '" + (dir / "full").string() + "'", dir).status == 0);
  const Run first = cli(accum + " --stop-after 15 --out '" + (dir / "split").string() + "'", dir);
  CHECK(first.status == 130);  // stopped mid-run, checkpoint saved
  const Run second =
      cli("train --quiet --resume '" + (dir / "split").string() + "' --threads 1", dir);
  REQUIRE(second.status == 0);
  const std::string full = slurp(dir / "full" / "metrics.csv");
  CHECK(full.size() > 100);
  CHECK(full == slurp(dir / "split" / "metrics.csv"));
  CHECK(slurp(dir / "full" / "metrics.jsonl") == slurp(dir / "split" / "metrics.jsonl"));
  CHECK(slurp(dir / "full" / "config.json").find("\"grad_accum\": 2") != std::string::npos);

  // Micro-batch k holds rows [8k, 8k + 8) of the 16 rows a step of --batch 16 draws: the same
  // data and the gradient of the same mean, so the runs agree to float rounding.
  REQUIRE(cli(std::string("train ") + kAccumRecall + " --batch 16 --out '" +
                  (dir / "one").string() + "'",
              dir)
              .status == 0);
  const auto a = csv_rows(full), b = csv_rows(slurp(dir / "one" / "metrics.csv"));
  REQUIRE(a.size() == b.size());
  for (std::size_t i = 1; i < a.size(); ++i) {
    CAPTURE(i);
    CHECK(std::stod(a[i].at("loss")) == doctest::Approx(std::stod(b[i].at("loss"))).epsilon(1e-4));
    CHECK(std::stod(a[i].at("eval_loss")) ==
          doctest::Approx(std::stod(b[i].at("eval_loss"))).epsilon(1e-4));
  }
  // Without accumulation, --batch 8 sees half the data per step: another run.
  REQUIRE(cli(std::string("train ") + kAccumRecall + " --batch 8 --out '" +
                  (dir / "half").string() + "'",
              dir)
              .status == 0);
  CHECK(std::stod(csv_rows(slurp(dir / "half" / "metrics.csv")).back().at("loss")) !=
        doctest::Approx(std::stod(a.back().at("loss"))).epsilon(1e-4));
  CHECK(nlohmann::json::parse(slurp(dir / "full" / "summary.json")).at("steps_done") == 30);
  check_bad_input("train --grad-accum 0", dir,
                  "--grad-accum: expected an integer in [1, 4096], got 0");
  check_bad_input("train --grad-accum 1.5", dir, "--grad-accum");
}

#endif  // ATTNLAB_CLI_PATH
