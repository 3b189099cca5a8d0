// attnlab train and eval on the eval set as a user meets it: the set runs in chunks whose size
// changes no figure, text runs report bits per byte, and a resumed run keeps the saved run's
// threads, thread split and device unless the command line gives them.
#include <doctest/doctest.h>

#ifdef ATTNLAB_CLI_PATH

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <sstream>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "attnlab/app/run_checkpoint.hpp"
#include "attnlab/app/run_config.hpp"
#include "attnlab/io/safetensors.hpp"
#include "cli_runner.hpp"

namespace fs = std::filesystem;
using namespace attnlab::test;

namespace {

// The values of one metrics.csv column, by its header name.
std::vector<std::string> column(const std::string& csv, const std::string& name) {
  std::istringstream in(csv);
  std::string line, cell;
  std::getline(in, line);
  std::istringstream header(line);
  std::size_t index = 0, at = std::string::npos;
  for (; std::getline(header, cell, ','); ++index)
    if (cell == name) at = index;
  std::vector<std::string> values;
  while (std::getline(in, line)) {
    std::istringstream row(line);
    for (std::size_t i = 0; std::getline(row, cell, ','); ++i)
      if (i == at) values.push_back(cell);
  }
  return values;
}

// Two metrics.csv texts with the same header and rows whose cells agree to `rel` (NaN with NaN):
// the figures of one run written twice, equal but for the last printed digit, which a value on a
// rounding boundary may flip when the sums run in another order.
void check_same_figures(const std::string& a, const std::string& b, double rel) {
  std::istringstream in_a(a), in_b(b);
  std::string line_a, line_b;
  REQUIRE(std::getline(in_a, line_a));
  REQUIRE(std::getline(in_b, line_b));
  CHECK(line_a == line_b);  // the header
  std::size_t rows = 0;
  while (std::getline(in_a, line_a)) {
    REQUIRE(std::getline(in_b, line_b));
    std::istringstream cells_a(line_a), cells_b(line_b);
    std::string x, y;
    while (std::getline(cells_a, x, ',')) {
      REQUIRE(std::getline(cells_b, y, ','));
      const double u = std::stod(x), v = std::stod(y);
      if (std::isnan(u) || std::isnan(v)) {
        CHECK(std::isnan(u) == std::isnan(v));
        continue;
      }
      INFO("row " << rows << ": " << x << " vs " << y);
      CHECK(std::abs(u - v) <= rel * std::max(std::abs(u), std::abs(v)));
    }
    ++rows;
  }
  CHECK_FALSE(std::getline(in_b, line_b));
  CHECK(rows > 0);
}

}  // namespace

TEST_CASE(
    "cli: the eval set runs in chunks of --eval-batch rows, and text runs report bits per byte") {
  const auto dir = scratch("eval_chunks");
  const std::string excerpt = std::string(ATTNLAB_TEST_DATA_DIR) + "/text/hamlet_excerpt.txt";
  const std::string common = "train --task text --data '" + excerpt +
                             "' --causal --block 16 --d-model 16 --heads 2 --layers 2 --steps 20 "
                             "--batch 8 --eval-every 10 --eval-size 27 --threads 1 --quiet --out '";
  // The whole set in one forward (the old way), in chunks of --batch (the default), and in chunks
  // of 5 rows with a short last one: the same figures, to the last of their 7 printed digits (a
  // value on a rounding boundary may show ±1 there: seen once, in bits per byte, at -O1).
  REQUIRE(cli(common + (dir / "whole").string() + "' --eval-batch 27", dir).status == 0);
  REQUIRE(cli(common + (dir / "default").string() + "'", dir).status == 0);
  REQUIRE(cli(common + (dir / "five").string() + "' --eval-batch 5", dir).status == 0);
  const std::string whole = slurp(dir / "whole" / "metrics.csv");
  check_same_figures(whole, slurp(dir / "default" / "metrics.csv"), 2e-7);
  check_same_figures(whole, slurp(dir / "five" / "metrics.csv"), 2e-7);

  // Bits per byte: the excerpt is ASCII (one byte per character), so it is the loss over ln 2.
  const std::vector<std::string> loss = column(whole, "eval_loss"), bpb = column(whole, "eval_bpb");
  REQUIRE(loss.size() == 3);  // steps 0, 10, 20
  REQUIRE(bpb.size() == 3);
  for (std::size_t i = 0; i < loss.size(); ++i)
    CHECK(std::stod(bpb[i]) == doctest::Approx(std::stod(loss[i]) / std::log(2.0)).epsilon(1e-6));
  const auto summary = nlohmann::json::parse(slurp(dir / "whole" / "summary.json"));
  CHECK(summary["final_eval_bpb"].get<double>() ==
        doctest::Approx(summary["final_eval_loss"].get<double>() / std::log(2.0)));
  const std::string row = slurp(dir / "whole" / "metrics.jsonl");
  CHECK(row.find("\"eval_bpb\":") != std::string::npos);
  // A recall run has no text, so no bits per byte.
  REQUIRE(cli(std::string("train ") + kTinyRecall + " --steps 2 --out '" +
                  (dir / "recall").string() + "'",
              dir)
              .status == 0);
  CHECK(slurp(dir / "recall" / "metrics.csv").find("eval_bpb") == std::string::npos);
  CHECK_FALSE(
      nlohmann::json::parse(slurp(dir / "recall" / "summary.json")).contains("final_eval_bpb"));

  // eval goes through the set in chunks too, and says the same loss and bits per byte.
  const Run e = cli("eval --checkpoint '" + (dir / "five").string() + "' --show 1", dir);
  REQUIRE(e.status == 0);
  char expect[96];
  std::snprintf(expect, sizeof expect, "loss %.4f", summary["final_eval_loss"].get<double>());
  CHECK(e.out.find(expect) != std::string::npos);
  std::snprintf(expect, sizeof expect, "bits per byte %.4f",
                summary["final_eval_bpb"].get<double>());
  CHECK(e.out.find(expect) != std::string::npos);
  CHECK(e.out.find("27 examples") != std::string::npos);

  check_bad_input(common + (dir / "bad").string() + "' --eval-batch -1", dir, "--eval-batch");

  // A text run saved before metrics.csv had eval_bpb and the mechanism columns resumes with nan in
  // the rows it keeps.
  REQUIRE(cli(common + (dir / "old").string() + "' --stop-after 10", dir).status == 130);
  const fs::path csv = dir / "old" / "metrics.csv";
  const auto without_bpb = [](const std::string& text) {  // drops the columns after jacobian_mean
    std::string out;
    std::istringstream in(text);
    std::size_t last = 0;  // jacobian_mean's index, from the header
    for (std::string line; std::getline(in, line); out += '\n') {
      std::istringstream cells(line);
      std::vector<std::string> kept;
      for (std::string cell; std::getline(cells, cell, ',');) kept.push_back(cell);
      if (last == 0)
        last = static_cast<std::size_t>(std::find(kept.begin(), kept.end(), "jacobian_mean") -
                                        kept.begin());
      for (std::size_t i = 0; i <= last && i < kept.size(); ++i) out += (i ? "," : "") + kept[i];
    }
    return out;
  };
  attnlab::write_file_atomic(csv.string(), std::string_view(without_bpb(slurp(csv))));
  REQUIRE(slurp(csv).find("eval_bpb") == std::string::npos);
  REQUIRE(cli("train --quiet --resume '" + (dir / "old").string() + "'", dir).status == 0);
  const std::string resumed = slurp(csv);
  const std::vector<std::string> kept_bpb = column(resumed, "eval_bpb");
  REQUIRE(kept_bpb.size() == 3);
  CHECK(kept_bpb[0] == "nan");  // steps 0 and 10: kept from the old file
  CHECK(kept_bpb[1] == "nan");
  const std::vector<std::string> kept_q = column(resumed, "l0h0_q_norm");
  REQUIRE(kept_q.size() == 3);
  CHECK(kept_q[1] == "nan");
  CHECK(std::stod(kept_q[2]) > 0);
  CHECK(std::stod(kept_bpb[2]) ==
        doctest::Approx(std::stod(column(resumed, "eval_loss")[2]) / std::log(2.0)).epsilon(1e-6));
  const std::vector<std::string> resumed_loss = column(resumed, "eval_loss"),
                                 whole_loss = column(whole, "eval_loss");
  REQUIRE(resumed_loss.size() == whole_loss.size());
  for (std::size_t i = 0; i < whole_loss.size(); ++i)
    CHECK(std::stod(resumed_loss[i]) == doctest::Approx(std::stod(whole_loss[i])).epsilon(2e-7));
}

TEST_CASE("cli: resume keeps the saved run's threads unless given, and says when they differ") {
  const auto dir = scratch("resume_threads");
  // kTinyRecall without its --threads 1: the resumed run must learn the count from the checkpoint.
  const std::string flags =
      "--task recall --keys 8 --values 8 --pairs 4 --d-model 16 --heads 2 --batch 16 "
      "--eval-size 64 --quiet --steps 40 --eval-every 5 --lr 0.01 --seed 4";
  REQUIRE(
      cli("train " + flags + " --threads 1 --out '" + (dir / "full").string() + "'", dir).status ==
      0);
  const Run first = cli(
      "train " + flags + " --threads 1 --stop-after 20 --out '" + (dir / "split").string() + "'",
      dir);
  REQUIRE(first.status == 130);
  const std::string path = (dir / "split" / "model.safetensors").string();
  const auto saved = attnlab::app::read_run_context(attnlab::app::read_run_meta(path), path);
  REQUIRE(saved.has_value());
  CHECK(saved->threads == 1);
  CHECK(saved->device == attnlab::app::Backend::cpu);

  // Resumed with no --threads: the saved 1 thread, not the machine's default, and no warning.
  fs::copy(dir / "split", dir / "split2", fs::copy_options::recursive);
  const Run second = cli("train --quiet --resume '" + (dir / "split").string() + "'", dir);
  REQUIRE(second.status == 0);
  CHECK(second.err.empty());
  CHECK(slurp(dir / "full" / "metrics.csv") == slurp(dir / "split" / "metrics.csv"));
  const std::string resaved = (dir / "split" / "model.safetensors").string();
  CHECK(attnlab::app::read_run_context(attnlab::app::read_run_meta(resaved), resaved)->threads ==
        1);

  // Given with another value, the flag wins and the user is told the results will differ.
  const Run other =
      cli("train --quiet --resume '" + (dir / "split2").string() + "' --threads 2", dir);
  REQUIRE(other.status == 0);
  CHECK(other.err.find("attnlab: warning: train: resuming with --threads 2 (the saved run's: 1)") !=
        std::string::npos);
  CHECK(other.err.find("last digits") != std::string::npos);
}

#endif  // ATTNLAB_CLI_PATH
