#include "attnlab/app/summary.hpp"

#include "attnlab/app/proxy_checks.hpp"
#include "text_format.hpp"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <iterator>
#include <limits>
#include <map>
#include <optional>
#include <set>
#include <sstream>
#include <stdexcept>
#include <tuple>

namespace attnlab::app {

namespace {

int mode_rank(const std::string& m) {
  static const std::vector<std::string> order = {"none",  "sqrt_dk_x0.25", "sqrt_dk", "dk",
                                                 "dk_x4", "dk_x8",         "qk_norm", "learnable"};
  const auto it = std::find(order.begin(), order.end(), m);
  return it == order.end() ? 100 : static_cast<int>(it - order.begin());
}

}  // namespace

bool run_diverged(const RunRecord& r) {
  return r.diverged || loss_diverged(r.final_eval_loss, r.init_eval_loss);
}

bool run_failed(const RunRecord& r) {
  return run_diverged(r) || r.final_eval_loss >= kFailedFraction * r.init_eval_loss;
}

bool attention_collapsed(const RunRecord& r) {
  const LayerZeroStats &start = r.layer0_init, &end = r.layer0_final;
  // NaN compares false: a run without the figures is never called saturated.
  return start.max_logit > 0 && end.max_logit >= kSaturatedLogitGrowth * start.max_logit &&
         start.entropy > 0 && end.entropy <= kCollapsedEntropyFraction * start.entropy;
}

FailureKind failure_kind(const RunRecord& r) {
  if (r.works) return FailureKind::none;
  if (run_diverged(r)) return FailureKind::diverged;
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
  return run_diverged(r) ? r.init_eval_loss : r.final_eval_loss;
}

void mark_working(std::vector<RunRecord>& runs) {
  std::map<std::tuple<std::string, int, int>, double> best;  // (group, steps, d_k) -> best loss
  for (const auto& r : runs) {
    if (r.has_target || run_diverged(r)) continue;
    const auto key = std::make_tuple(r.group, r.steps, r.d_k);
    const auto it = best.find(key);
    if (it == best.end() || r.final_eval_loss < it->second) best[key] = r.final_eval_loss;
  }
  for (auto& r : runs) {
    if (r.has_target) {
      r.works = !run_diverged(r) && r.steps_to_target >= 0;
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
    s.diverged += run_diverged(*r) ? 1 : 0;
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

namespace {

// The mechanism columns of LayerZeroStats (optional on reading: NaN where a summary lacks them),
// each written as l0_<name>_init and l0_<name>_final after final_eval_bpb.
struct MechanismColumn {
  const char* name;
  double LayerZeroStats::*field;
};
constexpr MechanismColumn kMechanism[] = {
    {"q_norm", &LayerZeroStats::q_norm},
    {"k_norm", &LayerZeroStats::k_norm},
    {"qk_cos", &LayerZeroStats::qk_cos},
    {"wq_sigma1", &LayerZeroStats::wq_sigma1},
    {"wk_sigma1", &LayerZeroStats::wk_sigma1},
    {"ln_gain_max", &LayerZeroStats::ln_gain_max},
    {"qn_gamma_max", &LayerZeroStats::qn_gamma_max},
    {"qn_beta_norm", &LayerZeroStats::qn_beta_norm},
    {"kn_gamma_max", &LayerZeroStats::kn_gamma_max},
    {"kn_beta_norm", &LayerZeroStats::kn_beta_norm},
};

std::string mechanism_column(const MechanismColumn& m, bool final) {
  return std::string("l0_") + m.name + (final ? "_final" : "_init");
}

}  // namespace

std::string summary_csv(const std::vector<RunRecord>& runs) {
  std::ostringstream os;
  os << "group,mode,d_k,lr,seed,steps,init_eval_loss,final_eval_loss,final_eval_acc,"
        "steps_to_95,failed,diverged,diverged_step,works,init_qk_var_ratio,init_jacobian,"
        "l0_max_logit_init,l0_max_logit_final,l0_entropy_init,l0_entropy_final,l0_wq_norm_init,"
        "l0_wk_norm_init,l0_wq_norm_final,l0_wk_norm_final,final_eval_bpb";
  for (const bool final : {false, true})
    for (const auto& m : kMechanism) os << ',' << mechanism_column(m, final);
  os << ",seconds,dir\n";
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
       << g(r.layer0_final.wk_norm) << ',' << g(r.final_eval_bpb);
    for (const LayerZeroStats* z : {&r.layer0_init, &r.layer0_final})
      for (const auto& m : kMechanism) os << ',' << g(z->*m.field);
    os << ',' << fmt("%.2f", r.seconds) << ',' << csv_cell(r.dir) << '\n';
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
  const std::size_t c_bpb = optional_col("final_eval_bpb");  // text tasks; newer summaries
  std::vector<std::size_t> c_mech;  // kMechanism's, init then final; newer summaries
  for (const bool final : {false, true})
    for (const auto& m : kMechanism)
      c_mech.push_back(optional_col(mechanism_column(m, final).c_str()));
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
      if (c_bpb < cells.size()) r.final_eval_bpb = std::stod(cells[c_bpb]);
      const std::size_t n_mech = std::size(kMechanism);
      for (std::size_t i = 0; i < c_mech.size(); ++i) {
        // Through a reference: GCC 12 assigns `(c ? a : b).*field` to a copy.
        LayerZeroStats& z = i < n_mech ? r.layer0_init : r.layer0_final;
        if (c_mech[i] < cells.size()) z.*kMechanism[i % n_mech].field = std::stod(cells[c_mech[i]]);
      }
      runs.push_back(std::move(r));
    } catch (const std::logic_error&) {
      throw std::invalid_argument(path + ": line " + std::to_string(n) +
                                  ": expected numbers, got '" + line + "'");
    }
  }
  return runs;
}

}  // namespace attnlab::app
