#include "attnlab/app/study.hpp"

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

namespace {

using Clock = std::chrono::steady_clock;

const StudyArm kNone{"none", Scaling::none, false, false};
const StudyArm kSqrt{"sqrt_dk", Scaling::sqrt_dk, false, false};
const StudyArm kDk{"dk", Scaling::dk, false, false};
// The stabilisers start from the default scale and add QK-norm or a learnable per-head scale.
const StudyArm kQkNorm{"qk_norm", Scaling::sqrt_dk, true, false};
const StudyArm kLearnable{"learnable", Scaling::sqrt_dk, false, true};
// The magnitude control: µP's 8/d_k (equal to 1/√d_k at d_k = 64, as microsoft/mup sets it) and
// 4/d_k, and 1/(4√d_k), so that the exponent (−1 against −½) and the constant can be told apart:
// at d_k = 16, 4/d_k equals 1/√d_k and 1/d_k equals 1/(4√d_k).
const StudyArm kDkTimes8{"dk_x8", Scaling::dk, false, false, 8};
const StudyArm kDkTimes4{"dk_x4", Scaling::dk, false, false, 4};
const StudyArm kSqrtDkQuarter{"sqrt_dk_x0.25", Scaling::sqrt_dk, false, false, 0.25};
// Gemma 2's attention softcap, 50, on the default scale.
const StudyArm kSoftcap{"softcap", Scaling::sqrt_dk, false, false, 1, 50};
// The modern block's attention (with RoPE in the group's base): each scaling mode with
// qk-layernorm, and each with the softcap, so that the report can say whether the mode still
// matters once q and k are normalised or the logits capped.
const StudyArm kNoneQk{"none_qknorm", Scaling::none, true, false};
const StudyArm kSqrtQk{"sqrt_dk_qknorm", Scaling::sqrt_dk, true, false};
const StudyArm kDkQk{"dk_qknorm", Scaling::dk, true, false};
const StudyArm kNoneCap{"none_softcap", Scaling::none, false, false, 1, 50};
const StudyArm kSqrtCap{"sqrt_dk_softcap", Scaling::sqrt_dk, false, false, 1, 50};
const StudyArm kDkCap{"dk_softcap", Scaling::dk, false, false, 1, 50};

// The study's model: 1 layer, 1 head, attention-only, d_model 64, d_v = 64, LayerNorm (so the
// attention input has unit RMS), no positional embedding (recall is order-free), AdamW(0.9, 0.95)
// without weight decay or clipping, warmup then cosine decay.
TrainConfig study_base(int steps, int batch) {
  TrainConfig c;
  c.task.kind = TaskKind::recall;
  c.model.block.attention.d_model = 64;
  c.model.block.attention.heads = 1;
  c.model.block.attention.d_v = 64;
  c.model.layers = 1;
  c.model.block.attn_only = true;
  c.model.block.norm = Norm::layernorm;
  c.model.positions = PositionEncoding::none;
  c.optimizer = OptimizerKind::adamw;
  c.beta1 = 0.9;
  c.beta2 = 0.95;
  c.weight_decay = 0;
  c.clip = 0;
  c.schedule = LrScheduleKind::warmup_cosine;
  c.steps = steps;
  c.warmup = steps / 10;
  c.batch = batch;
  c.eval_every = std::max(1, steps / 20);
  c.eval_size = 256;
  c.progress = false;
  return c;
}

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

struct Job {
  const StudyGroup* group;
  StudyArm arm;
  int d_k;
  double lr;
  std::uint64_t seed;
  int steps;
  std::string dir;  // relative to the study folder
};

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

struct GroupPlots {
  std::vector<ReportFigure> headline;
  std::vector<ReportFigure> figures;
  std::vector<std::string> files;
};

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

// The figures of one group: the LR window vs d_k (headline), and per budget the loss vs LR, the
// curves and attention health at the largest d_k, the heatmaps, and the Jacobian at init.
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

// n peak LRs from `from` up in half-decades (1e-4, 3.16e-4, 1e-3, ...), rounded to 3 digits.
std::vector<double> half_decades(double from, int n) {
  std::vector<double> v;
  for (int i = 0; i < n; ++i) {
    const double x = from * std::pow(10.0, 0.5 * i);
    char buf[32];
    std::snprintf(buf, sizeof buf, "%.3g", x);
    v.push_back(std::strtod(buf, nullptr));
  }
  return v;
}

// The quick preset's grid: the three modes × d_k {16, 64, 256} × 8 peak LRs from 1e-4 to 0.316 in
// half-decades (wide enough that every mode's window shows both edges) × 5 seeds, 400 steps.
StudyGroup quick_group() {
  StudyGroup g;
  g.name = "recall/adamw";
  g.base = study_base(kQuickSteps, kQuickBatch);
  // 16 pairs over 32 keys and 32 values: learnable by one head within the quick budget; the task
  // defaults (32 pairs over 64 symbols) take 3-4x longer per step.
  g.base.task.keys = 32;
  g.base.task.values = 32;
  g.base.task.pairs = 16;
  g.arms = {kNone, kSqrt, kDk};
  g.d_k = {16, 64, 256};
  g.lrs = half_decades(1e-4, 8);
  g.seeds = {0, 1, 2, 3, 4};
  return g;
}

// Wortsman et al. 2023's small-scale proxies ("Small-scale proxies for large-scale Transformer
// training instabilities"), scaled to 2 cores: character-level Shakespeare, block 64, batch 16;
// 2 pre-LN layers, MLP 4C, causal, RoPE, no biases; AdamW (0.9, 0.95), ε 1e-8, clip 1,
// independent weight decay 1e-4, z-loss 1e-4 (their defaults), warmup 5%, cosine to 1e-5; their
// LR grid {3e-4 ... 0.3}, 2 seeds. One group per width d_model 64, 128, 256 at the fixed head
// dimension 32 (2, 4, 8 heads), so the tables and the checks compare widths. Arms: 1/√d_k, with
// qk-layernorm, 1/d_k (their Fig. E.6) and Gemma 2's attention softcap 50.
// Sized from a timing on a Zen 3 core: a step took 17.5, 49 and 194 ms at width 64, 128, 256 (20
// steps; 0.26 s for the three), so 168 runs of 300 steps are about 4,400 core-seconds of steps
// plus about 1.5 s of setup and evals per run: under 45 minutes with --jobs 2. What was cut to fit
// (theirs -> here): 1e5 steps -> 300; batch 256 x 512 tokens -> 16 x 64 characters; C4 -> the
// plays; depth scaled with width -> 2 layers; 3 seeds -> 2; warmup 5k steps -> 5%; bf16 -> fp32.
StudyGroup proxies_group(int d_model, int steps) {
  StudyGroup g;
  g.name = "proxies/w" + std::to_string(d_model);
  TrainConfig& c = g.base;
  c.task.kind = TaskKind::text;
  c.task.block = 64;
  c.data_file = "data/shakespeare/plays.txt";
  c.model.layers = 2;
  c.model.block.attention.d_model = static_cast<std::size_t>(d_model);
  c.model.block.attention.heads = static_cast<std::size_t>(d_model / 32);
  c.model.block.attention.d_v = 32;
  c.model.block.attention.sdpa.causal = true;
  c.model.block.attn_only = false;
  c.model.block.bias = false;
  c.model.block.norm = Norm::layernorm;
  c.model.positions = PositionEncoding::rope;
  c.optimizer = OptimizerKind::adamw;
  c.beta1 = 0.9;
  c.beta2 = 0.95;
  c.clip = 1;
  c.weight_decay = 1e-4;
  c.decay = WeightDecayMode::independent;
  c.z_loss = 1e-4;
  c.schedule = LrScheduleKind::warmup_cosine;
  c.min_lr = 1e-5;
  c.steps = steps;
  c.warmup = steps / 20;
  c.batch = 16;
  c.eval_every = std::max(1, steps / 10);
  c.eval_size = 64;
  c.progress = false;
  g.arms = {kSqrt, kQkNorm, kDk, kSoftcap};
  g.d_k = {32};
  g.lrs = {3e-4, 1e-3, 3e-3, 1e-2, 3e-2, 1e-1, 3e-1};
  g.seeds = {0, 1};
  return g;
}

}  // namespace

StudyPlan study_preset(const std::string& preset) {
  return study_preset(parse_enum<StudyPreset>(preset));
}

StudyPlan study_preset(StudyPreset preset) {
  StudyPlan plan;
  plan.preset = enum_name(preset);
  if (preset == StudyPreset::micro) {
    StudyGroup g;
    g.name = "recall/adamw";
    g.base = study_base(20, 8);
    g.base.task.keys = 8;
    g.base.task.values = 8;
    g.base.task.pairs = 4;
    g.base.model.block.attention.d_model = 16;
    g.base.model.block.attention.d_v = 16;
    g.base.eval_size = 32;
    g.base.eval_every = 10;
    g.arms = {kNone, kSqrt, kDk};
    g.d_k = {4, 16};
    g.lrs = {1e-2, 1e-1};
    g.seeds = {0};
    plan.groups.push_back(g);
  } else if (preset == StudyPreset::quick) {
    plan.groups.push_back(quick_group());
  } else if (preset == StudyPreset::full) {
    // Sized to finish within 60 minutes on 2 cores with --jobs 2 (data/results/full/study.json
    // gives its wall time). The cuts that make it fit: the recall task is the quick preset's (16
    // pairs) at d_k <= 256, and only the three scaling modes on recall get the 1600-step budget
    // and 5 seeds at every budget; the stabilisers have 5 seeds at 400 steps; SGD and mqar have 3
    // seeds at 400 steps (mqar: 6 LRs up to 0.0316); the text arm 2 seeds of 150 steps at 5 LRs.
    // The magnitude control (8/d_k, 4/d_k, 1/(4√d_k) beside 1/√d_k and 1/d_k, in a group of its
    // own so that its tables compare the five within the same seeds) has 3 seeds at 400 steps, as
    // has the modern block's attention (RoPE; each mode with qk-layernorm, and with a softcap).
    StudyGroup a = quick_group();
    a.budgets = {kQuickSteps, 4 * kQuickSteps};
    plan.groups.push_back(a);
    StudyGroup st = quick_group();
    st.name = "recall/adamw-stabilisers";
    st.arms = {kQkNorm, kLearnable};
    plan.groups.push_back(st);
    StudyGroup mag = quick_group();
    mag.name = "recall/adamw-magnitude";
    mag.arms = {kSqrtDkQuarter, kSqrt, kDk, kDkTimes4, kDkTimes8};
    mag.seeds = {0, 1, 2};
    plan.groups.push_back(mag);
    StudyGroup mod = quick_group();
    mod.name = "recall/adamw-modern";
    mod.base.model.positions = PositionEncoding::rope;
    mod.arms = {kNoneQk, kSqrtQk, kDkQk, kNoneCap, kSqrtCap, kDkCap};
    mod.seeds = {0, 1, 2};
    plan.groups.push_back(mod);
    StudyGroup s = quick_group();
    s.name = "recall/sgd";
    s.base.optimizer = OptimizerKind::sgd;
    s.base.momentum = 0.9;
    s.lrs = half_decades(1e-2, 8);
    s.seeds = {0, 1, 2};
    plan.groups.push_back(s);
    StudyGroup m = quick_group();
    m.name = "mqar/adamw";
    m.base.task.kind = TaskKind::mqar;
    m.base.task.keys = 32;
    m.base.task.values = 32;
    m.base.task.pairs = 8;
    m.base.task.queries = 4;
    m.base.model.layers = 2;
    m.base.model.positions = PositionEncoding::learned;
    m.base.model.block.attention.sdpa.causal = true;
    m.lrs = half_decades(1e-4, 6);
    m.seeds = {0, 1, 2};
    plan.groups.push_back(m);
    StudyGroup t = quick_group();
    t.name = "text/adamw";
    t.base.task.kind = TaskKind::text;
    t.base.task.block = 64;
    t.base.data_file = "data/shakespeare/plays.txt";
    t.base.model.layers = 2;
    t.base.model.block.attention.heads = 2;
    t.base.model.block.attention.d_model = 64;
    t.base.model.block.attention.d_v = 32;
    t.base.model.block.attn_only = false;
    t.base.model.block.attention.sdpa.causal = true;
    t.base.model.positions = PositionEncoding::learned;
    t.base.steps = 150;
    t.base.warmup = 15;
    t.base.eval_every = 15;
    t.base.batch = 16;
    t.base.eval_size = 64;
    t.lrs = half_decades(1e-3, 5);
    t.seeds = {0, 1};
    plan.groups.push_back(t);
  } else if (preset == StudyPreset::proxies) {
    for (int width : {64, 128, 256}) plan.groups.push_back(proxies_group(width, kProxiesSteps));
  }
  return plan;
}

namespace {
TrainConfig job_config(const Job& job, const StudyOptions& options) {
  TrainConfig c = job.group->base;
  if (job.steps != c.steps) {  // a budget of the grid, or --steps: warmup and evals scale with it
    c.steps = job.steps;
    c.warmup = job.steps / 10;
    c.eval_every = std::max(1, job.steps / 20);
  }
  c.model.block.attention.sdpa.scaling = job.arm.scaling;
  if (job.arm.scale_multiplier != 1) {
    c.model.block.attention.sdpa.scale =
        job.arm.scale_multiplier *
        scaling_factor(job.arm.scaling, static_cast<std::size_t>(job.d_k));
  }
  c.model.block.attention.qk_norm = job.arm.qk_norm;
  c.model.block.attention.learnable_scale = job.arm.learnable_scale;
  if (job.arm.softcap != 0) c.model.block.attention.sdpa.softcap = job.arm.softcap;  // validated
  c.model.block.attention.d_k = static_cast<std::size_t>(job.d_k);
  c.lr = job.lr;
  c.seed = job.seed;
  c.progress = false;
  c.out = options.out + "/" + job.dir;
  return c;
}
}  // namespace

namespace {
// Records read from summary.csv, with has_target (not in the file) from their groups' tasks.
std::vector<RunRecord> with_targets(std::vector<RunRecord> records,
                                    const std::vector<StudyGroup>& groups, const StudyPlan& plan,
                                    const StudyOptions& options) {
  for (auto& r : records) {
    const auto g = std::find_if(groups.begin(), groups.end(),
                                [&](const StudyGroup& x) { return x.name == r.group; });
    if (g == groups.end())
      throw std::invalid_argument("study --report-only: " + options.out +
                                  "/summary.csv has group '" + r.group + "', which the plan '" +
                                  plan.preset + "' does not have");
    r.has_target = g->base.task.kind != TaskKind::text;
  }
  return records;
}

// summary.csv, summary.md, the figures and report.html of a finished study's records.
StudyOutcome write_outputs(const StudyPlan& plan, const std::vector<StudyGroup>& groups,
                           std::vector<RunRecord> records, const StudyOptions& options,
                           double wall) {
  mark_working(records);
  StudyOutcome outcome;
  outcome.runs = records;
  double var = 0;
  for (const auto& r : records) var += r.init_qk_var_ratio;
  if (options.progress && !records.empty())
    std::printf(
        "premise check: Var(q.k)/d_k at step 0 = %.3f (mean over %zu runs; ~1 means q.k "
        "has variance ~d_k)\n",
        var / static_cast<double>(records.size()), records.size());
  outcome.summary_csv = options.out + "/summary.csv";
  outcome.summary_md = options.out + "/summary.md";
  outcome.report_html = options.out + "/report.html";
  const std::string title =
      "attnlab study, preset '" + plan.preset + "': attention scaling vs training stability";
  write_text_file(outcome.summary_csv, summary_csv(records));
  write_text_file(outcome.summary_md, summary_markdown(records, title));
  ReportPage page;
  page.title = title;
  page.sections = summary_sections(records);
  for (const auto& g : groups) {
    GroupPlots p = plot_group(options.out, g, records, outcome.plot_error);
    outcome.plots.insert(outcome.plots.end(), p.files.begin(), p.files.end());
    page.headline.insert(page.headline.end(), p.headline.begin(), p.headline.end());
    page.figure_groups.emplace_back(g.name, std::move(p.figures));
  }
  double cpu = 0;
  for (const auto& r : records) cpu += r.seconds;
  std::ostringstream intro;
  intro << "<p>" << records.size() << " training runs";
  if (wall > 0)
    intro << " in " << static_cast<long>(wall) << " s of wall time with " << options.jobs
          << " job(s)";
  intro << "; the runs' own times add up to " << static_cast<long>(cpu)
        << " s. Each run trains one model from scratch; "
           "within a seed every arm starts from the same weights and sees the same batches. The "
           "data behind every figure is in the <code>.dat</code> file beside it, every run's "
           "numbers in <code>summary.csv</code>, and its curves in <code>runs/</code>. 1/d_k is "
           "the µP choice, made on purpose: it is an arm of the study, not a mistake.</p>";
  page.intro_html = intro.str();
  write_text_file(outcome.report_html, report_html(page));
  return outcome;
}
}  // namespace

StudyOutcome run_study(const StudyPlan& plan, const StudyOptions& options, const Context& context) {
  check_arg(options.jobs >= 1, "study", "jobs", ">= 1", std::to_string(options.jobs));
  const auto t0 = Clock::now();
  std::filesystem::create_directories(options.out);
  std::vector<Job> jobs;
  // The groups with their tasks prepared once (a text task reads its characters here).
  std::vector<StudyGroup> groups = plan.groups;
  for (auto& g : groups) {
    try {
      prepare_task(g.base);
    } catch (const std::exception& e) {
      throw std::invalid_argument("study: group '" + g.name + "': " + e.what());
    }
  }
  // Largest budget and d_k first: the slowest runs start early, so the parallel tail is short.
  for (const auto& g : groups) {
    std::vector<int> dks = g.d_k;
    std::sort(dks.rbegin(), dks.rend());
    std::vector<int> budgets = g.budgets.empty() ? std::vector<int>{g.base.steps} : g.budgets;
    if (options.steps > 0) budgets = {options.steps};
    std::sort(budgets.rbegin(), budgets.rend());
    for (int steps : budgets)
      for (int d : dks)
        for (const auto& arm : g.arms)
          for (double lr : g.lrs)
            for (auto seed : g.seeds)
              jobs.push_back({&g, arm, d, lr, seed, steps,
                              "runs/" + sanitize(g.name) + "/" + arm.name + "_dk" +
                                  std::to_string(d) + "_lr" + lr_label(lr) + "_s" +
                                  std::to_string(seed) +
                                  (budgets.size() > 1 ? "_n" + std::to_string(steps) : "")});
  }
  // A bad grid fails before any run starts; so does one whose largest run, as many times as run
  // at once, would not fit in memory.
  MemoryEstimate largest;
  for (const Job& job : jobs) {
    try {
      const MemoryEstimate e = estimate_memory(job_config(job, options));  // validates the config
      if (e.total() > largest.total()) largest = e;
    } catch (const std::invalid_argument& e) {
      throw std::invalid_argument("study: group '" + job.group->name + "', run " + job.dir + ": " +
                                  e.what());
    }
  }
  check_memory(largest, "study",
               double(std::min<std::size_t>(std::size_t(options.jobs), jobs.size())));
  std::vector<RunRecord> records(jobs.size());
  std::atomic<std::size_t> next{0};
  std::atomic<std::size_t> done{0};
  std::mutex print_mutex;
  std::exception_ptr failure;
  ProgressFn progress = options.progress ? terminal_progress() : ProgressFn();

  auto worker = [&] {
    while (true) {
      const std::size_t i = next.fetch_add(1);
      if (i >= jobs.size()) return;
      const Job& job = jobs[i];
      const TrainConfig c = job_config(job, options);
      RunRecord& r = records[i];
      r.group = job.group->name;
      r.mode = job.arm.name;
      r.d_k = job.d_k;
      r.lr = job.lr;
      r.seed = static_cast<int>(job.seed);
      r.steps = c.steps;
      r.has_target = c.task.kind != TaskKind::text;
      r.dir = job.dir;
      try {
        Context job_context;  // its own; the stop flag it points to is an atomic, only read
        job_context.threads = 1;
        job_context.stop = context.stop;
        job_context.backend = Backend::cpu;
        const TrainResult t = train_model(c, job_context);
        r.init_eval_loss = t.init_eval_loss;
        r.final_eval_loss = t.final_eval_loss;
        r.final_eval_acc = t.final_eval_acc;
        r.steps_to_target = t.steps_to_target;
        r.diverged = t.diverged;
        r.diverged_step = t.diverged_step;
        r.init_qk_var_ratio = t.init_qk_var_ratio;
        r.seconds = t.seconds;
        r.init_jacobian = t.init_jacobian;
        r.layer0_init = t.layer0_init;
        r.layer0_final = t.layer0_final;
      } catch (...) {
        std::lock_guard lock(print_mutex);
        if (!failure) failure = std::current_exception();
        next.store(jobs.size());
        return;
      }
      const std::size_t n = ++done;
      if (!progress) continue;
      std::lock_guard lock(print_mutex);
      char last[160];
      std::snprintf(last, sizeof last, "%s d_k=%d lr=%s: %s", r.mode.c_str(), r.d_k,
                    lr_label(r.lr).c_str(),
                    r.diverged ? ("diverged at step " + std::to_string(r.diverged_step)).c_str()
                               : ("eval loss " + std::to_string(r.final_eval_loss).substr(0, 6) +
                                  " acc " + std::to_string(r.final_eval_acc).substr(0, 5))
                                     .c_str());
      progress({"run", 0, n, jobs.size(), std::chrono::duration<double>(Clock::now() - t0).count(),
                last, true});
    }
  };
  if (options.progress)
    std::printf("study '%s': %zu runs, %d in parallel, into %s\n", plan.preset.c_str(), jobs.size(),
                options.jobs, options.out.c_str());
  std::vector<std::thread> threads;
  const int n_threads = std::min<int>(options.jobs, static_cast<int>(jobs.size()));
  for (int t = 0; t < n_threads; ++t) threads.emplace_back(worker);
  for (auto& t : threads) t.join();
  progress = nullptr;  // ends the bar's line
  if (failure) std::rethrow_exception(failure);

  const double wall = std::chrono::duration<double>(Clock::now() - t0).count();
  write_text_file(options.out + "/study.json", nlohmann::json{{"preset", plan.preset},
                                                              {"runs", records.size()},
                                                              {"jobs", options.jobs},
                                                              {"wall_seconds", wall}}
                                                       .dump(2) +
                                                   "\n");
  // The records as summary.csv holds them (its precision), so that report_study, which reads
  // them from there, writes the same pages again.
  const std::string csv = options.out + "/summary.csv";
  write_text_file(csv, summary_csv(records));
  StudyOutcome outcome = write_outputs(
      plan, groups, with_targets(read_summary_csv(csv), groups, plan, options), options, wall);
  outcome.seconds = wall;
  return outcome;
}

StudyOutcome report_study(const StudyPlan& plan, const StudyOptions& options) {
  const auto t0 = Clock::now();
  std::vector<RunRecord> records = read_summary_csv(options.out + "/summary.csv");
  double wall = 0;
  int jobs = options.jobs;
  if (std::ifstream in(options.out + "/study.json"); in) {
    try {
      const auto j = nlohmann::json::parse(in);
      wall = j.value("wall_seconds", 0.0);
      jobs = j.value("jobs", jobs);
    } catch (const nlohmann::json::exception& e) {
      throw std::invalid_argument(options.out + "/study.json: " + e.what());
    }
  }
  StudyOptions o = options;
  o.jobs = jobs;
  StudyOutcome outcome = write_outputs(
      plan, plan.groups, with_targets(std::move(records), plan.groups, plan, options), o, wall);
  outcome.seconds = std::chrono::duration<double>(Clock::now() - t0).count();
  return outcome;
}

}  // namespace attnlab::app
