// The study's report.html: self-contained, every table of summary.md, heatmaps whose rows sum to 1;
// and the summary's verdicts on synthetic runs whose answer is known.
#include <doctest/doctest.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <map>
#include <regex>
#include <sstream>

#include "attnlab/app/report.hpp"
#include "attnlab/app/study.hpp"
#include "temp_dir.hpp"

using namespace attnlab;
using namespace attnlab::app;

namespace {

std::string slurp(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

std::size_t count(const std::string& s, const std::string& what) {
  std::size_t n = 0;
  for (auto p = s.find(what); p != std::string::npos; p = s.find(what, p + 1)) ++n;
  return n;
}

// One synthetic run of a recall grid.
RunRecord run(const std::string& mode, int steps, double lr, int seed, bool solved) {
  RunRecord r;
  r.group = "recall/adamw";
  r.mode = mode;
  r.d_k = 64;
  r.lr = lr;
  r.seed = seed;
  r.steps = steps;
  r.init_eval_loss = 3.5;
  r.final_eval_loss = solved ? 0.01 : 3.4;
  r.final_eval_acc = solved ? 1.0 : 0.05;
  r.steps_to_target = solved ? steps / 2 : -1;
  r.init_jacobian = 0.5;
  return r;
}

// The micro study's options: into DIR/study, 2 jobs, quiet.
StudyOptions micro_options(const test::TempDir& dir) {
  StudyOptions options;
  options.out = dir.file("study");
  options.jobs = 2;
  options.progress = false;
  return options;
}

}  // namespace

TEST_CASE(
    "study report: the micro study's report.html is self-contained, has every table, and "
    "its heatmaps' rows sum to 1") {
  const test::TempDir dir;
  const StudyOutcome outcome = run_study(study_preset("micro"), micro_options(dir), Context{});
  const std::string html = slurp(outcome.report_html);
  REQUIRE_FALSE(html.empty());

  // Self-contained: nothing fetched. Every image is a data URI; no scripts, styles or links from
  // elsewhere; not even a namespace URL in the inline SVG.
  // (Searched outside the base64 payloads, where the letters h, t, p may meet by chance.)
  // (std::regex recurses per character: it overflows the stack on payloads this long.)
  std::string text;
  for (std::size_t p = 0; p < html.size();) {
    const std::size_t d = html.find("data:", p);
    text += html.substr(p, d == std::string::npos ? std::string::npos : d - p);
    if (d == std::string::npos) break;
    p = html.find('"', d);
    if (p == std::string::npos) break;
  }
  CHECK(text.find("http") == std::string::npos);
  CHECK(html.find("<script") == std::string::npos);
  CHECK(html.find("<link") == std::string::npos);
  CHECK(html.find("url(") == std::string::npos);
  const std::size_t images = count(html, "<img ");
  CHECK(images == count(html, "<img alt=\""));
  CHECK(count(html, "src=\"data:image/svg+xml;base64,") == images);
  CHECK(count(html, "src=") == images);
  if (outcome.plot_error.empty()) {  // gnuplot rendered every figure: all are embedded
    CHECK(images == outcome.plots.size());
    CHECK(html.find("class=\"missing\"") == std::string::npos);
  }

  // Every table of summary.md, under the same title, with its rows.
  const std::string md = slurp(outcome.summary_md);
  const auto sections = summary_sections(outcome.runs);
  REQUIRE_FALSE(sections.empty());
  for (const auto& s : sections)
    for (const auto& t : s.tables) {
      CAPTURE(t.title);
      CHECK(html.find("data-title=\"" + html_escape(t.title) + "\"") != std::string::npos);
      CHECK(md.find("### " + t.title) != std::string::npos);
      CHECK_FALSE(t.rows.empty());
    }
  CHECK(count(html, "<table") == count(md, "\n### "));

  // Heatmaps: one at initialisation and one at the end per arm at the largest d_k; each row of
  // weights sums to 1; the recall task's correct key is marked in each.
  const std::regex svg_re("<svg class=\"heatmap[^\"]*\"[^>]*data-tq=\"(\\d+)\" data-tk=\"(\\d+)\"");
  const std::regex row_re("<g data-q=\"(\\d+)\"[^>]*data-w=\"([^\"]*)\"");
  std::size_t maps = 0;
  for (auto it = std::sregex_iterator(html.begin(), html.end(), svg_re);
       it != std::sregex_iterator(); ++it) {
    ++maps;
    const std::size_t begin = static_cast<std::size_t>(it->position());
    const std::string svg = html.substr(begin, html.find("</svg>", begin) - begin);
    const auto tq = std::stoul((*it)[1]), tk = std::stoul((*it)[2]);
    std::size_t rows = 0;
    for (auto r = std::sregex_iterator(svg.begin(), svg.end(), row_re); r != std::sregex_iterator();
         ++r, ++rows) {
      CHECK(std::stoul((*r)[1]) == rows);
      std::istringstream ws((*r)[2].str());
      double sum = 0, w = 0;
      std::size_t cells = 0;
      while (ws >> w) {
        CHECK(w >= 0.0);
        sum += w;
        ++cells;
      }
      CHECK(cells == tk);
      CHECK(sum == doctest::Approx(1.0).epsilon(1e-3));  // %.4g per weight
    }
    CHECK(rows == tq);
    CHECK(count(svg, "class=\"key\"") == 1);
  }
  CHECK(maps == 2 * 3);  // 3 arms × (init, final)
}

TEST_CASE(
    "study summary: a mode that fails at 400 steps and works at 1600 is 'rescued', and the "
    "window counts working LRs in decades") {
  const std::vector<double> lrs = {1e-3, 3.16e-3, 1e-2, 3.16e-2};
  std::vector<RunRecord> runs;
  for (int seed = 0; seed < 5; ++seed)
    for (double lr : lrs) {
      // "slow" solves nothing at 400 steps and solves at the two middle LRs at 1600 steps.
      runs.push_back(run("slow", 400, lr, seed, false));
      runs.push_back(run("slow", 1600, lr, seed, lr == 3.16e-3 || lr == 1e-2));
      // "fast" solves at the middle LRs at both budgets; "never" at neither.
      runs.push_back(run("fast", 400, lr, seed, lr == 3.16e-3 || lr == 1e-2));
      runs.push_back(run("fast", 1600, lr, seed, lr == 3.16e-3 || lr == 1e-2));
      runs.push_back(run("never", 400, lr, seed, false));
      runs.push_back(run("never", 1600, lr, seed, false));
      // "mixed" solves with seeds 0-2 only: 3/5 at its best LR, whose interval spans 1/2.
      runs.push_back(run("mixed", 400, lr, seed, false));
      runs.push_back(run("mixed", 1600, lr, seed, lr == 1e-2 && seed < 3));
    }
  mark_working(runs);
  const WindowStat w = window_stat(runs, {"recall/adamw", 1600, "slow", 64});
  CHECK(w.mean == doctest::Approx(1.0).epsilon(1e-3));  // two half-decade LRs (3.16 ≈ √10)
  CHECK(w.edges.lower);
  CHECK(w.edges.upper);
  CHECK(w.lo_lr == 3.16e-3);
  CHECK(w.hi_lr == 1e-2);
  CHECK(window_stat(runs, {"recall/adamw", 400, "never", 64}).mean == 0.0);

  const auto sections = summary_sections(runs);
  const ReportTable* budget = nullptr;
  for (const auto& s : sections)
    for (const auto& t : s.tables)
      if (t.title == "Budget") budget = &t;
  REQUIRE(budget != nullptr);
  std::map<std::string, std::string> verdict;
  for (const auto& row : budget->rows) verdict[row[0]] = row.back();
  CHECK(verdict["slow"] == "rescued by 1600 steps");
  CHECK(verdict["fast"] == "works at 400 steps");
  CHECK(verdict["never"] == "not rescued");
  CHECK(verdict["mixed"] == "fails at 400 steps, undecided at 1600 steps");
}

TEST_CASE(
    "study summary: without an accuracy target (text) a run works when its loss is within 5% "
    "of the best at its d_k and budget") {
  std::vector<RunRecord> runs;
  for (double loss : {2.0, 2.09, 2.2, std::nan("")}) {
    RunRecord r;
    r.group = "text/adamw";
    r.mode = "sqrt_dk";
    r.d_k = 16;
    r.lr = 1e-3 * (1 + static_cast<double>(runs.size()));
    r.steps = 150;
    r.has_target = false;
    r.init_eval_loss = 4.4;
    r.final_eval_loss = loss;
    r.diverged = std::isnan(loss);
    runs.push_back(r);
  }
  mark_working(runs);
  CHECK(runs[0].works);
  CHECK(runs[1].works);
  CHECK_FALSE(runs[2].works);
  CHECK_FALSE(runs[3].works);
}

TEST_CASE(
    "study report_study: a finished study's outputs are written again without training, the "
    "same as the first time") {
  const test::TempDir dir;
  const StudyOptions options = micro_options(dir);
  const StudyPlan plan = study_preset("micro");
  const StudyOutcome first = run_study(plan, options, Context{});
  const std::string md = slurp(first.summary_md), csv = slurp(first.summary_csv);
  const std::string html = slurp(first.report_html);
  std::filesystem::remove(first.summary_md);
  std::filesystem::remove(first.report_html);
  const StudyOutcome again = report_study(plan, options);
  CHECK(again.runs.size() == first.runs.size());
  CHECK(slurp(again.summary_md) == md);
  CHECK(slurp(again.summary_csv) == csv);
  CHECK(slurp(again.report_html) == html);  // the wall time comes from study.json

  // A plan without the study's group, and a malformed summary, are clear errors.
  StudyPlan other = plan;
  other.groups[0].name = "other";
  CHECK_THROWS_WITH_AS(report_study(other, options), doctest::Contains("group 'recall/adamw'"),
                       std::invalid_argument);
  std::ofstream(first.summary_csv, std::ios::app) << "recall/adamw,none,16\n";
  CHECK_THROWS_WITH_AS(report_study(plan, options), doctest::Contains("summary.csv: line 14"),
                       std::invalid_argument);
}
