#include "attnlab/app/study.hpp"

#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <mutex>
#include <set>
#include <sstream>
#include <thread>

#include "attnlab/app/plot.hpp"
#include "attnlab/app/progress.hpp"

namespace attnlab::app {

namespace {

using Clock = std::chrono::steady_clock;

const StudyArm kNone{"none", Scaling::none, false, false};
const StudyArm kSqrt{"sqrt_dk", Scaling::sqrt_dk, false, false};
const StudyArm kDk{"dk", Scaling::dk, false, false};
// The stabilisers start from the default scale and add QK-norm or a learnable per-head scale.
const StudyArm kQkNorm{"qk_norm", Scaling::sqrt_dk, true, false};
const StudyArm kLearnable{"learnable", Scaling::sqrt_dk, false, true};

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
  c.optimizer = "adamw";
  c.beta1 = 0.9;
  c.beta2 = 0.95;
  c.weight_decay = 0;
  c.clip = 0;
  c.schedule = "cosine";
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

std::string gp_header(const std::string& png, int width, int height, const std::string& title,
                      const std::string& layout) {
  std::ostringstream gp;
  gp << "# attnlab study plot: re-render with `gnuplot " << png.substr(0, png.size() - 4)
     << ".gp` in this folder\n"
     << "set terminal " << gnuplot_png_terminal() << " size " << width << ',' << height
     << " font ',10'\nset termoption noenhanced\nset output '" << png
     << "'\nset grid\nset key top right\n"
     << "set multiplot layout " << layout << " title '" << title << "'\n";
  return gp.str();
}

// The three plots of one group. Returns the PNG paths (written even if gnuplot then fails).
std::vector<std::string> plot_group(const std::string& out, const StudyGroup& g,
                                    const std::vector<RunRecord>& runs, std::string& error) {
  std::vector<std::string> pngs;
  const std::string prefix = sanitize(g.name);
  std::vector<std::string> arms;
  for (const auto& a : g.arms) arms.push_back(a.name);
  const int max_dk = *std::max_element(g.d_k.begin(), g.d_k.end());
  auto rec = [&](const std::string& arm, int d, double lr, std::uint64_t seed) -> const RunRecord* {
    for (const auto& r : runs)
      if (r.group == g.name && r.mode == arm && r.d_k == d && r.lr == lr &&
          r.seed == static_cast<int>(seed))
        return &r;
    return nullptr;
  };
  double loss_init = 0;
  int n_init = 0;
  for (const auto& r : runs)
    if (r.group == g.name) {
      loss_init += r.init_eval_loss;
      ++n_init;
    }
  loss_init = n_init ? loss_init / n_init : 0;

  auto render = [&](const std::string& name, const std::string& dat, const std::string& gp) {
    write_text_file(out + "/" + name + ".dat", dat);
    pngs.push_back(out + "/" + name + ".png");
    try {
      render_gnuplot(out + "/" + name + ".gp", gp);
    } catch (const PlotError& e) {
      if (error.empty()) error = e.what();
    }
  };

  {  // 1. final eval loss vs LR: one panel per d_k, one curve per arm (seed mean).
    std::ostringstream dat, gp;
    const std::string name = prefix + "_loss_vs_lr";
    int block = 0;
    std::map<std::pair<int, std::string>, int> index;
    for (int d : g.d_k)
      for (const auto& arm : arms) {
        dat << "# d_k " << d << " mode " << arm
            << "\n# lr final_eval_loss(seed mean; diverged counts as loss_init) diverged_runs\n";
        for (double lr : g.lrs) {
          double sum = 0;
          int n = 0, div = 0;
          for (auto seed : g.seeds)
            if (const RunRecord* r = rec(arm, d, lr, seed)) {
              sum += r->diverged ? r->init_eval_loss : r->final_eval_loss;
              div += r->diverged ? 1 : 0;
              ++n;
            }
          if (n) dat << lr << ' ' << sum / n << ' ' << div << '\n';
        }
        dat << "\n\n";
        index[{d, arm}] = block++;
      }
    gp << gp_header(name + ".png", 450 * static_cast<int>(g.d_k.size()), 450,
                    g.name + ": final eval loss vs peak LR (dashed: loss at init)",
                    "1," + std::to_string(g.d_k.size()))
       << "set logscale x\nset xrange [" << g.lrs.front() / 1.5 << ':' << g.lrs.back() * 1.5
       << "]\nset xlabel 'peak learning rate'\nset ylabel 'final eval loss'\n"
       << "set yrange [0:" << std::ceil(loss_init * 1.15) << "]\n";
    for (int d : g.d_k) {
      gp << "set title 'd_k = " << d << "'\nplot ";
      for (std::size_t a = 0; a < arms.size(); ++a)
        gp << "'" << name << ".dat' index " << index[{d, arms[a]}]
           << " using 1:2 with linespoints lw 2 pt 7 title '" << arms[a] << "', ";
      gp << loss_init << " with lines dt 2 lc rgb 'gray' notitle\n";
    }
    gp << "unset multiplot\n";
    render(name, dat.str(), gp.str());
  }

  const std::uint64_t seed0 = g.seeds.front();
  {  // 2. training curves at the largest d_k: one panel per LR, one curve per arm (first seed).
    std::ostringstream dat, gp;
    const std::string name = prefix + "_curves_dk" + std::to_string(max_dk);
    int block = 0;
    std::map<std::pair<double, std::string>, int> index;
    for (double lr : g.lrs)
      for (const auto& arm : arms) {
        const RunRecord* r = rec(arm, max_dk, lr, seed0);
        dat << "# lr " << lr << " mode " << arm << "\n# step eval_loss eval_acc\n";
        if (r) {
          const Table t = read_csv(out + "/" + r->dir + "/metrics.csv");
          const int cs = t.col("step"), cl = t.col("eval_loss"), ca = t.col("eval_acc");
          for (const auto& row : t.rows)
            if (cs >= 0 && cl >= 0 && ca >= 0 && std::isfinite(row[cl]))
              dat << row[cs] << ' ' << row[cl] << ' ' << row[ca] << '\n';
        }
        dat << "\n\n";
        index[{lr, arm}] = block++;
      }
    const int cols = std::min<int>(3, static_cast<int>(g.lrs.size()));
    const int rows = (static_cast<int>(g.lrs.size()) + cols - 1) / cols;
    gp << gp_header(name + ".png", 450 * cols, 380 * rows,
                    g.name + ": eval loss during training at d_k = " + std::to_string(max_dk),
                    std::to_string(rows) + "," + std::to_string(cols))
       << "set xlabel 'step'\nset ylabel 'eval loss'\nset yrange [0:" << std::ceil(loss_init * 1.15)
       << "]\n";
    for (double lr : g.lrs) {
      gp << "set title 'peak lr = " << lr_label(lr) << "'\nplot ";
      for (std::size_t a = 0; a < arms.size(); ++a)
        gp << (a ? ", " : "") << "'" << name << ".dat' index " << index[{lr, arms[a]}]
           << " using 1:2 with lines lw 2 title '" << arms[a] << "'";
      gp << '\n';
    }
    gp << "unset multiplot\n";
    render(name, dat.str(), gp.str());
  }

  {  // 3. attention health over training at the largest d_k, for every arm at every LR.
    std::ostringstream dat, gp;
    const std::string name = prefix + "_attention_dk" + std::to_string(max_dk);
    // The middle LR of the sweep: one LR for every arm, so the arms are compared like for like.
    const double lr = g.lrs[g.lrs.size() / 2];
    int block = 0;
    for (const auto& arm : arms) {
      const RunRecord* r = rec(arm, max_dk, lr, seed0);
      dat << "# mode " << arm << " lr " << lr
          << "\n# step entropy max_abs_logit saturated_fraction jacobian_norm recall_mass\n";
      if (r) {
        const Table t = read_csv(out + "/" + r->dir + "/metrics.csv");
        const int cs = t.col("step"), ce = t.col("l0h0_entropy"), cm = t.col("l0h0_max_logit"),
                  cf = t.col("l0h0_saturated"), cj = t.col("l0h0_jacobian"),
                  cr = t.col("l0h0_recall_mass");
        for (const auto& row : t.rows) {
          if (cs < 0 || ce < 0 || cm < 0 || cf < 0 || cj < 0) break;
          dat << row[cs] << ' ' << row[ce] << ' ' << row[cm] << ' ' << row[cf] << ' ' << row[cj]
              << ' ' << (cr >= 0 ? row[cr] : std::nan("")) << '\n';
        }
      }
      dat << "\n\n";
      ++block;
    }
    gp << gp_header(name + ".png", 1100, 800,
                    g.name + ": attention during training, d_k = " + std::to_string(max_dk) +
                        ", peak lr = " + lr_label(lr),
                    "2,2")
       << "set xlabel 'step'\n";
    const char* titles[4] = {"attention entropy (nats)", "max |scaled logit| (log scale)",
                             "fraction of rows with max weight > 0.99",
                             "attention mass on the correct key"};
    const int cols[4] = {2, 3, 4, 6};
    for (int p = 0; p < 4; ++p) {
      gp << "set title '" << titles[p] << "'\n"
         << (p == 1 ? "set logscale y\n" : "unset logscale y\n")
         << (p >= 2 ? "set yrange [0:1.05]\n" : "set autoscale y\n") << "plot ";
      for (int a = 0; a < block; ++a)
        gp << (a ? ", " : "") << "'" << name << ".dat' index " << a << " using 1:" << cols[p]
           << " with lines lw 2 title '" << arms[static_cast<std::size_t>(a)] << "'";
      gp << '\n';
    }
    gp << "unset multiplot\n";
    render(name, dat.str(), gp.str());
  }
  return pngs;
}

}  // namespace

StudyPlan study_preset(const std::string& preset) {
  StudyPlan plan;
  plan.preset = preset;
  if (preset == "micro") {
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
  } else if (preset == "quick") {
    StudyGroup g;
    g.name = "recall/adamw";
    g.base = study_base(kQuickSteps, kQuickBatch);
    // 16 pairs over 32 keys and 32 values (T = 17): learnable by one head within the quick
    // budget; the task defaults (32 pairs over 64 symbols) are the full preset's.
    g.base.task.keys = 32;
    g.base.task.values = 32;
    g.base.task.pairs = 16;
    g.arms = {kNone, kSqrt, kDk};
    g.d_k = {16, 64, 256};
    g.lrs = {1e-3, 3e-3, 1e-2, 3e-2, 1e-1};
    g.seeds = {0, 1};
    plan.groups.push_back(g);
  } else if (preset == "full") {
    StudyGroup a;
    a.name = "recall/adamw";
    a.base = study_base(2000, 32);
    a.arms = {kNone, kSqrt, kDk, kQkNorm, kLearnable};
    a.d_k = {4, 16, 64, 256, 1024};
    a.lrs = {3e-4, 1e-3, 3e-3, 1e-2, 3e-2, 1e-1, 3e-1};
    a.seeds = {0, 1, 2};
    plan.groups.push_back(a);
    StudyGroup s = a;
    s.name = "recall/sgd";
    s.base.optimizer = "sgd";
    s.base.momentum = 0.9;
    s.arms = {kNone, kSqrt, kDk};
    s.lrs = {1e-2, 3e-2, 1e-1, 3e-1, 1, 3, 10};
    plan.groups.push_back(s);
    StudyGroup m = a;
    m.name = "mqar/adamw";
    m.base.task.kind = TaskKind::mqar;
    m.base.task.pairs = 16;
    m.base.task.queries = 8;
    m.base.model.layers = 2;
    m.base.model.positions = PositionEncoding::learned;
    m.base.model.block.attention.sdpa.causal = true;
    m.arms = {kNone, kSqrt, kDk};
    m.d_k = {16, 64, 256};
    plan.groups.push_back(m);
  } else {
    throw std::invalid_argument("study: preset expected micro|quick|full, got '" + preset + "'");
  }
  return plan;
}

namespace {
TrainConfig job_config(const Job& job, const StudyOptions& options) {
  TrainConfig c = job.group->base;
  if (options.steps > 0) {
    c.steps = options.steps;
    c.warmup = options.steps / 10;
    c.eval_every = std::max(1, options.steps / 20);
  }
  c.model.block.attention.sdpa.scaling = job.arm.scaling;
  c.model.block.attention.qk_norm = job.arm.qk_norm;
  c.model.block.attention.learnable_scale = job.arm.learnable_scale;
  c.model.block.attention.d_k = static_cast<std::size_t>(job.d_k);
  c.lr = job.lr;
  c.seed = job.seed;
  c.progress = false;
  c.out = options.out + "/" + job.dir;
  return c;
}
}  // namespace

StudyOutcome run_study(const StudyPlan& plan, const StudyOptions& options, const Context& context) {
  check_arg(options.jobs >= 1, "study", "jobs", ">= 1", std::to_string(options.jobs));
  const auto t0 = Clock::now();
  std::filesystem::create_directories(options.out);
  std::vector<Job> jobs;
  // Largest d_k first: the slowest runs start early, so the parallel tail is short.
  for (const auto& g : plan.groups) {
    std::vector<int> dks = g.d_k;
    std::sort(dks.rbegin(), dks.rend());
    for (int d : dks)
      for (const auto& arm : g.arms)
        for (double lr : g.lrs)
          for (auto seed : g.seeds)
            jobs.push_back({&g, arm, d, lr, seed,
                            "runs/" + sanitize(g.name) + "/" + arm.name + "_dk" +
                                std::to_string(d) + "_lr" + lr_label(lr) + "_s" +
                                std::to_string(seed)});
  }
  for (const Job& job : jobs) {  // a bad grid fails before any run starts
    try {
      validate(job_config(job, options));
    } catch (const std::invalid_argument& e) {
      throw std::invalid_argument("study: group '" + job.group->name + "', run " + job.dir + ": " +
                                  e.what());
    }
  }
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
  write_text_file(outcome.summary_csv, summary_csv(records));
  write_text_file(outcome.summary_md,
                  summary_markdown(records, "attnlab study, preset '" + plan.preset +
                                                "': attention scaling vs training stability"));
  for (const auto& g : plan.groups) {
    const auto pngs = plot_group(options.out, g, records, outcome.plot_error);
    outcome.plots.insert(outcome.plots.end(), pngs.begin(), pngs.end());
  }
  outcome.seconds = std::chrono::duration<double>(Clock::now() - t0).count();
  return outcome;
}

}  // namespace attnlab::app
