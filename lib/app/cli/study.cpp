// attnlab study: the scaling study's grid of training runs, its tables, figures and report.
#include <cstdio>

#include "attnlab/app/study.hpp"
#include "commands.hpp"

namespace attnlab::cli {

using namespace attnlab::app;

void add_study_command(CLI::App& cli, StudyCommand& s) {
  s.cmd =
      cli.add_subcommand("study", "the scaling study: mode x d_k x LR x seeds, tables and plots");
  CLI::App& study = *s.cmd;
  auto* preset_option = add_enum_option(study, "--preset", s.preset, "the study's grid");
  study
      .add_option("--config", s.config,
                  "run a custom grid: a study plan as JSON (e.g. data/configs/study_micro.json)")
      ->check(CLI::ExistingFile)
      ->excludes(preset_option);
  study.add_flag("--dump-config", s.dump_config,
                 "print the plan (preset or --config) as JSON and exit: a start for a custom grid");
  study.add_option("--jobs", s.options.jobs, "training runs in parallel (each single-threaded)")
      ->check(CLI::Range(1, 256))
      ->capture_default_str();
  study.add_option("--out", s.options.out, "output directory")->capture_default_str();
  study.add_option("--steps", s.options.steps, "override the preset's training steps")
      ->check(CLI::Range(1, 100000000));
  study.add_flag("--resume", s.options.resume,
                 "reuse each run in --out that finished with the same config (a stopped study "
                 "goes on where it stopped; a grown grid runs only its new runs)");
  study.add_flag("--report-only", s.report_only,
                 "write summary.md, the figures and report.html again from the finished study "
                 "in --out (its summary.csv and runs/; no training)");
  study.add_flag("--quiet", s.quiet, "no progress output");
}

int run_study_command(StudyCommand& s, const CliContext& cli) {
  s.options.progress = !s.quiet;
  StudyPlan plan;
  if (s.config.empty())
    plan = study_preset(s.preset);
  else
    read_study_file(s.config, plan);
  if (s.dump_config) {
    std::printf("%s\n", to_json_text(plan).c_str());
    return 0;
  }
  const StudyOutcome r = s.report_only
                             ? report_study(plan, s.options)
                             : run_study(plan, s.options, Context{});  // each job: its own
  if (s.report_only)
    std::printf("study '%s': the outputs of %zu runs written again in %.1f s\n",
                plan.preset.c_str(), r.runs.size(), r.seconds);
  else
    std::printf("\nstudy '%s': %zu runs (%zu reused) in %.0f s\n", plan.preset.c_str(),
                r.runs.size(), r.reused, r.seconds);
  std::printf("report: %s\n", r.report_html.c_str());
  std::printf("table:  %s\n", r.summary_md.c_str());
  std::printf("csv:    %s\n", r.summary_csv.c_str());
  for (const auto& p : r.plots) std::printf("plot:   %s\n", p.c_str());
  if (!r.plot_error.empty()) return error_line(cli, r.plot_error, kExitFailure);
  return 0;
}

}  // namespace attnlab::cli
