#include "attnlab/app/study.hpp"
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
#include "attnlab/app/run_config.hpp"

namespace attnlab::app {

namespace {

using Clock = std::chrono::steady_clock;

struct Job {
  const StudyGroup* group;
  StudyArm arm;
  int d_k;
  double lr;
  std::uint64_t seed;
  int steps;
  std::string dir;  // relative to the study folder
};

}  // namespace

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
  if (job.arm.warmup >= 0) c.warmup = job.arm.warmup;  // validated with the config
  c.param_groups.insert(c.param_groups.end(), job.arm.param_groups.begin(),
                        job.arm.param_groups.end());
  c.lr = job.lr;
  c.seed = job.seed;
  c.progress = false;
  c.out = options.out + "/" + job.dir;
  return c;
}
}  // namespace

namespace {
// The record that an earlier invocation wrote when it finished the run c describes, if the
// study config it wrote beside it is c (StudyOptions::resume); nothing otherwise, or when the
// record cannot be read (then the run trains again and replaces it). The run's own config.json is
// not the test: it holds the effective config, which the trainer resolves from this one. The
// output path is not compared, so a study folder that was moved or copied still resumes.
std::optional<RunRecord> finished_record(const TrainConfig& c) {
  const std::string record = c.out + "/record.csv";
  std::ifstream config(c.out + "/study_config.json", std::ios::binary);
  if (!config || !std::filesystem::exists(record)) return std::nullopt;
  std::ostringstream text;
  text << config.rdbuf();
  nlohmann::json written = nlohmann::json::parse(text.str(), nullptr, /*allow_exceptions=*/false);
  nlohmann::json now = nlohmann::json::parse(to_json_text(c));
  if (!written.is_object()) return std::nullopt;
  written.erase("out");
  now.erase("out");
  if (written != now) return std::nullopt;
  try {
    std::vector<RunRecord> rows = read_summary_csv(record);
    if (rows.size() == 1) return rows.front();
  } catch (const std::invalid_argument&) {
  }
  return std::nullopt;
}

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
  std::atomic<std::size_t> reused_runs{0};
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
      bool reused = false;
      if (options.resume) {
        if (std::optional<RunRecord> kept = finished_record(c)) {
          // The measured fields from the record; the grid's own from the job.
          RunRecord from_job = r;
          r = *kept;
          r.group = from_job.group;
          r.mode = from_job.mode;
          r.d_k = from_job.d_k;
          r.lr = from_job.lr;
          r.seed = from_job.seed;
          r.steps = from_job.steps;
          r.has_target = from_job.has_target;
          r.dir = from_job.dir;
          reused = true;
          ++reused_runs;
        }
      }
      if (!reused) {
        try {
          Context job_context;  // its own; the stop flag it points to is an atomic, only read
          job_context.threads = 1;
          job_context.stop = context.stop;
          job_context.backend = Backend::cpu;
          // An earlier record goes first, so that one exists only beside the config of the
          // invocation that wrote it.
          std::filesystem::remove(c.out + "/record.csv");
          const TrainResult t = train_model(c, job_context);
          r.init_eval_loss = t.init_eval_loss;
          r.final_eval_loss = t.final_eval_loss;
          r.final_eval_acc = t.final_eval_acc;
          r.final_eval_bpb = t.final_eval_bpb;
          r.steps_to_target = t.steps_to_target;
          r.diverged = t.diverged;
          r.diverged_step = t.diverged_step;
          r.init_qk_var_ratio = t.init_qk_var_ratio;
          r.seconds = t.seconds;
          r.init_jacobian = t.init_jacobian;
          r.layer0_init = t.layer0_init;
          r.layer0_final = t.layer0_final;
          // The record a later --resume takes: written last, so that it exists only for a run
          // that ended (an interrupted run has none and trains again).
          if (!t.interrupted) {
            write_text_file(c.out + "/study_config.json", to_json_text(c) + "\n");
            write_text_file(c.out + "/record.csv", summary_csv({r}));
          }
        } catch (...) {
          std::lock_guard lock(print_mutex);
          if (!failure) failure = std::current_exception();
          next.store(jobs.size());
          return;
        }
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
                                                              {"reused_runs", reused_runs.load()},
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
  outcome.reused = reused_runs.load();
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
