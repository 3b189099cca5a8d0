// The study's pre-registered checks against Wortsman et al. 2023 ("Small-scale proxies for
// large-scale Transformer training instabilities", ICLR 2024) and Zhai et al. 2023 (attention
// entropy collapse), computed from a width family: study groups named "<family>/w<d_model>" (the
// proxies preset's proxies/w64, proxies/w128, proxies/w256), one width each at a fixed head
// dimension, with the arms sqrt_dk (1/√d_k), qk_norm (1/√d_k with qk-layernorm) and dk (1/d_k).
//
// Definitions (every loss a seed mean of effective_loss, a diverged run counting as its loss at
// initialisation; a "cell" is one arm at one width and LR, its runs one per seed):
//   best_w          the lowest cell loss at width w over every arm and LR
//   a run fails     it diverged, or its final loss is >= best_w + 0.5 nats
//   a cell fails    one of its runs diverged, or its loss is >= best_w + 0.5
//   logit growth    a run's layer-0 max |scaled logit| at its end over that at step 0 (a diverged
//                   run's is +inf); a cell grew when every run's growth is >= 10
//   good LR         the largest LR whose cell loss is within 0.1 of the arm's best at that width
//   sensitivity     Wortsman et al.'s LR sensitivity per seed, mean over seeds (sensitivity_stat)
// The checks, each holds / fails / inconclusive with its numbers:
//   C1 the instability exists: sqrt_dk's cells at LR 0.3 at every width, and at 0.1 at widths
//      >= 128, fail and grew. Inconclusive when sqrt_dk at 0.3 ends within 0.1 of best_w at every
//      width (the proxy is too small or too short), or a cell was not run.
//   C2 qk-layernorm mitigates (their Fig. 1): given C1, at every width qk_norm's sensitivity is
//      below sqrt_dk's, and at every LR where sqrt_dk's cell grew, qk_norm's runs all grew < 10x
//      and its loss is lower. Inconclusive without C1.
//   C3 the width trend: sqrt_dk's sensitivity at the largest width exceeds that at the smallest,
//      and its good LR does not grow with width.
//   C4 1/d_k does not replace qk-layernorm (their Fig. E.6): at every width dk's good LR is at most
//      10^0.5 x sqrt_dk's, and at the largest width dk's loss at LR 0.3 is >= qk_norm's + 0.2. The
//      LR grid's neighbours differ by 3 or 3.33, so one grid step above can exceed 10^0.5: the
//      numbers give each ratio.
//   C5 entropy collapse: every failed run of C1's cells ends with layer-0 entropy below half that
//      of the qk_norm run at the same width, LR and seed (runs whose entropy is not finite, such as
//      diverged ones, are not evaluable; none evaluable: inconclusive).
//   C6 growth comes from the norms (their Fig. E.1): over the failed runs of C1's cells, the
//      least-squares slope of log max-logit against log(‖W_Q‖·‖W_K‖), from each run's step-0 and
//      final points (finite ones), is in [0.7, 1.3] (fewer than 3 points: inconclusive).
// Amendments, written after the results and reported beside the checks above (which stay as
// registered), each with its reason:
//   C2a C2 in absolute terms: given C1, at every width qk_norm's sensitivity is below sqrt_dk's,
//      and at every LR where sqrt_dk's cell grew, qk_norm's largest final max logit is at most
//      0.1 x sqrt_dk's smallest (a diverged sqrt_dk run counts as unbounded) with a lower loss.
//   C4a C4 in grid steps: at every width dk's good LR is at most one step of the grid (the LRs
//      either arm ran at that width) above sqrt_dk's, and at the largest width dk's loss at LR 0.3
//      is >= qk_norm's + 0.2. The grid's steps alternate x3.33 and x3, which 10^0.5 falls between.
//   C6a C6 on the paper's regressors: over C1's failed runs, log max-logit against log(‖q‖·‖k‖) at
//      the max-logit pair (LayerZeroStats::q_norm, k_norm): each run's slope from step 0 to its
//      end (the median over runs) and the least-squares slope over the runs' ends, both in
//      [0.7, 1.3]. Inconclusive, "not computable from this CSV", when the runs lack the columns.
#pragma once

#include <string>
#include <vector>

#include "attnlab/app/summary.hpp"
#include "attnlab/enum_table.hpp"

namespace attnlab::app {

enum class Verdict { holds, fails, inconclusive };

}  // namespace attnlab::app

namespace attnlab {
template <>
struct EnumTable<app::Verdict> {
  static constexpr EnumEntry<app::Verdict> entries[] = {
      {app::Verdict::holds, "holds", ""},
      {app::Verdict::fails, "fails", ""},
      {app::Verdict::inconclusive, "inconclusive", ""},
  };
  static constexpr EnumParseText parse = {"parse_verdict", "verdict"};
};
}  // namespace attnlab

namespace attnlab::app {

// The name of EnumTable<Verdict>.
inline const char* to_string(Verdict v) {
  return enum_name(v).data();
}

struct CheckResult {
  std::string id;     // "C1" ... "C6"; the amendments "C2a", "C4a", "C6a"
  std::string claim;  // what the check asks, in a line
  Verdict verdict = Verdict::inconclusive;
  std::string numbers;     // the figures that decided it
  bool amendment = false;  // written after the results (false: pre-registered)
  std::string reason;      // an amendment's reason
};

// The groups of one family by width, ascending, and the budget (steps) the checks read: the
// largest that every width ran.
struct WidthFamily {
  std::string name;                 // "proxies"
  std::vector<int> widths;          // d_model, ascending
  std::vector<std::string> groups;  // the group of each width
  int steps = 0;
};

// Every family with at least two widths, in the order of their first group.
std::vector<WidthFamily> width_families(const std::vector<RunRecord>& runs);

// C1 ... C6, then the amendments C2a, C4a, C6a, on one family (definitions above).
std::vector<CheckResult> proxy_checks(const std::vector<RunRecord>& runs, const WidthFamily& f);

// How many seeds support each check of proxy_checks(runs, f), in its order: each seed's runs alone
// checked again; agree counts the seeds whose verdict equals the pooled one.
struct SeedSupport {
  int seeds = 0;
  int agree = 0;
  int inconclusive = 0;
};
std::vector<SeedSupport> proxy_seed_support(const std::vector<RunRecord>& runs,
                                            const WidthFamily& f);

// The checks as a report section: one row per check with its verdict, its seeds' support and
// numbers.
ReportSection proxy_checks_section(const std::vector<RunRecord>& runs, const WidthFamily& f);

// The ablations of a width's group (its runs with qk-norm's gains or shifts held, or a longer
// warmup, on the same seeds): the group "<group>-ablations", which no family takes in.
std::string ablation_group(const std::string& group);

// The mechanism table (layer 0's logged figures at the end, per arm at LR 0.1 and 0.3, ablations
// included) and, where a width has ablations, the table of C2's cause: each ablation's growth,
// loss and final max logit at LR 0.3 beside qk-norm's and 1/√d_k's.
ReportSection proxy_mechanisms_section(const std::vector<RunRecord>& runs, const WidthFamily& f);

}  // namespace attnlab::app
