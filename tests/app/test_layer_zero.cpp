// Layer 0's attention figures of a run (TrainResult::layer0_init / layer0_final, summary.json's
// "layer0", and the study's summary.csv columns): the values metrics.csv logs at step 0 and at the
// last eval, reduced over the heads as documented.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "attnlab/app/context.hpp"
#include "attnlab/app/trainer.hpp"
#include "temp_dir.hpp"

using namespace attnlab;
using attnlab::app::Context;

namespace {

std::vector<std::string> split(const std::string& line) {
  std::vector<std::string> cells;
  std::stringstream ss(line);
  for (std::string c; std::getline(ss, c, ',');) cells.push_back(c);
  return cells;
}

// The rows of a metrics.csv as maps from column to value.
std::vector<std::vector<std::pair<std::string, std::string>>> read_rows(const std::string& path) {
  std::ifstream in(path);
  std::string line;
  std::getline(in, line);
  const std::vector<std::string> header = split(line);
  std::vector<std::vector<std::pair<std::string, std::string>>> rows;
  while (std::getline(in, line)) {
    const std::vector<std::string> cells = split(line);
    std::vector<std::pair<std::string, std::string>> row;
    for (std::size_t i = 0; i < header.size() && i < cells.size(); ++i)
      row.emplace_back(header[i], cells[i]);
    rows.push_back(row);
  }
  return rows;
}

double cell(const std::vector<std::pair<std::string, std::string>>& row, const std::string& name) {
  for (const auto& [k, v] : row)
    if (k == name) return std::stod(v);
  FAIL("no column " << name);
  return 0;
}

}  // namespace

TEST_CASE("layer 0: the run's figures at step 0 and at the end are metrics.csv's, over its heads") {
  const test::TempDir dir;
  app::TrainConfig c;
  c.task.kind = app::TaskKind::recall;
  c.task.keys = 8;
  c.task.values = 8;
  c.task.pairs = 4;
  c.model.block.attention.d_model = 24;
  c.model.block.attention.heads = 3;
  c.model.layers = 2;
  c.lr = 3e-2;
  c.steps = 8;
  c.warmup = 0;
  c.batch = 8;
  c.eval_every = 4;
  c.eval_size = 16;
  c.progress = false;
  c.out = dir.file("run");
  const app::TrainResult r = app::train_model(c, Context{.threads = 1});
  REQUIRE(r.steps_done == 8);
  const auto rows = read_rows(c.out + "/metrics.csv");
  REQUIRE(rows.size() >= 2);
  const auto expect = [&](const app::LayerZeroStats& z,
                          const std::vector<std::pair<std::string, std::string>>& row) {
    double max_logit = 0, entropy = 0;
    for (int h = 0; h < 3; ++h) {
      max_logit = std::max(max_logit, cell(row, "l0h" + std::to_string(h) + "_max_logit"));
      entropy += cell(row, "l0h" + std::to_string(h) + "_entropy") / 3;
    }
    // metrics.csv prints 7 significant digits.
    CHECK(z.max_logit == doctest::Approx(max_logit).epsilon(1e-6));
    CHECK(z.entropy == doctest::Approx(entropy).epsilon(1e-6));
    CHECK(z.wq_norm == doctest::Approx(cell(row, "l0_wq_norm")).epsilon(1e-6));
    CHECK(z.wk_norm == doctest::Approx(cell(row, "l0_wk_norm")).epsilon(1e-6));
  };
  CHECK(cell(rows.front(), "step") == 0);
  CHECK(cell(rows.back(), "step") == 8);
  expect(r.layer0_init, rows.front());
  expect(r.layer0_final, rows.back());
  // Training moved them: the weights change, so do their norms.
  CHECK(r.layer0_final.wq_norm != r.layer0_init.wq_norm);
  CHECK(r.layer0_init.max_logit > 0);
  CHECK(r.layer0_init.entropy > 0);

  std::ifstream in(c.out + "/summary.json");
  const nlohmann::json j = nlohmann::json::parse(in);
  CHECK(j.at("layer0").at("init").at("max_logit").get<double>() == r.layer0_init.max_logit);
  CHECK(j.at("layer0").at("final").at("entropy").get<double>() == r.layer0_final.entropy);
  CHECK(j.at("layer0").at("final").at("wk_norm").get<double>() == r.layer0_final.wk_norm);
}
