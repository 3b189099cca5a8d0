#include "figures.hpp"

#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <mutex>
#include <optional>
#include <set>
#include <sstream>
#include <thread>

#include <limits>

#include <nlohmann/json.hpp>

#include "attnlab/app/plot.hpp"
#include "attnlab/app/progress.hpp"
#include "attnlab/app/report.hpp"

namespace attnlab::app {

std::string lr_label(double lr) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%g", lr);
  return buf;
}

std::string sanitize(std::string s) {
  for (char& ch : s)
    if (ch == '/' || ch == ' ') ch = '_';
  return s;
}

namespace {

// Columns of a metrics.csv, by header name.
struct Table {
  std::vector<std::string> header;
  std::vector<std::vector<double>> rows;
  int col(const std::string& name) const {
    const auto it = std::find(header.begin(), header.end(), name);
    return it == header.end() ? -1 : static_cast<int>(it - header.begin());
  }
};

Table read_csv(const std::string& path) {
  Table t;
  std::ifstream in(path);
  std::string line;
  if (!std::getline(in, line)) return t;
  std::stringstream hs(line);
  for (std::string cell; std::getline(hs, cell, ',');) t.header.push_back(cell);
  while (std::getline(in, line)) {
    std::vector<double> row;
    std::stringstream ss(line);
    for (std::string cell; std::getline(ss, cell, ',');) {
      char* end = nullptr;
      const double v = std::strtod(cell.c_str(), &end);
      row.push_back(end == cell.c_str() ? std::nan("") : v);
    }
    t.rows.push_back(std::move(row));
  }
  return t;
}

std::string gp_header(const std::string& svg, int width, int height, const std::string& title,
                      const std::string& layout) {
  std::ostringstream gp;
  gp << "# attnlab study plot: re-render with `gnuplot " << svg.substr(0, svg.size() - 4)
     << ".gp` in this folder\n"
     << "set terminal svg size " << width << ',' << height
     << " font 'sans,11' background '#ffffff'\nset termoption noenhanced\nset output '" << svg
     << "'\nset grid\nset key top right\n"
     << "set multiplot layout " << layout << " title '" << title << "'\n";
  return gp.str();
}

// Ends a data block of a gnuplot .dat file. A block with no data line gets one of NaNs: gnuplot
// skips comment lines without counting blank ones, so an empty block would merge two separators
// and shift every later `index`.
void end_block(std::ostringstream& dat, std::streampos data_start, int columns) {
  if (dat.tellp() == data_start) {
    for (int c = 0; c < columns; ++c) dat << (c ? " nan" : "nan");
    dat << '\n';
  }
  dat << "\n\n";
}

// Reads one run's OUT/attention.json into the heatmaps at initialisation and at the end.
std::vector<Heatmap> run_heatmaps(const std::string& path, const std::string& label) {
  std::ifstream in(path);
  if (!in) return {};
  std::vector<Heatmap> out;
  try {  // a malformed file draws no heatmap (the figure then has fewer), never stops the study
    nlohmann::json j;
    in >> j;
    for (const char* when : {"init", "final"}) {
      Heatmap h;
      h.tq = j.at("tq").get<std::size_t>();
      h.tk = j.at("tk").get<std::size_t>();
      bool finite = true;
      for (const auto& row : j.at(when).at("weights"))
        for (const auto& v : row) {
          finite = finite && v.is_number();
          h.weights.push_back(v.is_number() ? v.get<double>() : std::nan(""));
        }
      if (!finite || h.weights.size() != h.tq * h.tk) continue;
      h.mark_col = j.at("key_position").get<int>();
      h.mark_row = h.mark_col >= 0 ? j.at("query_position").get<int>() : -1;
      h.caption = label + ", step " + std::to_string(j.at(when).at("step").get<long>());
      out.push_back(std::move(h));
    }
  } catch (const nlohmann::json::exception&) {
    return {};
  }
  return out;
}

// One group's axes, which all its figures share: the arms in report order, the swept LRs, the
// budgets and d_k values ascending, and the y range of the loss panels.
struct GroupAxes {
  const std::string& out;  // the study folder
  const StudyGroup& g;
  const std::vector<RunRecord>& runs;
  std::string prefix;  // of the figures' file names
  std::vector<std::string> arms;
  std::vector<double> lrs;
  std::vector<int> budgets, dks;
  int max_dk;
  bool recall;
  double loss_init;  // the group's mean eval loss at initialisation
  double ymax;
};

// nullopt when the group has nothing to plot (no arm, LR or d_k).
std::optional<GroupAxes> group_axes(const std::string& out, const StudyGroup& g,
                                    const std::vector<RunRecord>& runs) {
  std::vector<std::string> arms = ordered_modes(runs, g.name);
  std::vector<double> lrs = sweep_lrs(runs, g.name);
  std::vector<int> budgets;
  for (const auto& r : runs)
    if (r.group == g.name && std::find(budgets.begin(), budgets.end(), r.steps) == budgets.end())
      budgets.push_back(r.steps);
  std::sort(budgets.begin(), budgets.end());
  std::vector<int> dks = g.d_k;
  std::sort(dks.begin(), dks.end());
  if (arms.empty() || lrs.empty() || dks.empty()) return std::nullopt;
  double loss_init = 0;
  int n_init = 0;
  for (const auto& r : runs)
    if (r.group == g.name) {
      loss_init += r.init_eval_loss;
      ++n_init;
    }
  loss_init = n_init ? loss_init / n_init : 1;
  const int max_dk = dks.back();
  return GroupAxes{out,
                   g,
                   runs,
                   sanitize(g.name),
                   std::move(arms),
                   std::move(lrs),
                   std::move(budgets),
                   std::move(dks),
                   max_dk,
                   g.base.task.kind == TaskKind::recall,
                   loss_init,
                   std::ceil(loss_init * 1.15)};
}

// Renders a group's figures into the study folder: NAME.dat, NAME.gp and NAME.svg. A figure that
// fails leaves the others: the first failure goes to `error`.
class FigureRenderer {
 public:
  FigureRenderer(const std::string& out, std::vector<std::string>& files, std::string& error)
      : out_(out), files_(files), error_(error) {}

  // The svg's path, listed in `files` even when gnuplot failed.
  std::string render(const std::string& name, const std::string& dat, const std::string& gp) const {
    write_text_file(out_ + "/" + name + ".dat", dat);
    files_.push_back(out_ + "/" + name + ".svg");
    std::filesystem::remove(out_ + "/" + name + ".svg");  // a stale figure is never embedded
    try {
      render_gnuplot(out_ + "/" + name + ".gp", gp);
    } catch (const PlotError& e) {
      if (error_.empty()) error_ = e.what();
    }
    return out_ + "/" + name + ".svg";
  }

 private:
  const std::string& out_;
  std::vector<std::string>& files_;
  std::string& error_;
};

// The cell's run with the lowest seed: the one whose curves and heatmaps a figure shows.
const RunRecord* first_run(const GroupAxes& a, const CellKey& key, double lr) {
  const auto rs = cell_runs(a.runs, key, lr);
  const RunRecord* best = nullptr;
  for (const auto* r : rs)
    if (!best || r->seed < best->seed) best = r;
  return best;
}

// The LR of the lowest seed-mean final loss in the cell (the smallest LR when no LR has runs).
double best_lr_of(const GroupAxes& a, const CellKey& key) {
  double best = a.lrs.front(), best_loss = std::numeric_limits<double>::infinity();
  for (double lr : a.lrs) {
    const auto rs = cell_runs(a.runs, key, lr);
    if (rs.empty()) continue;
    const double l = loss_stat(rs).mean;
    if (l < best_loss) {
      best_loss = l;
      best = lr;
    }
  }
  return best;
}

// The headline: LR window width vs d_k, one panel per budget, one curve per arm.
ReportFigure lr_window_figure(const GroupAxes& a, const FigureRenderer& renderer) {
  std::ostringstream dat, gp;
  const std::string name = a.prefix + "_lr_window";
  int block = 0;
  for (int steps : a.budgets)
    for (const auto& arm : a.arms) {
      dat << "# steps " << steps << " mode " << arm
          << "\n# d_k window_decades(mean over seeds) ci_lo ci_hi lower_edge upper_edge\n";
      const auto data_start = dat.tellp();
      for (int d : a.dks) {
        const WindowStat w = window_stat(a.runs, {a.g.name, steps, arm, d});
        dat << d << ' ' << w.mean << ' ' << w.ci.lo << ' ' << w.ci.hi << ' '
            << (w.edges.lower ? 1 : 0) << ' ' << (w.edges.upper ? 1 : 0) << '\n';
      }
      end_block(dat, data_start, 6);
      ++block;
    }
  const double spacing =
      std::log10(a.lrs.back() / a.lrs.front()) / std::max<double>(1, a.lrs.size() - 1);
  gp << gp_header(name + ".svg", std::max(640, 480 * static_cast<int>(a.budgets.size())), 420,
                  a.g.name + ": working LR window (mean over seeds, 95% bootstrap)",
                  "1," + std::to_string(a.budgets.size()))
     << "set logscale x 2\nset xrange [" << a.dks.front() / 1.5 << ':' << a.max_dk * 1.5
     << "]\nset xlabel 'd_k'\nset ylabel 'decades of LR that work'\nset yrange [-0.1:"
     << spacing * static_cast<double>(a.lrs.size()) + 0.2 << "]\n";
  block = 0;
  for (int steps : a.budgets) {
    gp << "set title '" << steps << " steps'\nplot ";
    for (std::size_t i = 0; i < a.arms.size(); ++i, ++block)
      gp << (i ? ", " : "") << "'" << name << ".dat' index " << block << " using ($1*"
         << (1 + 0.04 * static_cast<double>(i)) << "):2:3:4 with yerrorlines lw 2 pt 7 title '"
         << a.arms[i] << "'";
    gp << '\n';
  }
  gp << "unset multiplot\n";
  return {a.g.name + ": the working LR window",
          "How many decades of peak LR work (see the LR window table), against d_k. A mode whose "
          "window shrinks with d_k needs its LR retuned as the model widens.",
          renderer.render(name, dat.str(), gp.str()),
          {}};
}

// The file name prefix and the title prefix of one budget's figures.
std::string budget_prefix(const GroupAxes& a, int steps) {
  return a.prefix + "_n" + std::to_string(steps);
}
std::string budget_title(const GroupAxes& a, int steps) {
  return a.g.name + ", " + std::to_string(steps) + " steps";
}

// Final eval loss vs LR: one panel per d_k, one curve per arm, with intervals.
ReportFigure loss_vs_lr_figure(const GroupAxes& a, int steps, const FigureRenderer& renderer) {
  std::ostringstream dat, gp;
  const std::string name = budget_prefix(a, steps) + "_loss_vs_lr";
  int block = 0;
  for (int d : a.dks)
    for (const auto& arm : a.arms) {
      dat << "# d_k " << d << " mode " << arm
          << "\n# lr final_eval_loss(seed mean; diverged counts as loss_init) ci_lo ci_hi "
             "diverged_runs\n";
      const auto data_start = dat.tellp();
      for (double lr : a.lrs) {
        const auto rs = cell_runs(a.runs, {a.g.name, steps, arm, d}, lr);
        if (rs.empty()) continue;
        const LossStat ls = loss_stat(rs);
        dat << lr << ' ' << ls.mean << ' ' << ls.ci.lo << ' ' << ls.ci.hi << ' ' << ls.diverged
            << '\n';
      }
      end_block(dat, data_start, 5);
    }
  gp << gp_header(name + ".svg", 420 * static_cast<int>(a.dks.size()), 420,
                  budget_title(a, steps) +
                      ": final eval loss vs peak LR (mean, 95% bootstrap; dashed: at init)",
                  "1," + std::to_string(a.dks.size()))
     << "set logscale x\nset xrange [" << a.lrs.front() / 1.5 << ':' << a.lrs.back() * 1.5
     << "]\nset xlabel 'peak learning rate'\nset ylabel 'final eval loss'\nset yrange [0:" << a.ymax
     << "]\n";
  for (int d : a.dks) {
    gp << "set title 'd_k = " << d << "'\nplot ";
    for (std::size_t i = 0; i < a.arms.size(); ++i, ++block)
      gp << "'" << name << ".dat' index " << block
         << " using 1:2:3:4 with yerrorlines lw 2 pt 7 title '" << a.arms[i] << "', ";
    gp << a.loss_init << " with lines dt 2 lc rgb 'gray' notitle\n";
  }
  gp << "unset multiplot\n";
  return {"Final eval loss vs LR, " + std::to_string(steps) + " steps",
          "One panel per d_k; error bars: 95% bootstrap over seeds.",
          renderer.render(name, dat.str(), gp.str()),
          {}};
}

// The telling LRs at the largest d_k: each arm's lowest-loss LR, ascending, without repeats.
std::vector<double> telling_lrs(const GroupAxes& a, int steps) {
  std::vector<double> telling;
  for (const auto& arm : a.arms) {
    const double lr = best_lr_of(a, {a.g.name, steps, arm, a.max_dk});
    if (std::find(telling.begin(), telling.end(), lr) == telling.end()) telling.push_back(lr);
  }
  std::sort(telling.begin(), telling.end());
  return telling;
}

// Curves: one panel per telling LR, one curve per arm (first seed).
ReportFigure curves_figure(const GroupAxes& a, int steps, const std::vector<double>& telling,
                           const FigureRenderer& renderer) {
  std::ostringstream dat, gp;
  const std::string name = budget_prefix(a, steps) + "_curves_dk" + std::to_string(a.max_dk);
  int block = 0;
  for (double lr : telling)
    for (const auto& arm : a.arms) {
      const RunRecord* r = first_run(a, {a.g.name, steps, arm, a.max_dk}, lr);
      dat << "# lr " << lr << " mode " << arm << "\n# step eval_loss eval_acc\n";
      const auto data_start = dat.tellp();
      if (r) {
        const Table t = read_csv(a.out + "/" + r->dir + "/metrics.csv");
        const int cs = t.col("step"), cl = t.col("eval_loss"), ca = t.col("eval_acc");
        for (const auto& row : t.rows)
          if (cs >= 0 && cl >= 0 && ca >= 0 && std::isfinite(row[cl]))
            dat << row[cs] << ' ' << row[cl] << ' ' << row[ca] << '\n';
      }
      end_block(dat, data_start, 3);
    }
  const int cols = static_cast<int>(telling.size());
  gp << gp_header(name + ".svg", 420 * cols, 380,
                  budget_title(a, steps) +
                      ": eval loss during training at d_k = " + std::to_string(a.max_dk),
                  "1," + std::to_string(cols))
     << "set xlabel 'step'\nset ylabel 'eval loss'\nset yrange [0:" << a.ymax << "]\n";
  for (double lr : telling) {
    gp << "set title 'peak lr = " << lr_label(lr) << "'\nplot ";
    for (std::size_t i = 0; i < a.arms.size(); ++i, ++block)
      gp << (i ? ", " : "") << "'" << name << ".dat' index " << block
         << " using 1:2 with lines lw 2 title '" << a.arms[i] << "'";
    gp << '\n';
  }
  gp << "unset multiplot\n";
  return {"Training curves at d_k = " + std::to_string(a.max_dk) + ", " + std::to_string(steps) +
              " steps",
          "At each arm's lowest-loss LR (seed mean; one panel per such LR), every arm, first seed.",
          renderer.render(name, dat.str(), gp.str()),
          {}};
}

// Layer 0 head 0's attention health during training: every arm at peak LR `lr` (the best of arm
// `ref`), four panels.
ReportFigure attention_figure(const GroupAxes& a, int steps, const std::string& ref, double lr,
                              const FigureRenderer& renderer) {
  std::ostringstream dat, gp;
  const std::string name = budget_prefix(a, steps) + "_attention_dk" + std::to_string(a.max_dk);
  for (const auto& arm : a.arms) {
    const RunRecord* r = first_run(a, {a.g.name, steps, arm, a.max_dk}, lr);
    dat << "# mode " << arm << " lr " << lr
        << "\n# step entropy max_abs_logit saturated_fraction jacobian_norm recall_mass\n";
    const auto data_start = dat.tellp();
    if (r) {
      const Table t = read_csv(a.out + "/" + r->dir + "/metrics.csv");
      const int cs = t.col("step"), ce = t.col("l0h0_entropy"), cm = t.col("l0h0_max_logit"),
                cf = t.col("l0h0_saturated"), cj = t.col("l0h0_jacobian"),
                cr = t.col("l0h0_recall_mass");
      for (const auto& row : t.rows) {
        if (cs < 0 || ce < 0 || cm < 0 || cf < 0 || cj < 0) break;
        dat << row[cs] << ' ' << row[ce] << ' ' << row[cm] << ' ' << row[cf] << ' ' << row[cj]
            << ' ' << (cr >= 0 ? row[cr] : std::nan("")) << '\n';
      }
    }
    end_block(dat, data_start, 6);
  }
  gp << gp_header(name + ".svg", 1000, 760,
                  budget_title(a, steps) + ": layer 0 head 0 during training, d_k = " +
                      std::to_string(a.max_dk) + ", peak lr = " + lr_label(lr),
                  "2,2")
     << "set xlabel 'step'\n";
  const char* titles[4] = {
      "attention entropy (nats)", "max |scaled logit| (log scale)",
      "fraction of rows with max weight > 0.99",
      a.recall ? "attention mass on the correct key" : "softmax Jacobian norm"};
  const int cols[4] = {2, 3, 4, a.recall ? 6 : 5};
  for (int p = 0; p < 4; ++p) {
    gp << "set title '" << titles[p] << "'\n"
       << (p == 1 ? "set logscale y\n" : "unset logscale y\n")
       << (p == 2 || (p == 3 && a.recall) ? "set yrange [0:1.05]\n" : "set autoscale y\n")
       << "plot ";
    for (std::size_t i = 0; i < a.arms.size(); ++i)
      gp << (i ? ", " : "") << "'" << name << ".dat' index " << i << " using 1:" << cols[p]
         << " with lines lw 2 title '" << a.arms[i] << "'";
    gp << '\n';
  }
  gp << "unset multiplot\n";
  return {"Attention during training at d_k = " + std::to_string(a.max_dk) + ", " +
              std::to_string(steps) + " steps",
          "Layer 0 head 0 on the eval set, every arm at peak lr " + lr_label(lr) + " (" + ref +
              "'s lowest-loss LR), first seed.",
          renderer.render(name, dat.str(), gp.str()),
          {}};
}

// The heatmaps of every arm's first run at peak LR `lr`, drawn by the report itself (no gnuplot).
ReportFigure heatmaps_figure(const GroupAxes& a, int steps, double lr) {
  ReportFigure maps{"Attention heatmaps at d_k = " + std::to_string(a.max_dk) + ", " +
                        std::to_string(steps) + " steps",
                    "Layer 0 head 0's weights on the first eval example (rows: queries, "
                    "columns: keys; white 0, dark blue 1), at initialisation and at the end, "
                    "every arm at peak lr " +
                        lr_label(lr) + ", first seed." +
                        (a.recall ? " The red box is the correct key for the final query." : ""),
                    "",
                    {}};
  for (const auto& arm : a.arms)
    if (const RunRecord* r = first_run(a, {a.g.name, steps, arm, a.max_dk}, lr))
      for (auto& h : run_heatmaps(a.out + "/" + r->dir + "/attention.json", arm))
        maps.heatmaps.push_back(std::move(h));
  return maps;
}

// One budget's figures: the loss vs LR, the curves, and the attention health and heatmaps.
void plot_budget(const GroupAxes& a, int steps, const FigureRenderer& renderer, GroupPlots& plots) {
  plots.figures.push_back(loss_vs_lr_figure(a, steps, renderer));
  plots.figures.push_back(curves_figure(a, steps, telling_lrs(a, steps), renderer));
  // Attention health and heatmaps at one LR for every arm: the reference arm's best LR
  // (sqrt_dk's when present), so the arms are compared like for like.
  const std::string ref = std::find(a.arms.begin(), a.arms.end(), "sqrt_dk") != a.arms.end()
                              ? "sqrt_dk"
                              : a.arms.front();
  const double lr = best_lr_of(a, {a.g.name, steps, ref, a.max_dk});
  plots.figures.push_back(attention_figure(a, steps, ref, lr, renderer));
  plots.figures.push_back(heatmaps_figure(a, steps, lr));
}

// The softmax Jacobian at initialisation vs d_k (the first budget's runs).
ReportFigure jacobian_figure(const GroupAxes& a, const FigureRenderer& renderer) {
  std::ostringstream dat, gp;
  const std::string name = a.prefix + "_jacobian_init";
  for (const auto& arm : a.arms) {
    dat << "# mode " << arm << "\n# d_k jacobian_norm_at_step_0(mean over runs) ci_lo ci_hi\n";
    const auto data_start = dat.tellp();
    for (int d : a.dks) {
      std::vector<double> j;
      for (const auto* r : cell_runs(a.runs, {a.g.name, a.budgets.front(), arm, d}, -1))
        j.push_back(r->init_jacobian);
      const Interval ci = bootstrap_mean_interval(j);
      if (!j.empty()) dat << d << ' ' << mean(j) << ' ' << ci.lo << ' ' << ci.hi << '\n';
    }
    end_block(dat, data_start, 4);
  }
  gp << gp_header(name + ".svg", 640, 440, a.g.name + ": softmax Jacobian norm at initialisation",
                  "1,1")
     << "set logscale x 2\nset logscale y\nset xlabel 'd_k'\nset ylabel "
        "'mean ||diag(p) - p p^T||_F at step 0'\nset key bottom left\nplot ";
  for (std::size_t i = 0; i < a.arms.size(); ++i)
    gp << (i ? ", " : "") << "'" << name << ".dat' index " << i
       << " using 1:2:3:4 with yerrorlines lw 2 pt 7 title '" << a.arms[i] << "'";
  gp << "\nunset multiplot\n";
  return {"The softmax Jacobian at initialisation vs d_k",
          "Layer 0 head 0, mean over the eval queries, then over runs (95% bootstrap). A "
          "saturated softmax passes almost no gradient: this is the seed note's argument, "
          "measured.",
          renderer.render(name, dat.str(), gp.str()),
          {}};
}

}  // namespace

GroupPlots plot_group(const std::string& out, const StudyGroup& g,
                      const std::vector<RunRecord>& runs, std::string& error) {
  GroupPlots plots;
  const std::optional<GroupAxes> axes = group_axes(out, g, runs);
  if (!axes) return plots;
  const FigureRenderer renderer(out, plots.files, error);
  plots.headline.push_back(lr_window_figure(*axes, renderer));
  for (int steps : axes->budgets) plot_budget(*axes, steps, renderer, plots);
  plots.figures.push_back(jacobian_figure(*axes, renderer));
  return plots;
}

}  // namespace attnlab::app
