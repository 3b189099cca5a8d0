// The trainer's measurements and their file: one evaluation through the backend, and
// OUT/metrics.csv (one row per logged step). Internal to the app (lib/app/src).
#pragma once

#include <cstdint>
#include <fstream>
#include <limits>
#include <optional>
#include <string>
#include <vector>

#include "attnlab/app/loss.hpp"
#include "attnlab/app/metrics.hpp"
#include "attnlab/app/tasks.hpp"
#include "attnlab/distributed.hpp"
#include "train_backend.hpp"

namespace attnlab::app {

// The loss sums of an evaluation in chunks (evaluate, evaluate_run): labelled positions, Σ loss,
// Σ correct predictions (counts: exact) and Σ bytes of the labelled targets (a text task's
// token_bytes; empty elsewhere).
struct LossSums {
  double labelled = 0, loss = 0, correct = 0, bytes = 0;
  void add(const LossResult& chunk, const TokenIds& targets,
           const std::vector<std::uint32_t>& token_bytes);
  double mean_loss() const { return labelled > 0 ? loss / labelled : 0.0; }
  double accuracy() const { return labelled > 0 ? correct / labelled : 0.0; }
  // Σ loss / (ln 2 · Σ bytes), NaN without bytes.
  double bits_per_byte() const;
};

// What one evaluation measures.
struct EvalStats {
  double loss = 0, accuracy = 0;
  // Bits per byte of the text the labelled targets stand for: Σ loss / (ln 2 · Σ bytes); NaN
  // when the task has no byte table (token_bytes empty).
  double bits_per_byte = std::numeric_limits<double>::quiet_NaN();
  double target_bytes = 0;  // Σ bytes of the labelled targets (reduce_eval adds the shards')
  // The first row of the eval set whose chunk gave a non-finite loss (npos: none), so that a
  // diverged eval can be replayed on that chunk alone.
  std::size_t nonfinite_row = static_cast<std::size_t>(-1);
  std::vector<HeadHealth> health;  // layers × heads, row-major
  // layers × heads: where each head's largest |scaled logit| is, over the whole set, with the
  // norms and cosine of its query and key (max_logit_pairs; b counts from the set's first row)
  std::vector<MaxLogitPair> pairs;
  std::vector<double> recall_mass;  // layers × heads (recall only)
  double qk_var_ratio = 0;          // layer 0, all heads: Var(q·k) / d_k
  // What the shards' figures are combined by (reduce_eval).
  std::size_t rows = 0, labelled = 0;  // examples; labelled positions
  double qk_mean = 0;                  // layer 0's mean q·k over qk_count values
  std::size_t qk_count = 0;
  // Layer 0, head 0's weights on the first eval example (row-major Tq x Tk; only on the rank that
  // holds example 0, i.e. rank 0), and for recall the position of the key the query must find.
  std::vector<double> example_attention;
  std::size_t example_tq = 0, example_tk = 0;
  int example_key = -1;
};

// Loss and accuracy of the eval forward, the attention health of every head, the recall mass on
// the correct key (recall), and the premise check Var(q·k)/d_k of layer 0.
// The set is run in chunks of at most `chunk` rows, so its memory is a chunk's, not the set's;
// the figures are combined as reduce_eval combines shards (sums over labelled positions, means
// weighted by rows, maxima, Var(q·k) pooled exactly), so they do not depend on the chunk size
// beyond rounding. token_bytes: the bytes of text each output id stands for (bits per byte), or
// empty.
EvalStats evaluate(TrainBackend& backend, std::size_t layers, const Batch& eval,
                   const TaskConfig& task, std::size_t d_k, std::size_t chunk,
                   const std::vector<std::uint32_t>& token_bytes = {});

// OUT/attention.json: the example attention at initialisation and at the end of a run, for the
// study report's heatmaps: {"layer": 0, "head": 0, "example": 0, "query_position", "key_position"
// (-1 when the task has none), "tq", "tk", "init": {"step", "weights": [[...]]}, "final": {...}}.
void write_attention_file(const std::string& path, const EvalStats& init, std::size_t init_step,
                          const EvalStats& final_stats, std::size_t final_step);

// Combines the EvalStats of the ranks' shards of one eval set into the figures of the whole set, on
// every rank: loss and accuracy from their sums over the labelled positions (equal to a single
// process's to rounding); the head means weighted by rows, max |logit| as the maximum, Var(q·k)
// pooled. A no-op for one process.
void reduce_eval(Communicator& comm, EvalStats& st, std::size_t d_k);

// Per-layer weight statistics of a logged step.
struct LayerNorms {
  std::vector<double> wq_grad, wk_grad, wq, wk;  // one per layer
  // layers × heads: σ₁ of each head's block of W_Q and of W_K (head_spectral_norms; a key head
  // serves H / Hkv query heads, each listed with it)
  std::vector<double> wq_sigma1, wk_sigma1;
  // One per layer: max |γ| of the block's input norm; with qk-norm, max |γ| and ‖β‖ of its q and
  // k norms. NaN where the layer has no such parameter.
  std::vector<double> ln_gain_max, qn_gamma_max, qn_beta_norm, kn_gamma_max, kn_beta_norm;
};

// OUT/metrics.csv. Columns: step, loss, eval_loss, eval_acc, lr, per head l<L>h<H>_{entropy,
// max_logit, saturated, jacobian[, recall_mass]}, per layer l<L>_{wq_grad_norm, wk_grad_norm,
// wq_norm, wk_norm}, jacobian_mean[, eval_bpb][, z_loss][, skipped], then the mechanism columns:
// per head l<L>h<H>_{q_norm, k_norm, qk_cos} (EvalStats::pairs: at the head's max-logit pair) and
// l<L>h<H>_{wq_sigma1, wk_sigma1}, per layer l<L>_ln_gain_max and, with qk-norm,
// l<L>_{qn_gamma_max, qn_beta_norm, kn_gamma_max, kn_beta_norm} (LayerNorms). loss is the training
// batch's cross-entropy
// alone (comparable across runs with and without a z-loss); z_loss, in runs with one, its z-loss
// term z · mean log Z² (the loss trained on is their sum); skipped, in runs with --skip-outliers,
// 1 when the row's step skipped its update as an outlier, else 0 (0 in the step-0 row); eval_bpb,
// in text runs, the eval loss in bits per byte of the text (EvalStats::bits_per_byte). Values are
// %.7g; non-finite ones "nan", "inf", "-inf".
// Beside it, OUT/metrics.jsonl: one JSON object per row with keys that do not depend on the model's
// size, for pandas (read_json(lines=True)) and experiment trackers:
//   {"step", "loss", "eval_loss", "eval_acc", "lr", "jacobian_mean"[, "z_loss"][, "skipped"][,
//    "eval_bpb"],
//    "heads": [{"layer", "head", "entropy", "max_logit", "saturated", "jacobian"[,
//    "recall_mass"], "q_norm", "k_norm", "qk_cos", "wq_sigma1", "wk_sigma1"}], "layers":
//    [{"layer", "wq_grad_norm", "wk_grad_norm", "wq_norm", "wk_norm", "ln_gain_max"[,
//    "qn_gamma_max", "qn_beta_norm", "kn_gamma_max", "kn_beta_norm"]}]}
// with full double precision and null for a non-finite value.
class MetricsLog {
 public:
  // Truncates `path` (and its .jsonl twin) and writes the header. A resumed run first keeps the
  // rows of `resume_csv` and of its .jsonl twin (read before truncating, so they may be the same
  // files) up to `resumed_step`.
  // z_loss: the run has a z-loss (the z_loss column); skip_outliers: it skips outlier steps (the
  // skipped column); bits_per_byte: a text task (the eval_bpb column; rows kept from a run written
  // before that column get nan); qk_norm: the model has qk-norm (its γ and β columns). Rows kept
  // from a run written before the mechanism columns get nan in them.
  MetricsLog(const std::string& path, std::size_t layers, std::size_t heads, bool recall,
             const std::string& resume_csv = "", std::size_t resumed_step = 0, bool z_loss = false,
             bool skip_outliers = false, bool bits_per_byte = false, bool qk_norm = false);

  // train_loss: the cross-entropy; train_z_term: the z-loss term (written when the run has one);
  // skipped: the step skipped its update (written when the run skips outliers).
  void write(std::size_t step, double train_loss, double lr, const EvalStats& eval,
             const LayerNorms& norms, double train_z_term = 0, bool skipped = false);

  // The eval loss of the step-0 row kept from a resumed run (nullopt: none kept).
  std::optional<double> kept_init_eval_loss() const { return kept_init_eval_loss_; }
  // The first logged step with eval accuracy >= 0.95 (kept rows included), -1 if none yet.
  int steps_to_target() const { return steps_to_target_; }

 private:
  // Both files are rewritten whole through write_file_atomic at every row: a crash leaves the
  // previous complete file, never a torn row.
  void flush();

  std::string path_, csv_, jsonl_;
  std::size_t layers_, heads_;
  bool recall_, z_loss_, skip_outliers_, bits_per_byte_, qk_norm_;
  std::optional<double> kept_init_eval_loss_;
  int steps_to_target_ = -1;
};

}  // namespace attnlab::app
