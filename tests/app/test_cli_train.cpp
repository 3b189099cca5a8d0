// attnlab train, run as a user runs it: a tiny run learns and writes its outputs, runs are
// deterministic, resume continues exactly, signals save, and the block's options train and load.
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

TEST_CASE("cli: a tiny train run lowers the eval loss and writes its outputs") {
  const auto dir = scratch("tiny_train");
  const Run r =
      cli(std::string("train ") + kTinyRecall + " --steps 150 --lr 0.01 --eval-every 50 --out '" +
              (dir / "run").string() + "'",
          dir, shell_core());
  REQUIRE(r.status == 0);
  CHECK(r.err.empty());
  for (const char* f : {"metrics.csv", "summary.json", "model.safetensors"})
    CHECK(fs::exists(dir / "run" / f));
  const auto summary = nlohmann::json::parse(slurp(dir / "run" / "summary.json"));
  CHECK(summary["final_eval_loss"].get<double>() < 0.8 * summary["init_eval_loss"].get<double>());
  CHECK(summary["status"] == "finished");
  // The same environment, so the same BLAS kernels as this process.
  CHECK(summary["blas_core"] == attnlab::blas_info().core);
  // Throughput: tokens/s of the steps' time (part of the run's time), the model's FLOPs per token,
  // and the utilisation line that relates them to the cores' FMA peak and to the sgemm peak, both
  // measured after the steps at the run's thread count; summary.json names each denominator.
  const double step_seconds = summary["step_seconds"].get<double>();
  CHECK(step_seconds > 0);
  CHECK(step_seconds < summary["seconds"].get<double>());
  const double tokens_per_second = summary["tokens_per_second"].get<double>();
  CHECK(tokens_per_second * step_seconds == doctest::Approx(150.0 * 16 * 5));  // steps·B·(pairs+1)
  CHECK(summary["flops_per_token"].get<double>() > 0);
  CHECK(r.out.find("throughput: ") != std::string::npos);
  CHECK(r.out.find("of the cores' FMA peak measured now") != std::string::npos);
  CHECK(r.out.find("MFU ") != std::string::npos);
  const auto& u = summary["utilisation"];
  const double model_gflops = u["model_gflops"].get<double>();
  CHECK(model_gflops ==
        doctest::Approx(summary["flops_per_token"].get<double>() * tokens_per_second / 1e9));
  CHECK(u["threads"] == 1);  // kTinyRecall's --threads 1
  CHECK(u["fma_peak_gflops"].get<double>() > 0);
  CHECK(!u["fma_peak_vector"].get<std::string>().empty());
  CHECK(u["of_fma_peak"].get<double>() ==
        doctest::Approx(model_gflops / u["fma_peak_gflops"].get<double>()));
  CHECK(u["of_sgemm_peak"].get<double>() ==
        doctest::Approx(model_gflops / u["sgemm_peak_gflops"].get<double>()));
  // eval reads the checkpoint back and reports the same loss.
  const Run e = cli("eval --checkpoint '" + (dir / "run").string() + "' --show 1", dir);
  REQUIRE(e.status == 0);
  CHECK(e.out.find("query attention") != std::string::npos);
  char expected[64];
  std::snprintf(expected, sizeof expected, "loss %.4f", summary["final_eval_loss"].get<double>());
  CHECK(e.out.find(expected) != std::string::npos);
  // --logits writes the eval set's logits (N, T, V) as a PyTorch-layout safetensors file.
  const auto logits_file = dir / "logits.safetensors";
  const Run l = cli("eval --checkpoint '" + (dir / "run").string() + "' --show 0 --logits '" +
                        logits_file.string() + "'",
                    dir);
  REQUIRE(l.status == 0);
  const auto logits = attnlab::load_safetensors(logits_file.string());
  CHECK(logits.metadata.at("format") == "pt");
  REQUIRE(logits.find("logits") != nullptr);
  CHECK(logits.find("logits")->shape == std::vector<std::size_t>{64, 5, 8});
}

TEST_CASE("cli: --weights-only writes the weights without the optimizer state: eval, not resume") {
  const auto dir = scratch("weights_only");
  const std::string args = std::string("train ") + kTinyRecall + " --steps 20 --eval-every 10";
  REQUIRE(cli(args + " --out '" + (dir / "full").string() + "'", dir).status == 0);
  REQUIRE(cli(args + " --weights-only --out '" + (dir / "weights").string() + "'", dir).status ==
          0);
  const auto full = attnlab::load_safetensors((dir / "full" / "model.safetensors").string());
  const auto weights = attnlab::load_safetensors((dir / "weights" / "model.safetensors").string());
  CHECK(full.metadata.at("contents") == "training state");
  CHECK(weights.metadata.at("contents") == "weights");
  std::size_t optim = 0, params = 0;
  for (const auto& t : full.tensors) (t.name.rfind("optim.", 0) == 0 ? optim : params) += 1;
  CHECK(optim > 0);
  CHECK(weights.tensors.size() == params);  // the same parameters, nothing else
  for (const auto& t : weights.tensors) {
    CAPTURE(t.name);
    REQUIRE(full.find(t.name) != nullptr);
    CHECK(full.find(t.name)->data == t.data);  // the same run: the same weights
  }
  CHECK(fs::file_size(dir / "weights" / "model.safetensors") <
        fs::file_size(dir / "full" / "model.safetensors") / 2);
  // eval reads it; resume refuses it in one line, naming the file.
  const Run e = cli("eval --checkpoint '" + (dir / "weights").string() + "'", dir);
  CHECK(e.status == 0);
  const Run r = cli("train --quiet --resume '" + (dir / "weights").string() + "' --steps 30", dir);
  CHECK(r.status != 0);
  CHECK(std::count(r.err.begin(), r.err.end(), '\n') == 1);
  CHECK(r.err.find("holds the weights only") != std::string::npos);
  CHECK(r.err.find("model.safetensors") != std::string::npos);
}

TEST_CASE(
    "cli: a text run, then generate from its checkpoint alone, and bad text input is one line") {
  const auto dir = scratch("text");
  const std::string excerpt = std::string(ATTNLAB_TEST_DATA_DIR) + "/text/hamlet_excerpt.txt";
  const std::string copy = (dir / "hamlet.txt").string();
  fs::copy_file(excerpt, copy);
  const Run t = cli("train --task text --data '" + copy +
                        "' --causal --block 16 --d-model 16 --heads 2 --steps 20 --batch 8 "
                        "--eval-every 10 --eval-size 16 --threads 1 --quiet --out '" +
                        (dir / "run").string() + "'",
                    dir);
  REQUIRE(t.status == 0);
  fs::remove(copy);  // generate and eval of the vocabulary need no data file
  const std::string gen_base =
      "generate --checkpoint '" + (dir / "run").string() + "' --tokens 24 --threads 1 ";
  const std::string gen = gen_base + "--prompt 'Ham.' ";
  const Run g1 = cli(gen + "--greedy", dir), g2 = cli(gen + "--greedy --seed 9", dir);
  REQUIRE(g1.status == 0);
  CHECK(g1.out.rfind("Ham.", 0) == 0);  // the prompt, then the continuation
  CHECK(g1.out.size() >= 4 + 24 + 1);   // 24 characters (some may be multi-byte)
  CHECK(g1.out == g2.out);              // greedy is deterministic
  CHECK(g1.err.find("generated 24 tokens") != std::string::npos);
  const Run s1 = cli(gen + "--seed 3 --top-k 5", dir), s2 = cli(gen + "--seed 3 --top-k 5", dir);
  CHECK(s1.status == 0);
  CHECK(s1.out == s2.out);  // a fixed seed reproduces a sample
  CHECK(cli(gen + "--greedy --no-cache", dir).out == g1.out);
  // Bad input: one line, status 2.
  check_bad_input(gen_base + "--prompt 'Ham€'", dir, "U+20AC");
  check_bad_input(gen + "--top-p 0", dir, "--top-p");
  check_bad_input(gen + "--temperature 0", dir, "--temperature");
  check_bad_input("train --task text --causal --quiet", dir, "data_file");
  check_bad_input("train --task text --data '" + excerpt + "' --quiet", dir, "causal");
  check_bad_input("train --task text --vocab word --data '" + excerpt + "'", dir, "--vocab");
  check_bad_input("train --task text --block 0 --data '" + excerpt + "'", dir, "--block");
  std::ofstream(dir / "empty.txt").close();
  check_bad_input("train --task text --causal --data '" + (dir / "empty.txt").string() + "'", dir,
                  "is empty");
  std::ofstream(dir / "latin1.txt", std::ios::binary) << "caf\xe9 au lait\n";
  check_bad_input("train --task text --causal --data '" + (dir / "latin1.txt").string() + "'", dir,
                  "invalid UTF-8 at byte offset 3");
  // A checkpoint of another task cannot generate.
  REQUIRE(cli(std::string("train ") + kTinyRecall + " --steps 2 --out '" +
                  (dir / "recall").string() + "'",
              dir)
              .status == 0);
  check_bad_input("generate --checkpoint '" + (dir / "recall").string() + "'", dir,
                  "a run of task recall");
}

TEST_CASE("cli: same seed and threads give an identical metrics.csv") {
  const auto dir = scratch("determinism");
  for (const char* name : {"a", "b"}) {
    const Run r =
        cli(std::string("train ") + kTinyRecall + " --steps 30 --eval-every 10 --seed 7 --out '" +
                (dir / name).string() + "'",
            dir);
    REQUIRE(r.status == 0);
  }
  const std::string a = slurp(dir / "a" / "metrics.csv");
  CHECK(a.size() > 100);
  CHECK(a == slurp(dir / "b" / "metrics.csv"));
  const Run c = cli(std::string("train ") + kTinyRecall +
                        " --steps 30 --eval-every 10 --seed 8 --out '" + (dir / "c").string() + "'",
                    dir);
  REQUIRE(c.status == 0);
  CHECK(a != slurp(dir / "c" / "metrics.csv"));
}

TEST_CASE("cli: resume continues exactly (40 steps == 20 + save + resume + 20)") {
  const auto dir = scratch("resume");
  const std::string common =
      std::string("train ") + kTinyRecall + " --steps 40 --eval-every 5 --lr 0.01 --seed 3";
  REQUIRE(cli(common + " --out '" + (dir / "full").string() + "'", dir).status == 0);
  const Run first = cli(common + " --stop-after 20 --out '" + (dir / "split").string() + "'", dir);
  CHECK(first.status == 130);  // stopped early, checkpoint saved
  const Run second =
      cli("train --quiet --resume '" + (dir / "split").string() + "' --threads 1", dir);
  REQUIRE(second.status == 0);
  const std::string full = slurp(dir / "full" / "metrics.csv");
  CHECK(full.size() > 100);
  CHECK(full == slurp(dir / "split" / "metrics.csv"));
  CHECK(slurp(dir / "full" / "metrics.jsonl") == slurp(dir / "split" / "metrics.jsonl"));

  // metrics.jsonl: one object per metrics.csv row, keys that do not depend on the model's size,
  // the values of the CSV (to its 7 digits), null for the step-0 training loss (NaN).
  std::istringstream csv(full), jsonl(slurp(dir / "full" / "metrics.jsonl"));
  std::string header, csv_row, json_row;
  std::getline(csv, header);
  std::size_t rows = 0;
  while (std::getline(csv, csv_row)) {
    REQUIRE(std::getline(jsonl, json_row));
    const auto j = nlohmann::json::parse(json_row);
    for (const char* key :
         {"step", "loss", "eval_loss", "eval_acc", "lr", "jacobian_mean", "heads", "layers"}) {
      CHECK(j.contains(key));
    }
    CHECK(j.size() == 8);
    CHECK(std::to_string(j["step"].get<long>()) == csv_row.substr(0, csv_row.find(',')));
    const std::string eval_loss = csv_row.substr(csv_row.find(',', csv_row.find(',') + 1) + 1);
    CHECK(j["eval_loss"].get<double>() ==
          doctest::Approx(std::stod(eval_loss.substr(0, eval_loss.find(',')))).epsilon(1e-6));
    if (rows == 0) CHECK(j["loss"].is_null());
    REQUIRE(j["heads"].size() == 1);  // one layer, one head
    CHECK(j["heads"][0]["layer"] == 0);
    CHECK(j["heads"][0].contains("recall_mass"));
    REQUIRE(j["layers"].size() == 1);
    CHECK(j["layers"][0].contains("wq_grad_norm"));
    ++rows;
  }
  CHECK(rows == 9);  // steps 0, 5, ..., 40
  CHECK_FALSE(std::getline(jsonl, json_row));
}

TEST_CASE("cli: with dropout, resume continues exactly, and dropout changes training") {
  // The masks are keyed by (seed, step, layer): a resumed run draws the ones it would have drawn.
  const auto dir = scratch("resume_dropout");
  const std::string common = std::string("train ") + kTinyRecall +
                             " --steps 30 --eval-every 5 --lr 0.01 --seed 3 --dropout 0.2 "
                             "--attn-dropout 0.1";
  REQUIRE(cli(common + " --out '" + (dir / "full").string() + "'", dir).status == 0);
  const Run first = cli(common + " --stop-after 15 --out '" + (dir / "split").string() + "'", dir);
  CHECK(first.status == 130);
  const Run second =
      cli("train --quiet --resume '" + (dir / "split").string() + "' --threads 1", dir);
  REQUIRE(second.status == 0);
  const std::string full = slurp(dir / "full" / "metrics.csv");
  CHECK(full.size() > 100);
  CHECK(full == slurp(dir / "split" / "metrics.csv"));
  // The same run without dropout logs other losses; the checkpoint's config keeps both fields.
  const std::string plain_args = std::string("train ") + kTinyRecall +
                                 " --steps 30 --eval-every 5 --lr 0.01 --seed 3 --out '" +
                                 (dir / "plain").string() + "'";
  REQUIRE(cli(plain_args, dir).status == 0);
  CHECK(slurp(dir / "plain" / "metrics.csv") != full);
  const std::string config = slurp(dir / "full" / "config.json");
  CHECK(config.find("\"dropout\": 0.2") != std::string::npos);
  CHECK(config.find("\"dropout\": 0.1") != std::string::npos);
  check_bad_input("train --dropout 1", dir, "--dropout");
  check_bad_input("train --attn-dropout -0.1", dir, "--attn-dropout");
}

TEST_CASE("cli: SIGINT and SIGTERM save a checkpoint, exit with 130 and 143, and the run resumes") {
  const auto dir = scratch("sigint");
  for (const auto& [signal, status] : {std::pair{"INT", 130}, std::pair{"TERM", 143}}) {
    CAPTURE(signal);
    const fs::path run = dir / (std::string("run_") + signal);
    // Start a long run, wait until it has written its first metrics row, then signal it.
    const std::string cmd = "'" + std::string(ATTNLAB_CLI_PATH) + "' train " + kTinyRecall +
                            " --steps 100000000 --eval-every 10 --out '" + run.string() +
                            "' >/dev/null 2>'" + (dir / "stderr.txt").string() + "' & pid=$!; " +
                            "for i in $(seq 1 600); do [ -s '" + (run / "metrics.csv").string() +
                            "' ] && break; sleep 0.05; done; sleep 0.2; kill -" + signal +
                            " $pid; wait $pid; echo $? > '" + (dir / "status.txt").string() + "'";
    std::ofstream(dir / "interrupt.sh") << cmd << '\n';
    REQUIRE(std::system(("bash '" + (dir / "interrupt.sh").string() + "'").c_str()) == 0);
    CHECK(std::stoi(slurp(dir / "status.txt")) == status);
    CHECK(slurp(dir / "stderr.txt").empty());
    const auto summary = nlohmann::json::parse(slurp(run / "summary.json"));
    CHECK(summary["status"] == "interrupted");
    CHECK(fs::exists(run / "model.safetensors"));
  }
  // --save-every also leaves a checkpoint; a resumed run continues to --steps.
  const Run r = cli(std::string("train ") + kTinyRecall +
                        " --steps 30 --save-every 10 --stop-after 25 --out '" +
                        (dir / "periodic").string() + "'",
                    dir);
  CHECK(r.status == 130);
  const Run resumed = cli("train --quiet --resume '" + (dir / "periodic").string() + "'", dir);
  CHECK(resumed.status == 0);
  CHECK(nlohmann::json::parse(slurp(dir / "periodic" / "summary.json"))["steps_done"] == 30);
}

// ---- run configs (--config, OUT/config.json) and resume rules ----

TEST_CASE("cli: --positions rope trains, and its effective config carries RoPE's fields") {
  const auto dir = scratch("rope_run");
  const auto out = dir / "rope";
  const Run r = cli(std::string("train ") + kTinySort +
                        " --steps 20 --positions rope --rope-theta 500 --rope-fraction 0.5 "
                        "--out '" +
                        out.string() + "'",
                    dir);
  REQUIRE(r.status == 0);
  const auto config = nlohmann::json::parse(slurp(out / "config.json"));
  CHECK(config["model"]["positions"] == "rope");
  CHECK(config["model"]["block"]["attention"]["rope_theta"] == 500.0);
  CHECK(config["model"]["block"]["attention"]["rope_fraction"] == 0.5);
  CHECK(config["model"]["block"]["attention"]["rope"] == false);  // positions is the switch
  const Run e = cli("eval --checkpoint '" + out.string() + "'", dir);
  CHECK(e.status == 0);
}

TEST_CASE("cli: --no-bias trains a model without biases, and eval reads it back") {
  const auto dir = scratch("no_bias_run");
  const auto out = dir / "run";
  const Run r = cli(std::string("train ") + kTinySort + " --steps 20 --d-ff 16 --no-bias --out '" +
                        out.string() + "'",
                    dir);
  REQUIRE(r.status == 0);
  CHECK(nlohmann::json::parse(slurp(out / "config.json"))["model"]["block"]["bias"] == false);
  const auto file = attnlab::load_safetensors((out / "model.safetensors").string());
  CHECK(file.find("blocks.0.mlp.fc1.w") != nullptr);
  CHECK(file.find("blocks.0.mlp.fc1.b") == nullptr);
  CHECK(file.find("blocks.0.ln1.beta") == nullptr);
  CHECK(file.find("ln_f.beta") == nullptr);
  CHECK(file.find("ln_f.gamma") != nullptr);
  CHECK(cli("eval --checkpoint '" + out.string() + "'", dir).status == 0);
}

TEST_CASE("cli: --attn-softcap caps the attention scores of a run, and eval reads it back") {
  const auto dir = scratch("attn_softcap_run");
  const auto capped = dir / "capped", plain = dir / "plain";
  const std::string common = std::string("train ") + kTinySort + " --steps 10 --scale 4";
  REQUIRE(cli(common + " --attn-softcap 0.5 --out '" + capped.string() + "'", dir).status == 0);
  REQUIRE(cli(common + " --out '" + plain.string() + "'", dir).status == 0);
  const auto config = nlohmann::json::parse(slurp(capped / "config.json"));
  CHECK(config["model"]["block"]["attention"]["sdpa"]["softcap"] == 0.5);
  // The same seed and data: only the cap differs, and it changes the run.
  const auto loss = [](const fs::path& run) {
    return nlohmann::json::parse(slurp(run / "summary.json")).at("final_train_loss").get<double>();
  };
  CHECK(loss(capped) != loss(plain));
  CHECK(cli("eval --checkpoint '" + capped.string() + "'", dir).status == 0);
  // --config reproduces it: the file's softcap is read back.
  const auto again = dir / "again";
  REQUIRE(cli("train --quiet --config '" + (capped / "config.json").string() + "' --out '" +
                  again.string() + "'",
              dir)
              .status == 0);
  CHECK(loss(again) == loss(capped));
}

TEST_CASE("cli: --mlp swiglu trains LLaMA's MLP at its default width, and eval reads it back") {
  const auto dir = scratch("swiglu_run");
  const auto out = dir / "run";
  REQUIRE(cli(std::string("train ") + kTinySort + " --steps 10 --mlp swiglu --out '" +
                  out.string() + "'",
              dir)
              .status == 0);
  const auto config = nlohmann::json::parse(slurp(out / "config.json"));
  CHECK(config["model"]["block"]["mlp"] == "swiglu");
  CHECK(config["model"]["block"]["d_ff"] == 32);  // int(8 · 8 / 3) = 21, up to a multiple of 16
  const auto file = attnlab::load_safetensors((out / "model.safetensors").string());
  REQUIRE(file.find("blocks.0.mlp.fc1.w") != nullptr);
  CHECK(file.find("blocks.0.mlp.fc1.w")->shape == std::vector<std::size_t>{8, 64});  // [gate | up]
  CHECK(file.find("blocks.0.mlp.fc2.w")->shape == std::vector<std::size_t>{32, 8});
  CHECK(cli("eval --checkpoint '" + out.string() + "'", dir).status == 0);
}

TEST_CASE("cli: every run writes its effective config, and --config reproduces the run from it") {
  const auto dir = scratch("config_round_trip");
  const auto a = dir / "a", b = dir / "b";
  REQUIRE(
      cli(std::string("train ") + kTinySort + " --steps 10 --lr 0.01 --out '" + a.string() + "'",
          dir)
          .status == 0);
  REQUIRE(fs::exists(a / "config.json"));
  const auto config = nlohmann::json::parse(slurp(a / "config.json"));
  CHECK(config.at("lr") == 0.01);
  CHECK(config.at("model").at("block").at("attention").at("heads") == 2);
  CHECK(config.at("model").at("block").at("d_ff") == 32);  // resolved: 4 * d_model
  CHECK(config.at("model").at("max_len") == 5);            // decided by the task
  // The file alone (with another --out) gives the same run; a flag overrides the file.
  const Run r = cli("train --quiet --config '" + (a / "config.json").string() +
                        "' --threads 1 --out '" + b.string() + "'",
                    dir);
  REQUIRE(r.status == 0);
  CHECK(slurp(a / "metrics.csv") == slurp(b / "metrics.csv"));
  auto same = nlohmann::json::parse(slurp(b / "config.json"));
  same["out"] = a.string();
  CHECK(same == config);
  REQUIRE(cli("train --quiet --config '" + (a / "config.json").string() + "' --lr 0.02 --out '" +
                  (dir / "c").string() + "'",
              dir)
              .status == 0);
  CHECK(nlohmann::json::parse(slurp(dir / "c" / "config.json")).at("lr") == 0.02);
  CHECK(slurp(a / "metrics.csv") != slurp(dir / "c" / "metrics.csv"));
  // A partial file keeps the defaults; an unknown key or a bad value is one error line naming it.
  std::ofstream(dir / "bad.json") << R"({"model": {"block": {"attention": {"d_modl": 8}}}})";
  check_bad_input("train --config '" + (dir / "bad.json").string() + "'", dir,
                  "model.block.attention.d_modl");
  std::ofstream(dir / "bad2.json") << R"({"task": {"kind": "copy"}})";
  check_bad_input("train --config '" + (dir / "bad2.json").string() + "'", dir, "task.kind");
}

TEST_CASE(
    "cli: resume writes into DIR and says so, --steps extends the run, recipe flags are refused") {
  const auto dir = scratch("resume_rules");
  const auto run = dir / "run";
  REQUIRE(cli(std::string("train ") + kTinySort + " --steps 20 --out '" + run.string() + "'", dir)
              .status == 0);
  const std::string resume = "train --quiet --resume '" + run.string() + "'";
  // Bug: the last line named the default --out (runs/train) instead of DIR.
  const Run again = cli(resume, dir);
  REQUIRE(again.status == 0);
  CHECK(again.out.find("outputs: " + run.string() + "/config.json") != std::string::npos);
  CHECK(again.out.find("runs/train") == std::string::npos);
  // Bug: --steps was silently ignored. It extends the run; the schedule is that of a 30-step run.
  const Run more = cli(resume + " --steps 30", dir);
  REQUIRE(more.status == 0);
  CHECK(more.out.find("done: 30 steps") != std::string::npos);
  const std::string metrics = slurp(run / "metrics.csv");
  CHECK(metrics.find("\n30,") != std::string::npos);
  CHECK(nlohmann::json::parse(slurp(run / "config.json")).at("steps") == 30);
  // Fewer steps than the saved step: refused, naming the field.
  check_bad_input(resume + " --steps 10", dir, "steps");
  // Run control takes effect: --out writes elsewhere and leaves DIR alone.
  const Run moved = cli(resume + " --steps 35 --out '" + (dir / "moved").string() + "'", dir);
  REQUIRE(moved.status == 0);
  CHECK(fs::exists(dir / "moved" / "model.safetensors"));
  CHECK(slurp(run / "metrics.csv") == metrics);
  // Every recipe class is refused with status 2, naming the flag: model, task, optimizer,
  // schedule, data and a whole config.
  for (const char* flag : {"--heads 1", "--causal", "--task reverse", "--lr 0.1", "--batch 8",
                           "--warmup 2", "--seed 4", "--eval-size 8"}) {
    const std::string name = std::string(flag).substr(0, std::string(flag).find(' '));
    check_bad_input(resume + " " + flag, dir, name + " cannot be given with --resume");
  }
  check_bad_input(resume + " --config '" + (run / "config.json").string() + "'", dir,
                  "--config cannot be given with --resume");
}

TEST_CASE("cli: a run directory of the flat layout (written before the nested config) loads") {
  const auto dir = scratch("legacy_run");
  const std::string legacy = std::string(ATTNLAB_TEST_DATA_DIR) + "/legacy_run";
  const Run e = cli("eval --show 0 --checkpoint '" + legacy + "'", dir);
  REQUIRE(e.status == 0);
  CHECK(e.out.find("loss 2.1781  accuracy 0.0500") != std::string::npos);  // as the old binary
  const Run r = cli(
      "train --quiet --resume '" + legacy + "' --steps 6 --out '" + (dir / "more").string() + "'",
      dir);
  REQUIRE(r.status == 0);
  CHECK(r.out.find("done: 6 steps") != std::string::npos);
  const auto config = nlohmann::json::parse(slurp(dir / "more" / "config.json"));
  CHECK(config.at("model").at("block").at("d_ff") == 16);
  CHECK(config.at("task").at("kind") == "sort");
}

TEST_CASE("cli: a task that needs later tokens is refused with --causal") {
  const auto dir = scratch("reverse_causal");
  check_bad_input("train --task reverse --causal", dir,
                  "task reverse cannot be learned with --causal");
  check_bad_input("train --task sort --causal", dir, "task sort cannot be learned with --causal");
}

#endif  // ATTNLAB_CLI_PATH
