// train's --skip-outliers (TrainConfig::skip_outliers; llm.c's -sl / -sg) on a text whose few
// noisy stretches make the batches that draw them outliers: every step whose loss has a z-score
// above the threshold over the last 128 steps skips its update (the weights stay bit for bit, the
// optimizer's step count does not advance, the LR schedule does), the metrics' skipped column and
// summary.json's count say so, and a run stopped and resumed makes the same decisions and ends
// with bit-identical weights and optimizer state.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "attnlab/app/run_checkpoint.hpp"
#include "attnlab/app/trainer.hpp"
#include "attnlab/io/safetensors.hpp"
#include "attnlab/optim/outlier.hpp"
#include "attnlab/optim/schedule.hpp"
#include "attnlab/random.hpp"
#include "temp_dir.hpp"

using namespace attnlab;
using namespace attnlab::app;

namespace {

constexpr int kSteps = 300;
constexpr double kThreshold = 4;

// "abcd" repeated (a bigram model predicts it exactly, so the loss soon sits near zero), with
// four stretches of 24 random letters from e..p: a batch that draws a block overlapping one has a
// loss far above the window's.
std::string noisy_text() {
  std::string text;
  for (int i = 0; i < 1500; ++i) text += "abcd";
  Rng rng(3);
  for (const std::size_t at : {700u, 2100u, 3500u, 4900u})
    for (std::size_t i = 0; i < 24; ++i) text[at + i] = static_cast<char>('e' + rng.below(12));
  return text;
}

TrainConfig noisy_run(const std::string& data, const std::string& out, double skip) {
  TrainConfig c;
  c.task.kind = TaskKind::text;
  c.task.block = 16;
  c.data_file = data;
  c.model.layers = 1;
  c.model.block.attn_only = false;
  c.model.block.attention.d_model = 16;
  c.model.block.attention.heads = 2;
  c.model.block.attention.sdpa.causal = true;
  c.lr = 1e-2;
  c.schedule = LrScheduleKind::warmup_stable_decay;  // the schedule advances through skipped steps:
                                                     // its lr is checked below
  c.warmup = 10;
  c.warmdown = 0.3;
  c.skip_outliers = skip;
  c.steps = kSteps;
  c.batch = 2;
  c.eval_every = 1;  // a row per step: each step's loss, decision and weight norms
  c.eval_size = 4;
  c.seed = 1;
  c.out = out;
  c.progress = false;
  return c;
}

std::vector<nlohmann::json> jsonl_rows(const std::string& run) {
  std::ifstream in(run + "/metrics.jsonl");
  std::vector<nlohmann::json> rows;
  for (std::string line; std::getline(in, line);) rows.push_back(nlohmann::json::parse(line));
  return rows;
}

std::string slurp(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// Whether two rows hold the same W_Q and W_K norms in every layer (full precision: a step that
// moves the weights changes them).
bool same_weights(const nlohmann::json& a, const nlohmann::json& b) {
  const auto& la = a.at("layers");
  const auto& lb = b.at("layers");
  REQUIRE(la.size() == lb.size());
  for (std::size_t l = 0; l < la.size(); ++l)
    for (const char* key : {"wq_norm", "wk_norm"})
      if (la[l].at(key) != lb[l].at(key)) return false;
  return true;
}

const Context kOneThread{.threads = 1};

}  // namespace

TEST_CASE("train --skip-outliers: outlier steps skip their update, the rest train, counts agree") {
  test::TempDir dir;
  const std::string data = dir.file("noisy.txt");
  std::ofstream(data) << noisy_text();
  const TrainConfig c = noisy_run(data, dir.file("skip"), kThreshold);
  const TrainResult r = train_model(c, kOneThread);
  REQUIRE_FALSE(r.diverged);
  REQUIRE(r.steps_done == kSteps);
  const auto rows = jsonl_rows(c.out);
  REQUIRE(rows.size() == kSteps + 1);  // steps 0..N

  // The loss z-scores over the last 128 steps, recomputed from the logged losses (full precision).
  OutlierDetector losses;
  const LrSchedule schedule = LrSchedule::warmup_stable_decay(c.lr, 0, 10, kSteps, 0.3);
  int skipped = 0, by_loss = 0;
  for (std::size_t step = 1; step < rows.size(); ++step) {
    CAPTURE(step);
    const auto& row = rows[step];
    REQUIRE(row.contains("skipped"));
    const bool skip = row.at("skipped") == 1;
    const double z = losses.update(row.at("loss").get<double>());
    CHECK(row.at("lr").get<double>() == schedule.lr_at(step - 1));  // the schedule advanced
    if (step <= 128) CHECK_FALSE(skip);  // no decision while the window fills
    if (std::isfinite(z) && z > kThreshold) {
      CHECK(skip);
      ++by_loss;
    }
    // A skipped step leaves every weight as it was (the norms bit for bit); an updated one moves.
    if (skip)
      CHECK(same_weights(row, rows[step - 1]));
    else
      CHECK_FALSE(same_weights(row, rows[step - 1]));
    skipped += skip;
  }
  MESSAGE("skipped " << skipped << " of " << kSteps << " updates, " << by_loss
                     << " with a loss z-score above " << kThreshold);
  CHECK(by_loss >= 2);
  CHECK(r.skipped_steps == skipped);
  const auto summary = nlohmann::json::parse(slurp(c.out + "/summary.json"));
  CHECK(summary.at("skipped_steps") == skipped);
  // The optimizer took one step per update: its count (AdamW's t) skips the skipped steps.
  const RunMeta meta = read_run_meta(c.out + "/model.safetensors");
  CHECK(meta.step == static_cast<std::size_t>(kSteps));
  CHECK(meta.optimizer_steps == static_cast<std::size_t>(kSteps - skipped));
  CHECK_FALSE(meta.outliers.empty());
  // metrics.csv's skipped column holds the same decisions.
  std::ifstream csv(c.out + "/metrics.csv");
  std::string header;
  std::getline(csv, header);
  // The skipped column by name (the mechanism columns follow it).
  std::vector<std::string> names;
  std::istringstream header_cells(header);
  for (std::string name; std::getline(header_cells, name, ',');) names.push_back(name);
  const auto at =
      static_cast<std::size_t>(std::find(names.begin(), names.end(), "skipped") - names.begin());
  REQUIRE(at < names.size());
  int csv_skipped = 0;
  for (std::string line; std::getline(csv, line);) {
    std::vector<std::string> cells;
    std::istringstream row(line);
    for (std::string cell; std::getline(row, cell, ',');) cells.push_back(cell);
    REQUIRE(cells.size() == names.size());
    csv_skipped += cells[at] == "1";
  }
  CHECK(csv_skipped == skipped);

  // Without skipping, the same run trains on the same batches: identical up to the first skipped
  // step, whose loss it computes the same (forward and backward happen), then it updates.
  std::size_t first = 0;
  for (std::size_t step = 1; step < rows.size() && first == 0; ++step)
    if (rows[step].at("skipped") == 1) first = step;
  REQUIRE(first > 128);
  const TrainConfig plain = noisy_run(data, dir.file("plain"), 0);
  const TrainResult rp = train_model(plain, kOneThread);
  CHECK(rp.skipped_steps == 0);
  const auto plain_rows = jsonl_rows(plain.out);
  REQUIRE(plain_rows.size() == rows.size());
  CHECK_FALSE(plain_rows[1].contains("skipped"));  // no column in a run without skipping
  for (std::size_t step = 1; step <= first; ++step) {
    CAPTURE(step);
    CHECK(plain_rows[step].at("loss") == rows[step].at("loss"));
  }
  CHECK(same_weights(plain_rows[first - 1], rows[first - 1]));
  CHECK_FALSE(same_weights(plain_rows[first], rows[first]));
  CHECK(read_run_meta(plain.out + "/model.safetensors").outliers.empty());
}

TEST_CASE("train --skip-outliers: a resumed run makes the same decisions, bit-identical weights") {
  test::TempDir dir;
  const std::string data = dir.file("noisy.txt");
  std::ofstream(data) << noisy_text();
  const TrainConfig full = noisy_run(data, dir.file("full"), kThreshold);
  const TrainResult rf = train_model(full, kOneThread);
  const auto rows = jsonl_rows(full.out);
  std::vector<std::size_t> skips;
  for (std::size_t step = 1; step < rows.size(); ++step)
    if (rows[step].at("skipped") == 1) skips.push_back(step);
  REQUIRE(skips.size() >= 2);
  // Stopped right after the first skipped step: the checkpoint carries a full window, the count
  // 1 and the optimizer's lagging step count; the later skips must be decided again.
  TrainConfig half = noisy_run(data, dir.file("split"), kThreshold);
  half.stop_after = static_cast<int>(skips.front());
  CHECK(train_model(half, kOneThread).interrupted);
  CHECK(nlohmann::json::parse(read_run_meta(half.out + "/model.safetensors").outliers)
            .at("skipped_steps") == 1);
  TrainConfig rest = noisy_run(data, dir.file("split"), kThreshold);
  rest.resume = half.out;
  prepare_task(rest);  // the vocabulary, as the CLI's --resume reads it with the saved config
  const TrainResult rr = train_model(rest, kOneThread);
  CHECK(rr.steps_done == kSteps);
  CHECK(rr.skipped_steps == rf.skipped_steps);
  CHECK(slurp(half.out + "/metrics.jsonl") == slurp(full.out + "/metrics.jsonl"));
  CHECK(slurp(half.out + "/metrics.csv") == slurp(full.out + "/metrics.csv"));
  // The checkpoints: every tensor (weights and optimizer state) bit for bit, the same metadata
  // but the run's output directory.
  const SafetensorsFile a = load_safetensors(full.out + "/model.safetensors");
  const SafetensorsFile b = load_safetensors(half.out + "/model.safetensors");
  REQUIRE(a.tensors.size() == b.tensors.size());
  for (std::size_t i = 0; i < a.tensors.size(); ++i) {
    CAPTURE(a.tensors[i].name);
    CHECK(a.tensors[i].name == b.tensors[i].name);
    CHECK(a.tensors[i].data == b.tensors[i].data);
  }
  for (const char* key : {"outliers", "optimizer_steps", "step", "rng_state"}) {
    CAPTURE(key);
    CHECK(a.metadata.at(key) == b.metadata.at(key));
  }
  // A resume whose checkpoint lost the detectors' state is refused, naming the file.
  SafetensorsFile tampered = b;
  tampered.metadata.erase("outliers");
  save_safetensors(half.out + "/model.safetensors", tampered.tensors, tampered.metadata);
  TrainConfig again = noisy_run(data, dir.file("split"), kThreshold);
  again.resume = half.out;
  again.steps = kSteps + 10;
  prepare_task(again);
  CHECK_THROWS_WITH_AS(train_model(again, kOneThread),
                       doctest::Contains("metadata lacks 'outliers'"), CheckpointError);
}
