// The √d_k stability study: sweeps scaling mode × d_k × learning rate × seed, trains every run
// with train_model, and writes summary.csv, summary.md, gnuplot SVGs (data and scripts kept) and
// report.html.
//
// Honesty rules built in: within a seed every mode gets the same initial weights and the same data
// stream (train_model seeds both from the seed only); everything but the swept factors is fixed
// per preset; the LR is swept for every mode, so no mode is judged at another mode's best LR.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "attnlab/app/summary.hpp"
#include "attnlab/app/trainer.hpp"

namespace attnlab::app {

// One arm of the sweep: a scaling mode, or a stabiliser (QK-norm, learnable scale), or a scaling
// mode times a constant (the magnitude control: "dk_x8" is µP's 8/d_k, "sqrt_dk_x0.25" 1/(4√d_k)).
struct StudyArm {
  std::string name;  // "none", "sqrt_dk", "dk", "qk_norm", "learnable", "dk_x8", ...
  Scaling scaling = Scaling::sqrt_dk;
  bool qk_norm = false;
  bool learnable_scale = false;
  // Not 1: the run's attention takes the explicit scale scale_multiplier × scaling_factor(scaling,
  // d_k) (SdpaConfig::scale), so only the constant differs from the mode's own rule.
  double scale_multiplier = 1;
  // > 0: the attention's score softcap c (SdpaConfig::softcap, Gemma 2's 50): the scaled logit u
  // becomes c · tanh(u / c). 0: none.
  double softcap = 0;
  // The ablations. warmup >= 0: the run's LR warmup in steps, instead of the group's (or its
  // budget's); -1: the group's. param_groups: appended to the run's (TrainConfig::param_groups),
  // e.g. qk-norm's gains at lr_mult 0 (frozen at their initial 1) or 0.1.
  int warmup = -1;
  std::vector<ParamGroupSpec> param_groups = {};
};

// One group of runs sharing a task and optimizer (tables are made per group).
struct StudyGroup {
  std::string name;  // e.g. "recall/adamw"
  TrainConfig base;  // everything but arm, d_k, lr, seed and out
  std::vector<StudyArm> arms;
  std::vector<int> d_k;
  std::vector<double> lrs;
  std::vector<std::uint64_t> seeds;
  // Run lengths: the whole grid runs once per budget, warmup and eval interval scaled to it
  // (warmup steps/10, an eval every steps/20). Empty: base.steps alone.
  std::vector<int> budgets;
};

struct StudyPlan {
  std::string preset;
  std::vector<StudyGroup> groups;
};

// The quick preset's run length, sized so that 45 runs finish in < 10 minutes on 2 cores with
// --jobs 2 (measured: see data/results/quick).
inline constexpr int kQuickSteps = 400;
inline constexpr int kQuickBatch = 32;
// The proxies preset's run length (its comment in src/study/presets.cpp says how it was sized).
inline constexpr int kProxiesSteps = 300;

// The study's presets (StudyPlan::preset holds the name; a custom plan may hold another).
enum class StudyPreset { micro, quick, full, proxies };

}  // namespace attnlab::app

namespace attnlab {
template <>
struct EnumTable<app::StudyPreset> {
  static constexpr EnumEntry<app::StudyPreset> entries[] = {
      {app::StudyPreset::micro, "micro", "seconds"},
      {app::StudyPreset::quick, "quick", "< 10 min on 2 cores with --jobs 2"},
      {app::StudyPreset::full, "full", "< 1 h"},
      {app::StudyPreset::proxies, "proxies",
       "Wortsman et al. 2023's small-scale proxies (width at a fixed head dimension; 910 runs "
       "with 5 seeds and the ablations: hours on 2 cores, see data/results/README.md)"},
  };
  static constexpr EnumParseText parse = {"study", "preset"};
};
}  // namespace attnlab

namespace attnlab::app {

// The plan of a preset; std::invalid_argument "study: preset expected <the names>, got '...'" for
// a name that is not one.
StudyPlan study_preset(StudyPreset preset);
StudyPlan study_preset(const std::string& preset);

struct StudyOptions {
  int jobs = 1;
  std::string out = "runs/study";
  bool progress = true;
  int steps = 0;  // > 0 overrides the preset's steps (for smaller machines)
  // Reuse every run whose folder under out/runs/ holds a finished record (record.csv, written
  // when the run ends) beside a study_config.json equal to the run's config now: a study
  // that was stopped or killed goes on where it stopped, and a grid that grew runs only its new
  // runs. A run with another config (code or preset changed) trains again.
  bool resume = false;
};

struct StudyOutcome {
  std::vector<RunRecord> runs;
  std::string summary_md;  // paths
  std::string summary_csv;
  std::string report_html;  // one self-contained page: every table and figure (report.hpp)
  std::vector<std::string> plots;
  std::string plot_error;  // non-empty when gnuplot was missing or failed (data kept)
  double seconds = 0;      // wall time (run_study: also written to OUT/study.json)
  std::size_t reused = 0;  // runs that StudyOptions::resume took from an earlier invocation
};

// Validates every run of the plan first (std::invalid_argument naming the group and the field),
// then runs the plan's jobs on options.jobs std::threads. Every job trains with a Context of its
// own: one thread (so results do not depend on --jobs), on the CPU, and context.stop (once set,
// every job stops before its next step with a checkpoint). context.threads is not used.
StudyOutcome run_study(const StudyPlan& plan, const StudyOptions& options, const Context& context);

// Writes summary.csv, summary.md, the figures and report.html again from a finished study in
// options.out (its summary.csv, study.json and runs/), without training: for a report made by an
// older version, or restyled. The plan must be the study's (its groups give the tasks and grids).
// std::invalid_argument for a missing or malformed summary.csv, or a group the plan lacks.
StudyOutcome report_study(const StudyPlan& plan, const StudyOptions& options);

// A custom grid without recompiling (`attnlab study --config FILE`): a StudyPlan as JSON, every
// group's base a run config (run_config.hpp). Reading overlays, unknown keys are errors naming
// their path; std::invalid_argument names the file. data/configs/study_micro.json is the micro
// preset written out.
void read_study_file(const std::string& path, StudyPlan& plan);
// The same from JSON text (std::invalid_argument; ConfigError naming the key path).
void read_study_text(const std::string& text, StudyPlan& plan);
std::string to_json_text(const StudyPlan& plan);

}  // namespace attnlab::app
