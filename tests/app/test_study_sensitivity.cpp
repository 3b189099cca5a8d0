// The study summary's LR sensitivity per seed, split at each seed's best LR, and its classification
// of the runs that do not work, on synthetic runs whose answers are worked out by hand below.
#include <doctest/doctest.h>

#include <cmath>
#include <fstream>
#include <string>
#include <string_view>
#include <vector>

#include "attnlab/app/summary.hpp"
#include "temp_dir.hpp"

using namespace attnlab;
using namespace attnlab::app;

namespace {

RunRecord run(const std::string& mode, double lr, int seed, double init, double final_loss,
              bool diverged = false) {
  RunRecord r;
  r.group = "recall/adamw";
  r.mode = mode;
  r.d_k = 64;
  r.lr = lr;
  r.seed = seed;
  r.steps = 400;
  r.init_eval_loss = init;
  r.final_eval_loss = final_loss;
  r.diverged = diverged;
  r.final_eval_acc = 0.5;
  // A recall run: a loss this low reached the accuracy bar (as mark_working would set it).
  r.steps_to_target = !diverged && final_loss < 0.1 ? 200 : -1;
  r.works = r.steps_to_target >= 0;
  r.dir = "runs/" + mode + "_s" + std::to_string(seed);
  return r;
}

const std::vector<double> kLrs = {1e-3, 1e-2, 1e-1, 1.0};

// One cell (sqrt_dk, d_k 64, 400 steps), 3 seeds × 4 LRs. Capped at each seed's loss_init:
//   seed 0, init 3.0: 2.0, 0.5, 1.0, NaN (diverged → 3.0). Best: lr 1e-2 (0.5).
//     below = 1.5 / 4 = 0.375, above = (0.5 + 2.5) / 4 = 0.75, total 1.125
//   seed 1, init 3.2: 1.0, 0.2, 0.1 but diverged (→ 3.2), 0.4. Best: lr 1e-2 (0.2).
//     below = 0.8 / 4 = 0.2, above = (3.0 + 0.2) / 4 = 0.8, total 1.0
//   seed 2, init 2.8: 0.3, 0.9, 0.3, 3.5 (above init → 2.8). A tie at 1e-3 and 1e-1: best 1e-3.
//     below = 0, above = (0.6 + 0 + 2.5) / 4 = 0.775, total 0.775
//     (the largest-LR rule would give below 0.15, above 0.625)
// Means over seeds: total 2.9 / 3, below 0.575 / 3, above 2.325 / 3.
std::vector<RunRecord> sensitivity_cell() {
  const double nan = std::nan("");
  const std::vector<std::vector<double>> losses = {
      {2.0, 0.5, 1.0, nan}, {1.0, 0.2, 0.1, 0.4}, {0.3, 0.9, 0.3, 3.5}};
  const std::vector<double> inits = {3.0, 3.2, 2.8};
  std::vector<RunRecord> runs;
  for (int seed = 0; seed < 3; ++seed)
    for (std::size_t i = 0; i < kLrs.size(); ++i) {
      const double l = losses[seed][i];
      const bool diverged = std::isnan(l) || (seed == 1 && i == 2);
      runs.push_back(run("sqrt_dk", kLrs[i], seed, inits[seed], l, diverged));
    }
  return runs;
}

const ReportTable& table(const std::vector<ReportSection>& sections, std::string_view prefix) {
  for (const auto& s : sections)
    for (const auto& t : s.tables)
      if (t.title.rfind(prefix, 0) == 0) return t;
  FAIL("no table " << prefix);
  throw 0;  // unreachable
}

}  // namespace

TEST_CASE("study summary: lr_sensitivity_split of one grid adds up to lr_sensitivity") {
  const double nan = std::nan("");
  const SensitivitySplit s = lr_sensitivity_split({2.0, 0.5, 1.0, nan}, 3.0);
  CHECK(s.best == 1);
  CHECK(s.below == doctest::Approx(0.375).epsilon(1e-12));
  CHECK(s.above == doctest::Approx(0.75).epsilon(1e-12));
  CHECK(s.total == doctest::Approx(1.125).epsilon(1e-12));
  CHECK(std::fabs(s.below + s.above - s.total) < 1e-12);
  CHECK(std::fabs(s.total - lr_sensitivity({2.0, 0.5, 1.0, nan}, 3.0)) < 1e-12);

  // Every LR at or above loss_init: no LR helps, so nothing is lost by missing the best one.
  const SensitivitySplit flat = lr_sensitivity_split({3.1, nan, 3.0}, 3.0);
  CHECK(flat.best == 0);
  CHECK(flat.total == 0.0);
  CHECK(lr_sensitivity_split({}, 3.0).total == 0.0);
}

TEST_CASE("study summary: on a tie the best LR is the smallest, which decides the split") {
  // Losses 0.3 at the first and third LR: the second and fourth LR lie above the optimum.
  const SensitivitySplit s = lr_sensitivity_split({0.3, 0.9, 0.3, 3.5}, 2.8);
  CHECK(s.best == 0);
  CHECK(std::fabs(s.below - 0.0) < 1e-12);
  CHECK(std::fabs(s.above - 0.775) < 1e-12);
  CHECK(std::fabs(s.total - 0.775) < 1e-12);
  // A tie placed after a worse LR: the LR between the two tied ones is above the optimum.
  const SensitivitySplit t = lr_sensitivity_split({1.3, 0.5, 0.9, 0.5}, 2.0);
  CHECK(t.best == 1);
  CHECK(std::fabs(t.below - 0.8 / 4) < 1e-12);
  CHECK(std::fabs(t.above - 0.4 / 4) < 1e-12);
}

TEST_CASE(
    "study summary: LR sensitivity per seed over 3 seeds, split below and above each seed's "
    "best LR, a diverged run counted as its loss at initialisation") {
  const std::vector<RunRecord> runs = sensitivity_cell();
  const SensitivityStat s = sensitivity_stat(runs, {"recall/adamw", 400, "sqrt_dk", 64});
  CHECK(s.seeds == 3);
  CHECK(std::fabs(s.total - 2.9 / 3) < 1e-12);
  CHECK(std::fabs(s.below - 0.575 / 3) < 1e-12);
  CHECK(std::fabs(s.above - 2.325 / 3) < 1e-12);
  CHECK(std::fabs(s.below + s.above - s.total) < 1e-12);
  REQUIRE(s.best_lr.size() == 3);
  CHECK(s.best_lr[0] == 1e-2);
  CHECK(s.best_lr[1] == 1e-2);  // not 1e-1, whose loss 0.1 came from a diverged run
  CHECK(s.best_lr[2] == 1e-3);  // the tie's smaller LR
  // Bootstrap intervals over the 3 seeds' values: inside their range, around the mean.
  CHECK(s.below_ci.lo >= 0.0);
  CHECK(s.below_ci.lo <= s.below);
  CHECK(s.below_ci.hi >= s.below);
  CHECK(s.below_ci.hi <= 0.375);
  CHECK(s.above_ci.lo >= 0.75 - 1e-12);
  CHECK(s.above_ci.hi <= 0.8 + 1e-12);
  CHECK(s.total_ci.lo >= 0.775 - 1e-12);
  CHECK(s.total_ci.hi <= 1.125 + 1e-12);

  // The table shows them, beside the sensitivity of the seed-mean losses.
  const auto sections = summary_sections(runs);
  const ReportTable& t = table(sections, "LR sensitivity");
  REQUIRE(t.rows.size() == 1);
  REQUIRE(t.header.size() == t.rows[0].size());
  const auto cell = [&](const std::string& column) {
    for (std::size_t i = 0; i < t.header.size(); ++i)
      if (t.header[i] == column) return t.rows[0][i];
    FAIL("no column " << column);
    return std::string();
  };
  // Each cell opens with its mean in %.3f (then its interval): std::stod reads that number, within
  // the rounding.
  CHECK(std::fabs(std::stod(cell("per seed")) - 2.9 / 3) <= 5e-4 + 1e-12);
  CHECK(cell("per seed").find(" [") != std::string::npos);
  CHECK(std::fabs(std::stod(cell("below optimum")) - 0.575 / 3) <= 5e-4 + 1e-12);
  CHECK(std::fabs(std::stod(cell("above optimum")) - 2.325 / 3) <= 5e-4 + 1e-12);
  CHECK(cell("best LR per seed") == "0.001 (1/3), 0.01 (2/3)");
  // From the seed-mean losses per LR (a diverged run as its loss_init, the 3.5 uncapped), with
  // loss_init 3.0 (the mean): 1.1, 0.5333, (1.0 + 3.2 + 0.3) / 3 = 1.5, (3.0 + 0.4 + 3.5) / 3 =
  // 2.3, so (0.5667 + 0 + 0.9667 + 1.7667) / 4 = 0.825: not the per-seed 0.967.
  CHECK(std::fabs(std::stod(cell("LR sensitivity")) - 0.825) <= 5e-4 + 1e-12);
}

TEST_CASE(
    "study summary: runs that do not work are diverged, saturated, stalled or slow, and the "
    "table counts them from the records and from summary.csv read back") {
  // init 4: 0.97 × 4 is exact in binary, so the run on the stall bar stays on it in summary.csv.
  const double init = 4.0, nan = std::nan("");
  std::vector<RunRecord> runs = {
      run("sqrt_dk", 1e-3, 0, init, 0.01),                   // works
      run("sqrt_dk", 1e-3, 1, init, 0.92 * init),            // slow: failed, 8% below init
      run("sqrt_dk", 1e-3, 2, init, 0.98 * init),            // stalled
      run("sqrt_dk", 1e-2, 0, init, kStallFraction * init),  // stalled: on the bar
      run("sqrt_dk", 1e-2, 1, init, nan, true),              // diverged: non-finite
      run("sqrt_dk", 1e-2, 2, init, init + 10.5),            // diverged: past the margin
      run("sqrt_dk", 1e-1, 0, init, 0.5 * init, true),       // diverged: the flag
  };
  CHECK(failure_kind(runs[0]) == FailureKind::none);
  CHECK(failure_kind(runs[1]) == FailureKind::slow);
  CHECK(failure_kind(runs[2]) == FailureKind::stalled);
  CHECK(failure_kind(runs[3]) == FailureKind::stalled);
  CHECK(failure_kind(runs[4]) == FailureKind::diverged);
  CHECK(failure_kind(runs[5]) == FailureKind::diverged);
  CHECK(failure_kind(runs[6]) == FailureKind::diverged);
  // Worse than at initialisation but within kDivergenceMargin: stalled, not diverged (the success
  // table, which counts run_diverged, says the same).
  CHECK(failure_kind(run("sqrt_dk", 1e-2, 2, init, 4.2)) == FailureKind::stalled);
  CHECK_FALSE(run_diverged(run("sqrt_dk", 1e-2, 2, init, init + 10)));
  // Just under the stall bar is slow; so is a run under the failure bar that does not work, and a
  // working run is none.
  CHECK(failure_kind(run("sqrt_dk", 1, 0, init, 0.969 * init)) == FailureKind::slow);
  CHECK(failure_kind(run("sqrt_dk", 1, 0, init, 0.5 * init)) == FailureKind::slow);
  RunRecord working = run("sqrt_dk", 1, 0, init, 0.5 * init);
  working.works = true;
  CHECK(failure_kind(working) == FailureKind::none);

  const auto rows_of = [](const std::vector<RunRecord>& rs) {
    return table(summary_sections(rs), "How runs fail").rows;
  };
  const auto rows = rows_of(runs);
  REQUIRE(rows.size() == 1);
  // No run here logged layer 0's figures: `—`.
  CHECK(rows[0] == std::vector<std::string>{"sqrt_dk", "64", "6/7", "3 (50%)", "0 (0%)", "2 (33%)",
                                            "1 (17%)", "—", "—"});

  // --report-only reads summary.csv: the same table from the file.
  const test::TempDir dir;
  const std::string csv = dir.file("summary.csv");
  std::ofstream(csv) << summary_csv(runs);
  std::vector<RunRecord> read_back = read_summary_csv(csv);
  mark_working(read_back);  // `works` is not in the file: the study sets it after reading
  CHECK(rows_of(read_back) == rows);
  // And the sensitivity cell's split too.
  const std::vector<RunRecord> cell = sensitivity_cell();
  std::ofstream(csv) << summary_csv(cell);
  const SensitivityStat back =
      sensitivity_stat(read_summary_csv(csv), {"recall/adamw", 400, "sqrt_dk", 64});
  CHECK(std::fabs(back.below - 0.575 / 3) < 1e-12);
  CHECK(std::fabs(back.above - 2.325 / 3) < 1e-12);
}

TEST_CASE("study summary: summary.csv keeps an empty directory cell and quotes one with a comma") {
  std::vector<RunRecord> runs = {run("sqrt_dk", 1e-3, 0, 3.0, 1.0),
                                 run("inv_dk", 1e-2, 1, 3.0, 2.0), run("none", 1e-1, 2, 3.0, 2.5)};
  runs[0].dir = "";                         // a run without a directory: an empty last cell
  runs[1].dir = "out/a,b";                  // a comma
  runs[2].dir = "out/say \"hi\", then go";  // a quote and a comma
  const std::string text = summary_csv(runs);
  CHECK(text.find(",\"out/a,b\"\n") != std::string::npos);
  CHECK(text.find(",\"out/say \"\"hi\"\", then go\"\n") != std::string::npos);
  const test::TempDir dir;
  const std::string csv = dir.file("summary.csv");
  std::ofstream(csv) << text;
  const std::vector<RunRecord> back = read_summary_csv(csv);
  REQUIRE(back.size() == 3);
  for (std::size_t i = 0; i < 3; ++i) {
    CHECK(back[i].dir == runs[i].dir);
    CHECK(back[i].mode == runs[i].mode);
    CHECK(back[i].lr == doctest::Approx(runs[i].lr));
  }
  // A quote left open is named with its line.
  std::ofstream(csv) << text << "recall/adamw,none,64,0.1,3,400,3,2,0.5,0,0,0,0,0,1,1,0.5,\"open\n";
  CHECK_THROWS_WITH_AS(read_summary_csv(csv), doctest::Contains("line 5: expected a closing quote"),
                       std::invalid_argument);
}

TEST_CASE("study summary: the magnitude table gives each arm's s·√d_k, window and its change") {
  // LRs 1e-3, 1e-2, 1e-1 (1 decade apart), 2 seeds. sqrt_dk works at all three LRs at d_k 16 and
  // at one at d_k 256 (3 → 1 decades, change −2); dk_x8 works at two at every d_k (change 0).
  const std::vector<double> lrs = {1e-3, 1e-2, 1e-1};
  std::vector<RunRecord> runs;
  const auto add = [&](const std::string& mode, int d_k, int working) {
    for (int seed = 0; seed < 2; ++seed)
      for (int i = 0; i < 3; ++i) {
        RunRecord r = run(mode, lrs[i], seed, 3.0, i < working ? 0.1 : 2.9);
        r.d_k = d_k;
        r.works = i < working;
        runs.push_back(r);
      }
  };
  for (int d : {16, 64, 256}) {
    add("sqrt_dk", d, d == 16 ? 3 : d == 64 ? 2 : 1);
    add("dk_x8", d, 2);
    add("qk_norm", d, 3);  // not a fixed scale: no row
  }
  const std::vector<ReportSection> sections = summary_sections(runs);
  const ReportTable& t = table(sections, "Scale, LR window");
  REQUIRE(t.rows.size() == 2);
  CHECK(t.rows[0] ==
        std::vector<std::string>{"sqrt_dk", "1, 1, 1", "3.00, 2.00, 1.00", "-2.00", t.rows[0][4]});
  // 8/d_k: 8/√16 = 2, 8/√64 = 1, 8/√256 = 0.5.
  CHECK(t.rows[1] ==
        std::vector<std::string>{"dk_x8", "2, 1, 0.5", "2.00, 2.00, 2.00", "+0.00", t.rows[1][4]});
  // The sensitivity column is sensitivity_stat's total per d_k.
  std::string sens;
  for (int d : {16, 64, 256}) {
    sens += (sens.empty() ? "" : ", ");
    char buf[32];
    std::snprintf(buf, sizeof buf, "%.3f",
                  sensitivity_stat(runs, {"recall/adamw", 400, "sqrt_dk", d}).total);
    sens += buf;
  }
  CHECK(t.rows[0][4] == sens);

  // Without an arm named <mode>_x<c>, no such section.
  std::vector<RunRecord> plain;
  for (const auto& r : runs)
    if (r.mode != "dk_x8") plain.push_back(r);
  for (const auto& sec : summary_sections(plain))
    CHECK(sec.heading.find("the exponent or the magnitude") == std::string::npos);
}

TEST_CASE(
    "study summary: a run whose layer-0 attention collapsed is saturated, below the failure bar "
    "too, and only with both the logit growth and the entropy drop") {
  const double init = 4.0, nan = std::nan("");
  // Layer 0 at step 0: max logit 5, entropy 2. A recall run on the ln 32 plateau (3.47 < 0.9 ×
  // init: not failed, and not working).
  const auto with_layer0 = [&](double final_loss, double end_logit, double end_entropy) {
    RunRecord r = run("sqrt_dk", 0.3, 0, init, final_loss);
    r.layer0_init = {5.0, 2.0, 1.0, 1.0};
    r.layer0_final = {end_logit, end_entropy, 3.0, 3.0};
    return r;
  };
  CHECK(!run_failed(with_layer0(3.47, 5e4, 1e-3)));
  CHECK(failure_kind(with_layer0(3.47, 5e4, 1e-3)) == FailureKind::saturated);
  // On both bars: logits 5 → 50 (10×), entropy 1.25 → 0.125 (0.1 × 1.25 rounds to 0.125).
  RunRecord on_bars = with_layer0(3.47, 50.0, 0.125);
  on_bars.layer0_init.entropy = 1.25;
  CHECK(failure_kind(on_bars) == FailureKind::saturated);
  // Either bar missed: not saturated (a slow or stalled run by its loss).
  CHECK(failure_kind(with_layer0(3.47, 49.0, 1e-3)) == FailureKind::slow);
  CHECK(failure_kind(with_layer0(3.47, 5e4, 0.21)) == FailureKind::slow);
  CHECK(failure_kind(with_layer0(3.95, 5e4, 0.21)) == FailureKind::stalled);
  // Collapsed and within 3% of init: saturated comes first.
  CHECK(failure_kind(with_layer0(3.95, 5e4, 1e-3)) == FailureKind::saturated);
  // Diverged comes before saturated; no layer-0 figures: never saturated.
  CHECK(failure_kind(with_layer0(init + 10.5, 5e4, 1e-3)) == FailureKind::diverged);
  CHECK(failure_kind(with_layer0(4.5, 5e4, 1e-3)) == FailureKind::saturated);  // within the margin
  CHECK(failure_kind(with_layer0(3.47, nan, nan)) == FailureKind::slow);
  RunRecord no_start = with_layer0(3.47, 5e4, 1e-3);
  no_start.layer0_init = {};
  CHECK(failure_kind(no_start) == FailureKind::slow);
  // A working run is none whatever its attention did.
  RunRecord working = with_layer0(0.01, 5e4, 1e-3);
  CHECK(working.works);
  CHECK(failure_kind(working) == FailureKind::none);

  // The table: two saturated runs of three not working, one working.
  std::vector<RunRecord> cell = {with_layer0(3.47, 5e4, 1e-3), with_layer0(3.47, 6e4, 2e-3),
                                 with_layer0(3.5, 6.0, 1.9), working};
  for (int i = 0; i < 4; ++i) cell[i].seed = i;
  const auto rows = table(summary_sections(cell), "How runs fail").rows;
  REQUIRE(rows.size() == 1);
  CHECK(rows[0][2] == "3/4");
  CHECK(rows[0][4] == "2 (67%)");
  CHECK(rows[0][6] == "1 (33%)");
}

TEST_CASE(
    "study summary: layer 0's figures go through summary.csv, and the failure table gives "
    "their medians over the failing runs") {
  const double init = 4.0, nan = std::nan("");
  std::vector<RunRecord> runs = {run("sqrt_dk", 1e-3, 0, init, 0.01),  // works: not in the medians
                                 run("sqrt_dk", 1e-2, 0, init, 3.9),   // stalled
                                 run("sqrt_dk", 1e-2, 1, init, 3.95),  // saturated (below)
                                 run("sqrt_dk", 1e-1, 0, init, nan, true)};  // diverged
  const double end_logit[] = {1.0, 20.0, 40.0, nan}, end_entropy[] = {2.0, 0.5, 0.25, nan};
  for (int i = 0; i < 4; ++i) {
    runs[i].layer0_init = {2.0 + i, 3.0, 1.5, 1.25};
    runs[i].layer0_final = {end_logit[i], end_entropy[i], 4.0 + i, 5.0};
  }
  // The failing runs: 3 of 4; logits at the end 20, 40 and NaN (left out): median 30; at step 0:
  // 3, 4, 5: median 4. Entropy 0.5 and 0.25: median 0.375 (3 at step 0).
  const auto rows = table(summary_sections(runs), "How runs fail").rows;
  REQUIRE(rows.size() == 1);
  // Run 1's logits grew 3 → 20 (6.7×): stalled; run 2's 4 → 40 (10×) with entropy 3 → 0.25
  // (0.083×): saturated.
  CHECK(rows[0][3] == "1 (33%)");
  CHECK(rows[0][4] == "1 (33%)");
  CHECK(rows[0][5] == "1 (33%)");
  CHECK(rows[0][7] == "30 (4)");
  CHECK(rows[0][8] == "0.375 (3)");

  const test::TempDir dir;
  const std::string csv = dir.file("summary.csv");
  runs[1].final_eval_bpb = 1.75;  // a text run's bits per byte travels too (NaN for the others)
  std::ofstream(csv) << summary_csv(runs);
  std::vector<RunRecord> back = read_summary_csv(csv);
  mark_working(back);
  REQUIRE(back.size() == 4);
  CHECK(back[1].final_eval_bpb == 1.75);
  CHECK(std::isnan(back[0].final_eval_bpb));
  CHECK(back[1].layer0_final.max_logit == 20.0);
  CHECK(back[2].layer0_init.max_logit == 4.0);
  CHECK(back[0].layer0_init.wk_norm == 1.25);
  CHECK(back[1].layer0_final.wq_norm == 5.0);
  CHECK(std::isnan(back[3].layer0_final.max_logit));
  CHECK(table(summary_sections(back), "How runs fail").rows == rows);

  // A summary written before these columns existed reads them as NaN.
  std::ofstream(csv)
      << "group,mode,d_k,lr,seed,steps,init_eval_loss,final_eval_loss,final_eval_acc,"
         "steps_to_95,failed,diverged,diverged_step,works,init_qk_var_ratio,init_jacobian,"
         "seconds,dir\n"
         "recall/adamw,sqrt_dk,64,0.01,0,400,4,3.9,0.1,-1,1,0,-1,0,1,0.2,1.5,runs/a\n";
  const std::vector<RunRecord> old = read_summary_csv(csv);
  REQUIRE(old.size() == 1);
  CHECK(std::isnan(old[0].layer0_init.max_logit));
  CHECK(std::isnan(old[0].layer0_final.wk_norm));
  CHECK(std::isnan(old[0].final_eval_bpb));
}
