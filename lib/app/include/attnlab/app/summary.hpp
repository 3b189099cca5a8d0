// The study's summary: one record per training run, aggregated into summary.csv and the tables of
// summary.md.
//
// Definitions used in the tables:
//   failed    final eval loss >= kFailedFraction x the eval loss at initialisation
//   diverged  a non-finite loss stopped the run
//   LR sensitivity (Wortsman et al. 2023, arXiv 2309.14322, section 3.1):
//             E_{lr in sweep}[ min(loss(lr), loss_init) − min_lr loss(lr) ],
//             with a diverged run's loss counted as loss_init. It reads near zero for a mode that
//             fails at every LR (all losses ≈ loss_init), so read it together with the failures.
#pragma once

#include <string>
#include <vector>

namespace attnlab::app {

inline constexpr double kFailedFraction = 0.9;
inline constexpr double kTargetAccuracy = 0.95;

struct RunRecord {
  std::string group;  // e.g. "recall/adamw": tables are made per group
  std::string mode;   // "none" | "sqrt_dk" | "dk" | arms such as "qk_norm", "learnable"
  int d_k = 0;
  double lr = 0;
  int seed = 0;
  int steps = 0;
  double init_eval_loss = 0;
  double final_eval_loss = 0;  // NaN when diverged
  double final_eval_acc = 0;
  int steps_to_target = -1;  // first eval step with accuracy >= kTargetAccuracy; -1 never
  bool diverged = false;
  int diverged_step = -1;
  double init_qk_var_ratio = 0;  // Var(q·k)/d_k measured at step 0 (premise check)
  double seconds = 0;
  std::string dir;  // the run's output folder, relative to the study folder
};

bool run_failed(const RunRecord& r);

// summary.csv: one row per run, with a header.
std::string summary_csv(const std::vector<RunRecord>& runs);

// summary.md: the four tables per group, with the definitions and caveats in text.
std::string summary_markdown(const std::vector<RunRecord>& runs, const std::string& title);

// LR sensitivity of one (group, mode, d_k) cell: losses per LR (seed means), loss_init.
double lr_sensitivity(const std::vector<double>& loss_per_lr, double loss_init);

}  // namespace attnlab::app
