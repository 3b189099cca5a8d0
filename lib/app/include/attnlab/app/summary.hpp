// The study's summary: one record per training run, aggregated into summary.csv and the tables of
// summary.md and report.html.
//
// Definitions used in the tables:
//   failed    final eval loss >= kFailedFraction x the eval loss at initialisation, or diverged
//   diverged  run_diverged: the trainer flagged it (a non-finite loss, or an eval loss more than
//             kDivergenceMargin nats above the loss at initialisation: loss_diverged), or its
//             final loss passes the same rule (records of runs trained before the margin was
//             part of the trainer's test: the summary applies the rule itself)
//   works     for a task with an accuracy target: the run reached kTargetAccuracy (95%) eval
//             accuracy and did not diverge; for text (no target): its final eval loss is within
//             kTextWorkMargin of the best run's at the same group, budget and d_k, and it did
//             not fail
//   LR window the LRs of the grid at which a seed's run works, in decades (window_decades)
//   LR sensitivity (Wortsman et al. 2023, arXiv 2309.14322, section 3.1):
//             E_{lr in sweep}[ min(loss(lr), loss_init) − min_lr loss(lr) ],
//             with a diverged run's loss counted as loss_init. It reads near zero for a mode that
//             fails at every LR (all losses ≈ loss_init), so read it together with the failures.
//             The table gives it twice. `LR sensitivity` (as before): from the seed-mean loss at
//             each LR. `per seed`: computed for each seed from its own grid of final losses, its
//             own loss_init and its own best loss, then the mean over seeds [95% bootstrap]. A
//             seed's best LR lr* is the LR of its lowest loss (capped at loss_init); on a tie, the
//             smallest such LR. With G the seed's grid,
//               below optimum = (1/|G|) Σ_{lr in G, lr < lr*} [min(loss(lr), loss_init) − loss*]
//               above optimum = (1/|G|) Σ_{lr in G, lr > lr*} [min(loss(lr), loss_init) − loss*]
//             so below + above = per seed (the term at lr* is 0), seed by seed and in the mean;
//             the intervals are each column's own and do not add up.
//   how runs fail (failure_kind), for every run that does not work (not only the failed ones: a
//             run that saturates its attention can plateau below the failure bar, e.g. at ln V of
//             a uniform guess, as the recall runs at high LR do):
//             diverged  run_diverged (above)
//             saturated otherwise, layer 0's attention collapsed (attention_collapsed): its
//                       largest |scaled logit| ended >= kSaturatedLogitGrowth (10) x its step-0
//                       value and its entropy <= kCollapsedEntropyFraction (0.1) x its step-0
//                       entropy; needs the layer-0 figures (summaries since they were logged)
//             stalled   otherwise, final loss >= kStallFraction (0.97) x the loss at
//                       initialisation: within 3% of where it started
//             slow      otherwise: it ended more than 3% below where it started but short of the
//                       bar (whether it was still improving at the end, the final loss alone
//                       does not say)
// Means carry 95% percentile-bootstrap intervals over seeds, proportions 95% Wilson intervals
// (study_stats.hpp).
#pragma once

#include <cmath>
#include <cstddef>
#include <limits>
#include <string>
#include <vector>

#include "attnlab/app/study_stats.hpp"

namespace attnlab::app {

inline constexpr double kFailedFraction = 0.9;
inline constexpr double kTargetAccuracy = 0.95;
inline constexpr double kTextWorkMargin = 1.05;
inline constexpr double kStallFraction = 0.97;
// Layer 0's max-logit growth that counts (the 10x of the proxies checks C1, C2 and of "saturated").
inline constexpr double kSaturatedLogitGrowth = 10.0;
inline constexpr double kCollapsedEntropyFraction = 0.1;

// The divergence rule, one function for the trainer (every eval) and the summary (each record's
// final loss): a loss diverged when it is not finite or exceeds the loss at initialisation by more
// than kDivergenceMargin nats. 10 nats is e^-10 of the probability a run gave the right token at
// initialisation: no healthy run ends there (in the committed studies no run ends above its
// initial loss at all), while a run that blows up without overflowing ends at 1e22 and more.
inline constexpr double kDivergenceMargin = 10.0;
inline bool loss_diverged(double loss, double initial_loss) {
  return !std::isfinite(loss) || loss > initial_loss + kDivergenceMargin;
}

// Layer 0's attention at one eval (the figures Wortsman et al. 2023 follow): the largest |scaled
// logit| over its heads, its heads' mean attention entropy (nats), and the Frobenius norms of its
// W_Q and W_K. NaN when not measured.
// The mechanism figures after them (NaN in summaries written before they were logged): at the
// layer's largest |scaled logit| (its head h*, example, query i and key j) the norms ‖q_i‖, ‖k_j‖
// and their cosine; σ₁ of head h*'s blocks of W_Q and W_K (power iteration); the largest |γ| of
// the block's input norm; with qk-norm, the largest |γ| and ‖β‖ of its q and k norms (NaN
// without).
struct LayerZeroStats {
  static constexpr double nan = std::numeric_limits<double>::quiet_NaN();
  double max_logit = nan;
  double entropy = nan;
  double wq_norm = nan;
  double wk_norm = nan;
  double q_norm = nan, k_norm = nan, qk_cos = nan;
  double wq_sigma1 = nan, wk_sigma1 = nan;
  double ln_gain_max = nan;
  double qn_gamma_max = nan, qn_beta_norm = nan, kn_gamma_max = nan, kn_beta_norm = nan;
};

struct RunRecord {
  std::string group;  // e.g. "recall/adamw": tables are made per group and budget (steps)
  std::string mode;   // "none" | "sqrt_dk" | "dk" | arms such as "qk_norm", "learnable"
  int d_k = 0;
  double lr = 0;
  int seed = 0;
  int steps = 0;
  bool has_target = true;  // the task has an accuracy target (every task but text)
  double init_eval_loss = 0;
  double final_eval_loss = 0;  // NaN when diverged
  double final_eval_acc = 0;
  // Text tasks: the final eval loss in bits per byte (TrainResult::final_eval_bpb); NaN otherwise
  // and in summaries written before the column.
  double final_eval_bpb = std::numeric_limits<double>::quiet_NaN();
  int steps_to_target = -1;  // first eval step with accuracy >= kTargetAccuracy; -1 never
  bool diverged = false;
  int diverged_step = -1;
  double init_qk_var_ratio = 0;              // Var(q·k)/d_k measured at step 0 (premise check)
  double init_jacobian = 0;                  // layer 0 head 0's softmax Jacobian norm at step 0
  LayerZeroStats layer0_init, layer0_final;  // TrainResult's; NaN when summary.csv lacks them
  double seconds = 0;
  bool works = false;  // set by mark_working
  std::string dir;     // the run's output folder, relative to the study folder
};

// The record's diverged flag, or its final loss passes loss_diverged (definition above).
bool run_diverged(const RunRecord& r);

bool run_failed(const RunRecord& r);

// Layer 0's attention ended saturated (definition above); false when the figures are missing.
bool attention_collapsed(const RunRecord& r);

// How a run that does not work ended (definitions above; reads `works`, set by mark_working);
// none for a working run.
enum class FailureKind { none, diverged, saturated, stalled, slow };
FailureKind failure_kind(const RunRecord& r);

// Sets every record's `works` (definition above).
void mark_working(std::vector<RunRecord>& runs);

// summary.csv: one row per run, with a header.
std::string summary_csv(const std::vector<RunRecord>& runs);

// A table of the summary, rendered to Markdown (summary.md) and HTML (report.html).
struct ReportTable {
  std::string title, note;
  std::vector<std::string> header;
  std::vector<std::vector<std::string>> rows;
};
struct ReportSection {
  std::string heading, intro;
  std::vector<ReportTable> tables;
};

// One section per group and budget (final loss, steps to 95%, success, how runs fail, LR window,
// LR sensitivity with its split at the best LR, Jacobian at initialisation), and per group with
// several budgets one comparing them.
std::vector<ReportSection> summary_sections(const std::vector<RunRecord>& runs);

// summary.md: the sections as Markdown.
std::string summary_markdown(const std::vector<RunRecord>& runs, const std::string& title);

// LR sensitivity of one (group, mode, d_k) cell: losses per LR (seed means), loss_init.
double lr_sensitivity(const std::vector<double>& loss_per_lr, double loss_init);

// The LR sensitivity of one grid of losses (LRs increasing; a non-finite loss counts as
// loss_init) split at the best LR: total = below + above, the definitions above. `best` is the
// index of the best LR, the smallest on a tie; an empty grid gives zeros and best 0.
struct SensitivitySplit {
  double total = 0, below = 0, above = 0;
  std::size_t best = 0;
};
SensitivitySplit lr_sensitivity_split(const std::vector<double>& loss_per_lr, double loss_init);

// The figures the report plots, per cell.
struct CellKey {
  std::string group;
  int steps = 0;
  std::string mode;
  int d_k = 0;
};
std::vector<const RunRecord*> cell_runs(const std::vector<RunRecord>& runs, const CellKey& key,
                                        double lr);  // lr < 0: every LR
// The loss a run contributes to means: a diverged run counts as its loss at initialisation.
double effective_loss(const RunRecord& r);
struct LossStat {
  double mean = 0;
  Interval ci;
  int n = 0, diverged = 0;
};
LossStat loss_stat(const std::vector<const RunRecord*>& runs);
struct WindowStat {
  double mean = 0;  // decades, mean over seeds
  Interval ci;
  WindowEdges edges;
  double lo_lr = 0, hi_lr = 0;  // smallest and largest LR at which some seed works (0: none)
  int seeds = 0;
};
WindowStat window_stat(const std::vector<RunRecord>& runs, const CellKey& key);
// A cell's LR sensitivity per seed (each seed's own grid over the LRs it ran, a diverged run
// counted as its loss at initialisation, loss_init the mean of the seed's runs'), split at each
// seed's best LR: means over seeds with 95% bootstrap intervals.
struct SensitivityStat {
  double total = 0, below = 0, above = 0;
  Interval total_ci, below_ci, above_ci;
  std::vector<double> best_lr;  // per seed, in seed order
  int seeds = 0;
};
SensitivityStat sensitivity_stat(const std::vector<RunRecord>& runs, const CellKey& key);
// A cell's runs that do not work, by kind (failure_kind).
struct FailureCounts {
  int runs = 0, failing = 0, diverged = 0, saturated = 0, stalled = 0, slow = 0;
};
FailureCounts failure_counts(const std::vector<const RunRecord*>& runs);
// The LRs run in a group (at one budget; steps <= 0: at any), increasing.
std::vector<double> sweep_lrs(const std::vector<RunRecord>& runs, const std::string& group,
                              int steps = 0);

// summary.csv read back (the records of a finished study); std::invalid_argument naming the file
// and line for a malformed one. has_target and works are not in the file: set them after.
std::vector<RunRecord> read_summary_csv(const std::string& path);

// Modes in a fixed, readable order; unknown arms after them alphabetically.
std::vector<std::string> ordered_modes(const std::vector<RunRecord>& runs,
                                       const std::string& group);

}  // namespace attnlab::app
