#include "attnlab/app/summary.hpp"

#include "attnlab/app/proxy_checks.hpp"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <limits>
#include <map>
#include <optional>
#include <set>
#include <sstream>
#include <stdexcept>
#include <tuple>

namespace attnlab::app {

namespace {

std::string fmt(const char* f, double x) {
  char buf[64];
  std::snprintf(buf, sizeof buf, f, x);
  return buf;
}

int mode_rank(const std::string& m) {
  static const std::vector<std::string> order = {"none",  "sqrt_dk_x0.25", "sqrt_dk", "dk",
                                                 "dk_x4", "dk_x8",         "qk_norm", "learnable"};
  const auto it = std::find(order.begin(), order.end(), m);
  return it == order.end() ? 100 : static_cast<int>(it - order.begin());
}

// A number in format f, or in %.3g when it is too large for f's fixed point to read well (an SGD
// run whose loss blew up to 1e24 without becoming non-finite).
std::string num(const char* f, double x) {
  return std::fabs(x) >= 1e5 ? fmt("%.3g", x) : fmt(f, x);
}

std::string with_ci(const char* f, double m, const Interval& ci) {
  if (!std::isfinite(ci.lo)) return num(f, m);
  return num(f, m) + " [" + num(f, ci.lo) + ", " + num(f, ci.hi) + "]";
}

std::string proportion(int k, int n) {
  const Interval w = wilson_interval(k, n);
  return std::to_string(k) + "/" + std::to_string(n) + " [" + fmt("%.2f", w.lo) + ", " +
         fmt("%.2f", w.hi) + "]";
}

// A group's budgets and d_k values, sorted.
template <class F>
std::vector<int> distinct(const std::vector<RunRecord>& runs, const std::string& group, F field) {
  std::set<int> s;
  for (const auto& r : runs)
    if (r.group == group) s.insert(field(r));
  return {s.begin(), s.end()};
}

bool group_has_target(const std::vector<RunRecord>& runs, const std::string& group) {
  for (const auto& r : runs)
    if (r.group == group) return r.has_target;
  return true;
}

int count_works(const std::vector<const RunRecord*>& rs) {
  int k = 0;
  for (const auto* r : rs) k += r->works ? 1 : 0;
  return k;
}

// At one budget, the best LR's success: "solves" when its Wilson interval lies above 1/2, "fails"
// when below.
struct BestCell {
  double lr = 0;
  int k = 0, n = 0;
  int verdict = 0;  // 1 solves, -1 fails, 0 undecided
};
BestCell best_cell(const std::vector<RunRecord>& runs, const CellKey& key,
                   const std::vector<double>& lrs) {
  BestCell b;
  double best_rate = -1, best_loss = std::numeric_limits<double>::infinity();
  for (double lr : lrs) {
    const auto rs = cell_runs(runs, key, lr);
    if (rs.empty()) continue;
    const int k = count_works(rs);
    const double rate = static_cast<double>(k) / static_cast<double>(rs.size());
    const double loss = loss_stat(rs).mean;
    if (rate > best_rate || (rate == best_rate && loss < best_loss)) {
      best_rate = rate;
      best_loss = loss;
      b.lr = lr;
      b.k = k;
      b.n = static_cast<int>(rs.size());
    }
  }
  if (b.n > 0) {
    const Interval w = wilson_interval(b.k, b.n);
    b.verdict = w.lo > 0.5 ? 1 : (w.hi < 0.5 ? -1 : 0);
  }
  return b;
}

}  // namespace

bool run_failed(const RunRecord& r) {
  return r.diverged || !std::isfinite(r.final_eval_loss) ||
         r.final_eval_loss >= kFailedFraction * r.init_eval_loss;
}

bool attention_collapsed(const RunRecord& r) {
  const LayerZeroStats &start = r.layer0_init, &end = r.layer0_final;
  // NaN compares false: a run without the figures is never called saturated.
  return start.max_logit > 0 && end.max_logit >= kSaturatedLogitGrowth * start.max_logit &&
         start.entropy > 0 && end.entropy <= kCollapsedEntropyFraction * start.entropy;
}

FailureKind failure_kind(const RunRecord& r) {
  if (r.works) return FailureKind::none;
  if (r.diverged || !std::isfinite(r.final_eval_loss) || r.final_eval_loss > r.init_eval_loss)
    return FailureKind::diverged;
  if (attention_collapsed(r)) return FailureKind::saturated;
  if (r.final_eval_loss >= kStallFraction * r.init_eval_loss) return FailureKind::stalled;
  return FailureKind::slow;
}

FailureCounts failure_counts(const std::vector<const RunRecord*>& runs) {
  FailureCounts c;
  for (const auto* r : runs) {
    ++c.runs;
    switch (failure_kind(*r)) {
      case FailureKind::none:
        continue;
      case FailureKind::diverged:
        ++c.diverged;
        break;
      case FailureKind::saturated:
        ++c.saturated;
        break;
      case FailureKind::stalled:
        ++c.stalled;
        break;
      case FailureKind::slow:
        ++c.slow;
        break;
    }
    ++c.failing;
  }
  return c;
}

double effective_loss(const RunRecord& r) {
  return r.diverged || !std::isfinite(r.final_eval_loss) ? r.init_eval_loss : r.final_eval_loss;
}

void mark_working(std::vector<RunRecord>& runs) {
  std::map<std::tuple<std::string, int, int>, double> best;  // (group, steps, d_k) -> best loss
  for (const auto& r : runs) {
    if (r.has_target || r.diverged || !std::isfinite(r.final_eval_loss)) continue;
    const auto key = std::make_tuple(r.group, r.steps, r.d_k);
    const auto it = best.find(key);
    if (it == best.end() || r.final_eval_loss < it->second) best[key] = r.final_eval_loss;
  }
  for (auto& r : runs) {
    if (r.has_target) {
      r.works = !r.diverged && r.steps_to_target >= 0;
    } else {
      const auto it = best.find(std::make_tuple(r.group, r.steps, r.d_k));
      r.works =
          !run_failed(r) && it != best.end() && r.final_eval_loss <= kTextWorkMargin * it->second;
    }
  }
}

double lr_sensitivity(const std::vector<double>& loss_per_lr, double loss_init) {
  if (loss_per_lr.empty()) return 0;
  double best = loss_init;
  for (double l : loss_per_lr) best = std::min(best, std::isfinite(l) ? l : loss_init);
  double sum = 0;
  for (double l : loss_per_lr) sum += std::min(std::isfinite(l) ? l : loss_init, loss_init) - best;
  return sum / static_cast<double>(loss_per_lr.size());
}

SensitivitySplit lr_sensitivity_split(const std::vector<double>& loss_per_lr, double loss_init) {
  SensitivitySplit s;
  if (loss_per_lr.empty()) return s;
  std::vector<double> capped;
  for (double l : loss_per_lr)
    capped.push_back(std::min(std::isfinite(l) ? l : loss_init, loss_init));
  for (std::size_t i = 1; i < capped.size(); ++i)
    if (capped[i] < capped[s.best]) s.best = i;  // strict: a tie keeps the smaller LR
  const double best = capped[s.best];
  double below = 0, above = 0;
  for (std::size_t i = 0; i < capped.size(); ++i)
    (i < s.best ? below : above) += capped[i] - best;  // the best LR's term is 0
  const double n = static_cast<double>(capped.size());
  s.below = below / n;
  s.above = above / n;
  s.total = s.below + s.above;
  return s;
}

std::vector<const RunRecord*> cell_runs(const std::vector<RunRecord>& runs, const CellKey& key,
                                        double lr) {
  std::vector<const RunRecord*> out;
  for (const auto& r : runs)
    if (r.group == key.group && r.steps == key.steps && r.mode == key.mode && r.d_k == key.d_k &&
        (lr < 0 || r.lr == lr))
      out.push_back(&r);
  return out;
}

LossStat loss_stat(const std::vector<const RunRecord*>& runs) {
  LossStat s;
  std::vector<double> x;
  for (const auto* r : runs) {
    x.push_back(effective_loss(*r));
    s.diverged += r->diverged ? 1 : 0;
  }
  s.n = static_cast<int>(x.size());
  s.mean = mean(x);
  s.ci = bootstrap_mean_interval(x);
  return s;
}

std::vector<double> sweep_lrs(const std::vector<RunRecord>& runs, const std::string& group,
                              int steps) {
  std::set<double> s;
  for (const auto& r : runs)
    if (r.group == group && (steps <= 0 || r.steps == steps)) s.insert(r.lr);
  return {s.begin(), s.end()};
}

std::vector<std::string> ordered_modes(const std::vector<RunRecord>& runs,
                                       const std::string& group) {
  std::set<std::string> set;
  for (const auto& r : runs)
    if (r.group == group) set.insert(r.mode);
  std::vector<std::string> v(set.begin(), set.end());
  std::stable_sort(v.begin(), v.end(), [](const std::string& a, const std::string& b) {
    return std::make_tuple(mode_rank(a), a) < std::make_tuple(mode_rank(b), b);
  });
  return v;
}

WindowStat window_stat(const std::vector<RunRecord>& runs, const CellKey& key) {
  WindowStat w;
  const std::vector<double> lrs = sweep_lrs(runs, key.group, key.steps);
  std::map<int, std::vector<bool>> per_seed;  // seed -> works per LR
  for (std::size_t i = 0; i < lrs.size(); ++i)
    for (const auto* r : cell_runs(runs, key, lrs[i])) {
      auto& v = per_seed[r->seed];
      v.resize(lrs.size(), false);
      v[i] = r->works;
      if (r->works) {
        w.lo_lr = w.lo_lr == 0 ? lrs[i] : std::min(w.lo_lr, lrs[i]);
        w.hi_lr = std::max(w.hi_lr, lrs[i]);
      }
    }
  if (lrs.size() < 2 || per_seed.empty()) return w;
  std::vector<double> widths;
  std::vector<std::vector<bool>> works;
  for (const auto& [seed, v] : per_seed) {
    widths.push_back(window_decades(lrs, v));
    works.push_back(v);
  }
  w.seeds = static_cast<int>(widths.size());
  w.mean = mean(widths);
  w.ci = bootstrap_mean_interval(widths);
  w.edges = window_edges(works);
  return w;
}

SensitivityStat sensitivity_stat(const std::vector<RunRecord>& runs, const CellKey& key) {
  SensitivityStat st;
  const std::vector<double> lrs = sweep_lrs(runs, key.group, key.steps);
  struct SeedGrid {
    std::vector<double> lrs, losses;
    double init = 0;
  };
  std::map<int, SeedGrid> per_seed;
  for (double lr : lrs)
    for (const auto* r : cell_runs(runs, key, lr)) {
      SeedGrid& g = per_seed[r->seed];
      if (!g.lrs.empty() && g.lrs.back() == lr) continue;  // one run per seed and LR
      g.lrs.push_back(lr);
      g.losses.push_back(effective_loss(*r));
      g.init += r->init_eval_loss;
    }
  std::vector<double> total, below, above;
  for (auto& [seed, g] : per_seed) {
    g.init /= static_cast<double>(g.lrs.size());
    const SensitivitySplit s = lr_sensitivity_split(g.losses, g.init);
    total.push_back(s.total);
    below.push_back(s.below);
    above.push_back(s.above);
    st.best_lr.push_back(g.lrs[s.best]);
  }
  st.seeds = static_cast<int>(total.size());
  if (total.empty()) return st;
  st.below = mean(below);
  st.above = mean(above);
  st.total = st.below + st.above;  // = mean(total), and adds up exactly
  st.total_ci = bootstrap_mean_interval(total);
  st.below_ci = bootstrap_mean_interval(below);
  st.above_ci = bootstrap_mean_interval(above);
  return st;
}

namespace {

// One CSV cell as RFC 4180 writes it: quoted, with quotes doubled, when it holds a comma, a quote
// or a line break (a run's directory may); as it is otherwise.
std::string csv_cell(const std::string& text) {
  if (text.find_first_of(",\"\r\n") == std::string::npos) return text;
  std::string out = "\"";
  for (const char c : text) {
    if (c == '"') out += '"';
    out += c;
  }
  return out + '"';
}

// The cells of one CSV line, as csv_cell writes them: every cell kept, an empty last one included.
std::vector<std::string> csv_cells(const std::string& line, const std::string& where) {
  std::vector<std::string> cells(1);
  bool quoted = false;
  for (std::size_t i = 0; i < line.size(); ++i) {
    const char c = line[i];
    if (quoted) {
      if (c != '"') {
        cells.back() += c;
      } else if (i + 1 < line.size() && line[i + 1] == '"') {
        cells.back() += '"';
        ++i;
      } else {
        quoted = false;
      }
    } else if (c == '"' && cells.back().empty()) {
      quoted = true;
    } else if (c == ',') {
      cells.emplace_back();
    } else {
      cells.back() += c;
    }
  }
  if (quoted) throw std::invalid_argument(where + ": expected a closing quote, got the line's end");
  return cells;
}

}  // namespace

std::string summary_csv(const std::vector<RunRecord>& runs) {
  std::ostringstream os;
  os << "group,mode,d_k,lr,seed,steps,init_eval_loss,final_eval_loss,final_eval_acc,"
        "steps_to_95,failed,diverged,diverged_step,works,init_qk_var_ratio,init_jacobian,"
        "l0_max_logit_init,l0_max_logit_final,l0_entropy_init,l0_entropy_final,l0_wq_norm_init,"
        "l0_wk_norm_init,l0_wq_norm_final,l0_wk_norm_final,seconds,dir\n";
  const auto g = [](double x) { return std::isfinite(x) ? fmt("%.6g", x) : std::string("nan"); };
  for (const auto& r : runs) {
    os << csv_cell(r.group) << ',' << csv_cell(r.mode) << ',' << r.d_k << ',' << fmt("%g", r.lr)
       << ',' << r.seed << ',' << r.steps << ',' << fmt("%.6g", r.init_eval_loss) << ','
       << (std::isfinite(r.final_eval_loss) ? fmt("%.6g", r.final_eval_loss) : "nan") << ','
       << fmt("%.4f", r.final_eval_acc) << ',' << r.steps_to_target << ','
       << (run_failed(r) ? 1 : 0) << ',' << (r.diverged ? 1 : 0) << ',' << r.diverged_step << ','
       << (r.works ? 1 : 0) << ',' << fmt("%.4f", r.init_qk_var_ratio) << ','
       << fmt("%.6g", r.init_jacobian) << ',' << g(r.layer0_init.max_logit) << ','
       << g(r.layer0_final.max_logit) << ',' << g(r.layer0_init.entropy) << ','
       << g(r.layer0_final.entropy) << ',' << g(r.layer0_init.wq_norm) << ','
       << g(r.layer0_init.wk_norm) << ',' << g(r.layer0_final.wq_norm) << ','
       << g(r.layer0_final.wk_norm) << ',' << fmt("%.2f", r.seconds) << ',' << csv_cell(r.dir)
       << '\n';
  }
  return os.str();
}

std::vector<RunRecord> read_summary_csv(const std::string& path) {
  std::ifstream in(path);
  if (!in) throw std::invalid_argument(path + ": cannot open the study's summary");
  std::string line;
  std::getline(in, line);
  const std::vector<std::string> header = csv_cells(line, path + ": line 1");
  const auto col = [&](const char* name) {
    const auto it = std::find(header.begin(), header.end(), name);
    if (it == header.end())
      throw std::invalid_argument(path + ": expected a column '" + name + "', the header is '" +
                                  line + "'");
    return static_cast<std::size_t>(it - header.begin());
  };
  const std::size_t c_group = col("group"), c_mode = col("mode"), c_dk = col("d_k"),
                    c_lr = col("lr"), c_seed = col("seed"), c_steps = col("steps"),
                    c_init = col("init_eval_loss"), c_final = col("final_eval_loss"),
                    c_acc = col("final_eval_acc"), c_target = col("steps_to_95"),
                    c_div = col("diverged"), c_div_step = col("diverged_step"),
                    c_var = col("init_qk_var_ratio"), c_jac = col("init_jacobian"),
                    c_sec = col("seconds"), c_dir = col("dir");
  // Layer 0's figures: columns that older summaries lack (then NaN).
  const auto optional_col = [&](const char* name) {
    const auto it = std::find(header.begin(), header.end(), name);
    return it == header.end() ? header.size() : static_cast<std::size_t>(it - header.begin());
  };
  const std::size_t c_l0[8] = {
      optional_col("l0_max_logit_init"), optional_col("l0_max_logit_final"),
      optional_col("l0_entropy_init"),   optional_col("l0_entropy_final"),
      optional_col("l0_wq_norm_init"),   optional_col("l0_wk_norm_init"),
      optional_col("l0_wq_norm_final"),  optional_col("l0_wk_norm_final")};
  std::vector<RunRecord> runs;
  for (int n = 2; std::getline(in, line); ++n) {
    if (line.empty()) continue;
    const std::vector<std::string> cells = csv_cells(line, path + ": line " + std::to_string(n));
    if (cells.size() != header.size())
      throw std::invalid_argument(path + ": line " + std::to_string(n) + ": expected " +
                                  std::to_string(header.size()) + " cells, got " +
                                  std::to_string(cells.size()));
    try {
      RunRecord r;
      r.group = cells[c_group];
      r.mode = cells[c_mode];
      r.d_k = std::stoi(cells[c_dk]);
      r.lr = std::stod(cells[c_lr]);
      r.seed = std::stoi(cells[c_seed]);
      r.steps = std::stoi(cells[c_steps]);
      r.init_eval_loss = std::stod(cells[c_init]);
      r.final_eval_loss = std::stod(cells[c_final]);  // "nan" reads as NaN
      r.final_eval_acc = std::stod(cells[c_acc]);
      r.steps_to_target = std::stoi(cells[c_target]);
      r.diverged = cells[c_div] == "1";
      r.diverged_step = std::stoi(cells[c_div_step]);
      r.init_qk_var_ratio = std::stod(cells[c_var]);
      r.init_jacobian = std::stod(cells[c_jac]);
      r.seconds = std::stod(cells[c_sec]);
      r.dir = cells[c_dir];
      double* l0[8] = {&r.layer0_init.max_logit, &r.layer0_final.max_logit, &r.layer0_init.entropy,
                       &r.layer0_final.entropy,  &r.layer0_init.wq_norm,    &r.layer0_init.wk_norm,
                       &r.layer0_final.wq_norm,  &r.layer0_final.wk_norm};
      for (int i = 0; i < 8; ++i)
        if (c_l0[i] < cells.size()) *l0[i] = std::stod(cells[c_l0[i]]);  // "nan" reads as NaN
      runs.push_back(std::move(r));
    } catch (const std::logic_error&) {
      throw std::invalid_argument(path + ": line " + std::to_string(n) +
                                  ": expected numbers, got '" + line + "'");
    }
  }
  return runs;
}

namespace {

// A group's grid as the tables lay it out: modes in report order, d_k values, budgets and seeds
// ascending, the swept LRs, and what "works" means for its task.
struct GroupGrid {
  std::string name;
  std::vector<std::string> modes;
  std::vector<int> dks, budgets, seeds;
  std::vector<double> lrs;
  bool target;  // the task has an accuracy target (else a run works by its final loss)
  std::string works_def;
  std::vector<std::string> lr_header;  // mode, d_k, then one column per LR
};

GroupGrid group_grid(const std::vector<RunRecord>& runs, const std::string& g) {
  GroupGrid grid;
  grid.name = g;
  grid.modes = ordered_modes(runs, g);
  grid.dks = distinct(runs, g, [](const RunRecord& r) { return r.d_k; });
  grid.budgets = distinct(runs, g, [](const RunRecord& r) { return r.steps; });
  grid.seeds = distinct(runs, g, [](const RunRecord& r) { return r.seed; });
  grid.lrs = sweep_lrs(runs, g);
  grid.target = group_has_target(runs, g);
  grid.works_def = grid.target ? "reached " + fmt("%.0f", 100 * kTargetAccuracy) + "% eval accuracy"
                               : "ended within " + fmt("%.0f", 100 * (kTextWorkMargin - 1)) +
                                     "% of the best final eval loss at its d_k and budget";
  grid.lr_header = {"mode", "d_k"};
  for (double lr : grid.lrs) grid.lr_header.push_back("lr " + fmt("%g", lr));
  return grid;
}

// The groups in the order of their first run.
std::vector<std::string> group_names(const std::vector<RunRecord>& runs) {
  std::vector<std::string> groups;
  for (const auto& r : runs)
    if (std::find(groups.begin(), groups.end(), r.group) == groups.end()) groups.push_back(r.group);
  return groups;
}

// A budget section's opening paragraph: the grid's size, the premise check and the definitions.
std::string budget_intro(const std::vector<RunRecord>& runs, const GroupGrid& grid, int steps) {
  double var = 0;
  int n = 0;
  for (const auto& r : runs)
    if (r.group == grid.name && r.steps == steps) {
      var += r.init_qk_var_ratio;
      ++n;
    }
  return std::to_string(grid.seeds.size()) + " seed(s) per cell, " +
         std::to_string(grid.lrs.size()) + " peak LRs, " + std::to_string(steps) +
         " steps per run, " + std::to_string(n) +
         " runs. Var(q·k)/d_k at step 0, mean over runs: " + fmt("%.3f", n ? var / n : 0) +
         " (the premise: q·k has variance ≈ d_k at initialisation). A run works when it " +
         grid.works_def + ". Intervals: 95% bootstrap over seeds for means, 95% Wilson for k/n.";
}

// The tables of one budget's section, one row per (mode, d_k) cell.
struct BudgetTables {
  ReportTable loss, reach, success, failures, window, sens, jac;
};

BudgetTables budget_tables(const GroupGrid& grid) {
  return {
      {"Final eval loss",
       "Mean over seeds [95% bootstrap interval]; a diverged seed counts as its "
       "loss at initialisation and is marked (k div); `div`: every seed diverged.",
       grid.lr_header,
       {}},
      {"Steps to " + fmt("%.0f", 100 * kTargetAccuracy) + "% eval accuracy",
       "Mean [95% bootstrap interval] over the seeds that reached it, with k/n "
       "seeds; `—`: no seed reached it.",
       grid.lr_header,
       {}},
      {"Success, failure and divergence over all LRs and seeds",
       "works: " + grid.works_def + "; failed: final eval loss ≥ " + fmt("%.1f", kFailedFraction) +
           " × the loss at initialisation, or diverged (a run that learned "
           "nothing at all); best LR: the LR with the most working seeds "
           "(ties: the lower mean loss). `works (all LRs)` pools LRs whose "
           "success rates differ: it describes the sweep and has no interval.",
       {"mode", "d_k", "works (all LRs)", "best LR", "works at best LR [Wilson]", "failed",
        "diverged"},
       {}},
      {"How runs fail",
       "Every run that does not work, over all LRs and seeds, by how it ended (failed or not: a "
       "run can plateau below the failure bar); the share is of those runs. diverged: a "
       "non-finite loss, or a final loss above the loss at initialisation; saturated: otherwise, "
       "layer 0's largest |scaled logit| ended ≥ " +
           fmt("%.0f", kSaturatedLogitGrowth) + "× its step-0 value and its attention entropy ≤ " +
           fmt("%.1f", kCollapsedEntropyFraction) +
           "× its step-0 entropy; stalled: otherwise a final loss ≥ " +
           fmt("%.2f", kStallFraction) + " × the loss at initialisation; slow: the rest, ended " +
           "more than " + fmt("%.0f", 100 * (1 - kStallFraction)) +
           "% below the loss at initialisation but short of the bar. Layer 0 at the last eval, "
           "median over those runs that logged it: its largest |scaled logit| over heads and its "
           "heads' mean attention entropy (nats), beside the same medians at step 0. `—`: none "
           "of them logged it (summaries written before it was).",
       {"mode", "d_k", "failing runs", "diverged", "saturated", "stalled", "slow",
        "max logit at end (at step 0)", "entropy at end (at step 0)"},
       {}},
      {"LR window",
       "Width: the working LRs of each seed × the grid spacing, in decades; mean "
       "over seeds [95% bootstrap]. An edge is seen when the grid's end LR fails "
       "for every seed: without both, the true window may be wider.",
       {"mode", "d_k", "width (decades)", "working LRs", "lower edge seen", "upper edge seen"},
       {}},
      {"LR sensitivity (Wortsman et al. 2023, arXiv 2309.14322)",
       "E over the LR sweep of [min(loss(lr), loss_init) − min over LRs of loss], "
       "a diverged run counted as loss_init. `LR sensitivity`: from seed-mean losses. "
       "`per seed`: from each seed's own losses, loss_init and best loss, mean over seeds "
       "[95% bootstrap]; split at each seed's best LR (the smallest on a tie) into the "
       "terms of the LRs `below optimum` and `above optimum`, each divided by the grid's "
       "size, so the two add up to `per seed` (the best LR's term is 0; the intervals are "
       "each column's own). `best LR per seed`: how many seeds have their lowest loss at "
       "each LR. Lower means less sensitive, **but** a mode that fails at every LR also "
       "reads near zero (all its losses sit at loss_init): read it with `best loss` and the "
       "failures.",
       {"mode", "d_k", "LR sensitivity", "per seed", "below optimum", "above optimum",
        "best LR per seed", "best loss", "loss_init"},
       {}},
      {"Softmax Jacobian at initialisation",
       "Layer 0 head 0's mean ‖diag(p) − p pᵀ‖_F over the eval queries at step 0, "
       "mean over runs [95% bootstrap]: the seed note's vanishing gradient, "
       "measured. Saturated rows have a Jacobian near 0.",
       {"mode", "d_k", "Jacobian norm at step 0", "Var(q·k)/d_k at step 0"},
       {}},
  };
}

// A cell's per-LR rows: the final loss and the steps to the target at each LR ("" where the LR has
// no run). Returns the seed-mean loss of each LR that has runs, for the sensitivity row.
std::vector<double> add_per_lr_rows(const std::vector<RunRecord>& runs, const GroupGrid& grid,
                                    const CellKey& key, BudgetTables& t) {
  std::vector<std::string> lrow = {key.mode, std::to_string(key.d_k)}, rrow = lrow;
  std::vector<double> per_lr;
  for (double lr : grid.lrs) {
    const auto rs = cell_runs(runs, key, lr);
    if (rs.empty()) {
      lrow.push_back("");
      rrow.push_back("");
      continue;
    }
    const LossStat ls = loss_stat(rs);
    per_lr.push_back(ls.mean);
    lrow.push_back(ls.diverged == ls.n
                       ? "div"
                       : with_ci("%.3f", ls.mean, ls.ci) +
                             (ls.diverged ? " (" + std::to_string(ls.diverged) + " div)" : ""));
    std::vector<double> reached;
    for (const auto* r : rs)
      if (r->steps_to_target >= 0 && !r->diverged) reached.push_back(r->steps_to_target);
    rrow.push_back(reached.empty()
                       ? "—"
                       : with_ci("%.0f", mean(reached), bootstrap_mean_interval(reached)) + " (" +
                             std::to_string(reached.size()) + "/" + std::to_string(rs.size()) +
                             ")");
  }
  t.loss.rows.push_back(lrow);
  t.reach.rows.push_back(rrow);
  return per_lr;
}

// A cell's rows over all its runs: success, LR window, LR sensitivity and Jacobian at init.
void add_cell_summary_rows(const std::vector<RunRecord>& runs, const GroupGrid& grid,
                           const CellKey& key, const std::vector<const RunRecord*>& all,
                           const std::vector<double>& per_lr, BudgetTables& t) {
  const std::string& m = key.mode;
  const int d = key.d_k;
  double init = 0;
  for (const auto* r : all) init += r->init_eval_loss;
  init /= static_cast<double>(all.size());
  int failed = 0, diverged = 0;
  std::vector<double> jacs, vars;
  for (const auto* r : all) {
    failed += run_failed(*r) ? 1 : 0;
    diverged += r->diverged ? 1 : 0;
    jacs.push_back(r->init_jacobian);
    vars.push_back(r->init_qk_var_ratio);
  }
  const BestCell b = best_cell(runs, key, grid.lrs);
  t.success.rows.push_back({m, std::to_string(d),
                            std::to_string(count_works(all)) + "/" + std::to_string(all.size()),
                            fmt("%g", b.lr), proportion(b.k, b.n),
                            std::to_string(failed) + "/" + std::to_string(all.size()),
                            std::to_string(diverged) + "/" + std::to_string(all.size())});

  const WindowStat w = window_stat(runs, key);
  t.window.rows.push_back({m, std::to_string(d), with_ci("%.2f", w.mean, w.ci),
                           w.hi_lr > 0 ? fmt("%g", w.lo_lr) + " … " + fmt("%g", w.hi_lr) : "none",
                           w.edges.lower ? "yes" : "no", w.edges.upper ? "yes" : "no"});

  const FailureCounts fc = failure_counts(all);
  const auto share = [&](int k) {
    return std::to_string(k) +
           (fc.failing ? " (" + fmt("%.0f", 100.0 * k / fc.failing) + "%)" : "");
  };
  const auto median_of = [&](auto field) {
    std::vector<double> v;
    for (const auto* r : all)
      if (!r->works && std::isfinite(field(*r))) v.push_back(field(*r));
    if (v.empty()) return std::numeric_limits<double>::quiet_NaN();
    std::sort(v.begin(), v.end());
    return v.size() % 2 ? v[v.size() / 2] : 0.5 * (v[v.size() / 2 - 1] + v[v.size() / 2]);
  };
  const auto end_and_start = [&](auto at_end, auto at_start) {
    const double e = median_of(at_end), s0 = median_of(at_start);
    if (!std::isfinite(e)) return std::string("—");
    return fmt("%.3g", e) + " (" + (std::isfinite(s0) ? fmt("%.3g", s0) : "—") + ")";
  };
  t.failures.rows.push_back(
      {m, std::to_string(d), std::to_string(fc.failing) + "/" + std::to_string(fc.runs),
       share(fc.diverged), share(fc.saturated), share(fc.stalled), share(fc.slow),
       end_and_start([](const RunRecord& r) { return r.layer0_final.max_logit; },
                     [](const RunRecord& r) { return r.layer0_init.max_logit; }),
       end_and_start([](const RunRecord& r) { return r.layer0_final.entropy; },
                     [](const RunRecord& r) { return r.layer0_init.entropy; })});

  const double best = std::min(init, *std::min_element(per_lr.begin(), per_lr.end()));
  const SensitivityStat ss = sensitivity_stat(runs, key);
  std::map<double, int> best_lrs;
  for (double lr : ss.best_lr) ++best_lrs[lr];
  std::string best_lr_text;
  for (const auto& [lr, k] : best_lrs)
    best_lr_text += (best_lr_text.empty() ? "" : ", ") + fmt("%g", lr) + " (" + std::to_string(k) +
                    "/" + std::to_string(ss.seeds) + ")";
  t.sens.rows.push_back(
      {m, std::to_string(d), fmt("%.3f", lr_sensitivity(per_lr, init)),
       with_ci("%.3f", ss.total, ss.total_ci), with_ci("%.3f", ss.below, ss.below_ci),
       with_ci("%.3f", ss.above, ss.above_ci), best_lr_text, fmt("%.3f", best), fmt("%.3f", init)});
  t.jac.rows.push_back({m, std::to_string(d),
                        with_ci("%.4f", mean(jacs), bootstrap_mean_interval(jacs)),
                        fmt("%.3f", mean(vars))});
}

// One group's section at one budget: every table, one row per (mode, d_k) cell that has runs.
ReportSection budget_section(const std::vector<RunRecord>& runs, const GroupGrid& grid, int steps) {
  ReportSection s;
  s.heading = grid.name + ", " + std::to_string(steps) + " steps";
  s.intro = budget_intro(runs, grid, steps);
  BudgetTables t = budget_tables(grid);
  for (const auto& m : grid.modes)
    for (int d : grid.dks) {
      const CellKey key{grid.name, steps, m, d};
      const auto all = cell_runs(runs, key, -1);
      if (all.empty()) continue;
      const std::vector<double> per_lr = add_per_lr_rows(runs, grid, key, t);
      add_cell_summary_rows(runs, grid, key, all, per_lr, t);
    }
  s.tables.push_back(t.loss);
  if (grid.target) s.tables.push_back(t.reach);
  s.tables.push_back(t.success);
  s.tables.push_back(t.failures);
  s.tables.push_back(t.window);
  s.tables.push_back(t.sens);
  s.tables.push_back(t.jac);
  return s;
}

// Whether the longer budget rescues a cell, from the two budgets' verdicts (best_cell's).
std::string budget_verdict(int short_verdict, int long_verdict, const std::string& at_short,
                           const std::string& at_long) {
  const auto state = [](int v) { return v == 1 ? "works" : v == -1 ? "fails" : "undecided"; };
  if (short_verdict == 1 && long_verdict == 1) return "works at " + at_short;
  if (short_verdict == -1 && long_verdict == 1) return "rescued by " + at_long;
  if (short_verdict == -1 && long_verdict == -1) return "not rescued";
  if (short_verdict == 1 && long_verdict == -1)
    return "works at " + at_short + ", lost at " + at_long;
  // at least one budget leaves it undecided
  return std::string(state(short_verdict)) + " at " + at_short + ", " + state(long_verdict) +
         " at " + at_long;
}

// A group with several budgets: does the longest rescue what the shortest fails?
ReportSection rescue_section(const std::vector<RunRecord>& runs, const GroupGrid& grid) {
  const std::string& g = grid.name;
  const int shortest = grid.budgets.front(), longest = grid.budgets.back();
  ReportSection s;
  s.heading = g + ": does a longer budget rescue a mode?";
  s.intro = "For each mode and d_k, the best LR at " + std::to_string(shortest) + " and at " +
            std::to_string(longest) +
            " steps (the LR with the most working seeds), and the window widths. A budget solves "
            "the cell when the best LR's Wilson interval lies above 1/2 and fails it when the "
            "interval lies below; otherwise the seeds leave it undecided, and the verdict says so. "
            "With 5 seeds only 5/5 (interval [0.57, 1]) solves and only 0/5 ([0, 0.43]) fails. "
            "The best of several LRs is an optimistic pick: read 'solves' as 'some LR of the grid "
            "solves it'.";
  ReportTable t{
      "Budget",
      "",
      {"mode", "d_k", "best at " + std::to_string(shortest), "best at " + std::to_string(longest),
       "window at " + std::to_string(shortest) + " (decades)",
       "window at " + std::to_string(longest) + " (decades)", "verdict"},
      {}};
  for (const auto& m : grid.modes)
    for (int d : grid.dks) {
      const CellKey a{g, shortest, m, d}, b{g, longest, m, d};
      if (cell_runs(runs, a, -1).empty() || cell_runs(runs, b, -1).empty()) continue;
      const BestCell ba = best_cell(runs, a, grid.lrs), bb = best_cell(runs, b, grid.lrs);
      const WindowStat wa = window_stat(runs, a), wb = window_stat(runs, b);
      const std::string verdict =
          budget_verdict(ba.verdict, bb.verdict, std::to_string(shortest) + " steps",
                         std::to_string(longest) + " steps");
      t.rows.push_back({m, std::to_string(d), proportion(ba.k, ba.n) + " at lr " + fmt("%g", ba.lr),
                        proportion(bb.k, bb.n) + " at lr " + fmt("%g", bb.lr),
                        with_ci("%.2f", wa.mean, wa.ci), with_ci("%.2f", wb.mean, wb.ci), verdict});
    }
  s.tables.push_back(t);
  return s;
}

// s·√d_k of a scaling arm at head dim d: 1 for sqrt_dk, 1/√d for dk, √d for none, times c for an
// arm named "<mode>_x<c>"; nullopt for an arm that is not a fixed scale (qk_norm, learnable).
std::optional<double> scale_times_sqrt_dk(const std::string& mode, int d) {
  std::string base = mode;
  double c = 1;
  if (const auto x = mode.rfind("_x"); x != std::string::npos) {
    base = mode.substr(0, x);
    const std::string text = mode.substr(x + 2);
    char* end = nullptr;
    c = std::strtod(text.c_str(), &end);
    if (text.empty() || *end != '\0' || !(c > 0) || !std::isfinite(c)) return std::nullopt;
  }
  const double root = std::sqrt(static_cast<double>(d));
  if (base == "sqrt_dk") return c;
  if (base == "dk") return c / root;
  if (base == "none") return c * root;
  return std::nullopt;
}

bool has_magnitude_arms(const GroupGrid& grid) {
  return std::any_of(grid.modes.begin(), grid.modes.end(), [](const std::string& m) {
    return m.rfind("_x") != std::string::npos && scale_times_sqrt_dk(m, 1).has_value();
  });
}

// A group with arms that scale a mode by a constant: for each fixed-scale arm, its scale, LR
// window and LR sensitivity at every d_k, so that the exponent and the constant can be told apart.
ReportSection magnitude_section(const std::vector<RunRecord>& runs, const GroupGrid& grid,
                                int steps) {
  ReportSection s;
  s.heading = grid.name + ", " + std::to_string(steps) + " steps: the exponent or the magnitude?";
  s.intro =
      "The arms differ in the exponent of d_k (1/√d_k against 1/d_k) and in a constant (µP's "
      "code uses 8/d_k, equal to 1/√d_k at d_k = 64; at d_k = 16, 4/d_k equals 1/√d_k and 1/d_k "
      "equals 1/(4√d_k)). If the flat window of 1/d_k across d_k comes from the exponent, the "
      "d_k arms keep their width at every constant while the √d_k arms change; if it comes from "
      "the magnitude, arms with the same s·√d_k have the same window at that d_k.";
  std::string dks;
  for (int d : grid.dks) dks += (dks.empty() ? "" : ", ") + std::to_string(d);
  ReportTable t{"Scale, LR window and LR sensitivity per d_k",
                "Values at d_k = " + dks +
                    " in that order. s·√d_k: the attention scale s times √d_k (1 for 1/√d_k). "
                    "Window: mean over seeds in decades (the LR window table's). Sensitivity: "
                    "per seed, mean over seeds (the LR sensitivity table's). Change: the window "
                    "at the largest d_k minus that at the smallest.",
                {"mode", "s·√d_k", "window (decades)", "window change", "LR sensitivity"},
                {}};
  for (const auto& m : grid.modes) {
    if (!scale_times_sqrt_dk(m, 1)) continue;
    std::string scales, windows, sens;
    std::vector<double> widths;
    for (int d : grid.dks) {
      const CellKey key{grid.name, steps, m, d};
      const bool ran = !cell_runs(runs, key, -1).empty();
      const auto join = [](std::string& out, const std::string& v) {
        out += (out.empty() ? "" : ", ") + v;
      };
      join(scales, fmt("%.3g", *scale_times_sqrt_dk(m, d)));
      if (!ran) {
        join(windows, "—");
        join(sens, "—");
        continue;
      }
      const WindowStat w = window_stat(runs, key);
      widths.push_back(w.mean);
      join(windows, fmt("%.2f", w.mean));
      join(sens, fmt("%.3f", sensitivity_stat(runs, key).total));
    }
    const std::string change = widths.size() == grid.dks.size() && widths.size() > 1
                                   ? fmt("%+.2f", widths.back() - widths.front())
                                   : "—";
    t.rows.push_back({m, scales, windows, change, sens});
  }
  s.tables.push_back(t);
  return s;
}

}  // namespace

std::vector<ReportSection> summary_sections(const std::vector<RunRecord>& runs) {
  std::vector<ReportSection> sections;
  for (const auto& g : group_names(runs)) {
    const GroupGrid grid = group_grid(runs, g);
    for (int steps : grid.budgets) sections.push_back(budget_section(runs, grid, steps));
    if (grid.budgets.size() > 1) sections.push_back(rescue_section(runs, grid));
    if (has_magnitude_arms(grid))
      for (int steps : grid.budgets) sections.push_back(magnitude_section(runs, grid, steps));
  }
  for (const auto& family : width_families(runs))
    sections.push_back(proxy_checks_section(runs, family));
  return sections;
}

std::string summary_markdown(const std::vector<RunRecord>& runs, const std::string& title) {
  std::ostringstream os;
  os << "# " << title << "\n\n";
  for (const auto& s : summary_sections(runs)) {
    os << "## " << s.heading << "\n\n" << s.intro << "\n\n";
    for (const auto& t : s.tables) {
      os << "### " << t.title << "\n\n";
      if (!t.note.empty()) os << t.note << "\n\n";
      os << '|';
      for (const auto& h : t.header) os << ' ' << h << " |";
      os << "\n|";
      for (std::size_t i = 0; i < t.header.size(); ++i) os << "---|";
      os << '\n';
      for (const auto& row : t.rows) {
        os << '|';
        for (const auto& c : row) os << ' ' << c << " |";
        os << '\n';
      }
      os << '\n';
    }
  }
  return os.str();
}

}  // namespace attnlab::app
