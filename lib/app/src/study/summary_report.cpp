// The summary's report sections and Markdown (summary_sections, summary_markdown in
// attnlab/app/summary.hpp): per group and budget, the tables of final loss, success, failures and
// the LR window, and the rescue and magnitude sections.
#include "attnlab/app/summary.hpp"

#include "attnlab/app/proxy_checks.hpp"
#include "text_format.hpp"

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
       "loss at initialisation and is marked (k div); `div`: every seed diverged. Diverged: a "
       "non-finite loss, or a loss more than " +
           fmt("%.0f", kDivergenceMargin) +
           " nats above the loss at initialisation (the trainer's test; applied here to the "
           "final loss too, for runs trained before the trainer had it).",
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
       "run can plateau below the failure bar); the share is of those runs. diverged: as in the "
       "loss table, the same runs as the success table's; saturated: otherwise, "
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
      if (r->steps_to_target >= 0 && !run_diverged(*r)) reached.push_back(r->steps_to_target);
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
    diverged += run_diverged(*r) ? 1 : 0;
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
  for (const auto& family : width_families(runs)) {
    sections.push_back(proxy_checks_section(runs, family));
    sections.push_back(proxy_mechanisms_section(runs, family));
  }
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
