#include "train_loop.hpp"

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <limits>
#include <memory>
#include <span>
#include <sstream>

#include <nlohmann/json.hpp>

#include "attnlab/app/data_file.hpp"
#include "attnlab/app/loss.hpp"
#include "attnlab/app/model.hpp"
#include "attnlab/app/param_groups.hpp"
#include "attnlab/app/progress.hpp"
#include "attnlab/app/run_checkpoint.hpp"
#include "attnlab/app/text.hpp"
#include "attnlab/backends/cpu.hpp"
#include "attnlab/blas.hpp"
#include "attnlab/cuda.hpp"
#include "attnlab/distributed.hpp"
#include "attnlab/io/safetensors.hpp"
#include "attnlab/optim/schedule.hpp"
#include "attnlab/threads.hpp"
#include "train_backend.hpp"
#include "train_metrics.hpp"
#include "train_saver.hpp"

namespace attnlab::app {

using Clock = TrainClock;

// What the checkpoint keeps of --skip-outliers (null when off).
const OutlierSkip* outlier_state(const LoopState& s) {
  return s.outliers ? &*s.outliers : nullptr;
}

EvalStats eval_all(const RunParts& p) {
  EvalStats s =
      evaluate(p.backend, p.model.layers(), p.eval, p.c.task, p.d_k, eval_rows(p.c), p.token_bytes);
  reduce_eval(p.comm, s, p.d_k);
  return s;
}

// One row of metrics.csv: the eval `st`, the step's gradient norms (already in `norms`) and the
// weight norms now, read from the host copy.
// write = false: the norms only (a resumed run's first eval, whose row is already in the file).
void log_row(const RunParts& p, LayerNorms& norms, std::size_t step, double train_loss,
             double train_z_term, double lr, const EvalStats& st, bool skipped = false,
             bool write = true) {
  const std::size_t layers = p.model.layers(), heads = p.model.heads();
  constexpr double nan = std::numeric_limits<double>::quiet_NaN();
  norms.wq_sigma1.assign(layers * heads, nan);
  norms.wk_sigma1.assign(layers * heads, nan);
  for (auto* v : {&norms.ln_gain_max, &norms.qn_gamma_max, &norms.qn_beta_norm, &norms.kn_gamma_max,
                  &norms.kn_beta_norm})
    v->assign(layers, nan);
  // max |x| and ‖x‖ of a named parameter, NaN when the model has none by that name.
  const auto max_abs = [&](const std::string& name) {
    const Parameter<float>* q = find_param(p.params, name);
    if (!q) return nan;
    double m = 0;
    for (float x : q->value) m = std::max(m, std::abs(static_cast<double>(x)));
    return m;
  };
  const auto norm_of = [&](const std::string& name) {
    const Parameter<float>* q = find_param(p.params, name);
    return q ? tensor_norm(q->value) : nan;
  };
  for (std::size_t l = 0; l < layers; ++l) {
    const auto& wq = find_param(p.params, p.model.w_q_name(l))->value;
    const auto& wk = find_param(p.params, p.model.w_k_name(l))->value;
    norms.wq[l] = tensor_norm(wq);
    norms.wk[l] = tensor_norm(wk);
    // σ₁ per head: W_Q (C, H·D), W_K (C, Hkv·D); query head h reads key head h / (H / Hkv).
    const std::size_t D = p.d_k;
    if (wq.dimension() == 2 && wk.dimension() == 2 && D > 0 && wq.shape()[1] == heads * D &&
        wk.shape()[1] % D == 0 && wk.shape()[1] / D > 0 && heads % (wk.shape()[1] / D) == 0) {
      const std::size_t kv = wk.shape()[1] / D;
      const auto sq = head_spectral_norms(wq.data(), wq.shape()[0], heads, D);
      const auto sk = head_spectral_norms(wk.data(), wk.shape()[0], kv, D);
      for (std::size_t h = 0; h < heads; ++h) {
        norms.wq_sigma1[l * heads + h] = sq[h];
        norms.wk_sigma1[l * heads + h] = sk[h / (heads / kv)];
      }
    }
    const std::string block = "blocks." + std::to_string(l) + ".";
    norms.ln_gain_max[l] = max_abs(block + "ln1.gamma");
    norms.qn_gamma_max[l] = max_abs(block + "attn.q_norm.gamma");
    norms.qn_beta_norm[l] = norm_of(block + "attn.q_norm.beta");
    norms.kn_gamma_max[l] = max_abs(block + "attn.k_norm.gamma");
    norms.kn_beta_norm[l] = norm_of(block + "attn.k_norm.beta");
  }
  if (p.log && write) p.log->write(step, train_loss, lr, st, norms, train_z_term, skipped);
}

// Layer 0's figures at the eval `st`, with the weight norms log_row has just read.
LayerZeroStats layer_zero(const RunParts& p, const EvalStats& st, const LayerNorms& norms) {
  LayerZeroStats z;
  const std::size_t heads = p.model.layers() > 0 ? st.health.size() / p.model.layers() : 0;
  if (heads > 0) {
    z.max_logit = 0;
    z.entropy = 0;
    for (std::size_t h = 0; h < heads; ++h) {
      const double m = st.health[h].max_abs_logit;  // NaN (a diverged eval) stays NaN
      z.max_logit = std::isnan(m) || std::isnan(z.max_logit)
                        ? std::numeric_limits<double>::quiet_NaN()
                        : std::max(z.max_logit, m);
      z.entropy += st.health[h].entropy / static_cast<double>(heads);
    }
  }
  if (!norms.wq.empty()) z.wq_norm = norms.wq[0];
  if (!norms.wk.empty()) z.wk_norm = norms.wk[0];
  // The mechanism figures: at layer 0's max-logit pair, of the head that holds it.
  std::size_t top = heads;
  for (std::size_t h = 0; h < heads && h < st.pairs.size(); ++h)
    if (!std::isnan(st.pairs[h].abs_logit) &&
        (top == heads || st.pairs[h].abs_logit > st.pairs[top].abs_logit))
      top = h;
  if (top < heads) {
    z.q_norm = st.pairs[top].q_norm;
    z.k_norm = st.pairs[top].k_norm;
    z.qk_cos = st.pairs[top].cos;
    if (top < norms.wq_sigma1.size()) z.wq_sigma1 = norms.wq_sigma1[top];
    if (top < norms.wk_sigma1.size()) z.wk_sigma1 = norms.wk_sigma1[top];
  }
  if (!norms.ln_gain_max.empty()) {
    z.ln_gain_max = norms.ln_gain_max[0];
    z.qn_gamma_max = norms.qn_gamma_max[0];
    z.qn_beta_norm = norms.qn_beta_norm[0];
    z.kn_gamma_max = norms.kn_gamma_max[0];
    z.kn_beta_norm = norms.kn_beta_norm[0];
  }
  return z;
}

void diverge(TrainResult& result, std::size_t step, std::string where, const char* fallback) {
  result.diverged = true;
  result.diverged_step = static_cast<int>(step);
  result.diverged_where = where.empty() ? fallback : std::move(where);
}

// The eval before this invocation's first step: the figures at initialisation and, in a new run,
// metrics.csv's step-0 row.
void first_eval(const RunParts& p, LoopState& s, bool resuming) {
  TrainResult& result = s.result;
  s.st = eval_all(p);
  s.first_st = s.st;
  s.eval_step = p.start;
  result.init_qk_var_ratio = s.st.qk_var_ratio;
  result.init_jacobian = s.st.health.empty() ? 0.0 : s.st.health.front().jacobian_norm;
  // A resumed run's loss at initialisation comes from its saved rows.
  result.init_eval_loss =
      resuming && p.log ? p.log->kept_init_eval_loss().value_or(s.st.loss) : s.st.loss;
  log_row(p, s.norms, 0, std::numeric_limits<double>::quiet_NaN(),
          std::numeric_limits<double>::quiet_NaN(), p.schedule.lr_at(0), s.st, false, !resuming);
  result.layer0_final = layer_zero(p, s.st, s.norms);
  if (!resuming) result.layer0_init = result.layer0_final;
  result.final_eval_loss = s.st.loss;
  result.final_eval_acc = s.st.accuracy;
  result.final_eval_bpb = s.st.bits_per_byte;
}

// A stop before `step`: --stop-after, or a signal in a single process (with several ranks a stop
// request is agreed on in agreed_loss: a signal may reach them apart).
bool stop_before(const RunParts& p, std::size_t step) {
  return (p.comm.size() == 1 && p.context.stop_requested()) ||
         (p.c.stop_after > 0 && step == static_cast<std::size_t>(p.c.stop_after));
}

// With several ranks, the global loss (NaN if any rank's is) from this rank's `loss` and its
// `weight`, and whether any rank must stop (nullopt then). One process: `loss` as it is.
std::optional<TrainBackend::Loss> agreed_loss(const RunParts& p, const TrainBackend::Loss& loss,
                                              double weight) {
  if (p.comm.size() == 1) return loss;
  double agreed[3] = {loss.cross_entropy * weight, loss.z_term * weight,
                      p.context.stop_requested() ? 1.0 : 0.0};
  p.comm.allreduce_sum(agreed, 3);
  if (agreed[2] > 0) return std::nullopt;
  return TrainBackend::Loss{agreed[0], agreed[1]};
}

// A step's data, as the lib/README.md's gradient accumulation defines it: the step draws N · B rows
// (N = grad_accum, B = batch) from the data stream, as one batch of N · B would; micro-batch k is
// rows [kB, (k+1)B) of them, and this rank trains on its shard of each. With the batch-parallel
// step the rank's shard of each micro-batch is cut again into P contiguous parts, one per thread
// (part t of micro-batch k is piece kP + t): the pieces of N micro-batches of P parts are those of
// N · P micro-batches of B / P rows. Each piece's gradient is that of its own mean loss, weighted
// by its share of this rank's labelled positions, and the rank's sum by the rank's share of the
// step's (the weight of allreduce_gradients): the gradient of the N · B rows' mean loss, whatever
// their masks.
struct StepData {
  std::vector<Batch> micro;    // this rank's pieces: P per micro-batch, in order
  std::vector<double> weight;  // each one's share of this rank's labelled positions
  double rank_weight = 1;      // this rank's share of the step's
};

StepData step_data(const RunParts& p, std::size_t P) {
  const auto B = static_cast<std::size_t>(p.c.batch), N = static_cast<std::size_t>(p.c.grad_accum);
  const Batch all = p.data.next(N * B, p.data_rng);
  const std::size_t S = p.shard.size();
  StepData d;
  std::vector<std::size_t> labelled, rows;
  std::size_t rank_labelled = 0;
  for (std::size_t k = 0; k < N; ++k) {
    for (std::size_t t = 0; t < P; ++t) {
      const std::size_t first = k * B + p.shard.begin;
      const Shard piece{first + S * t / P, first + S * (t + 1) / P};
      d.micro.push_back(shard_of(all, piece));
      labelled.push_back(labelled_rows(all.targets, piece.begin, piece.end));
      rows.push_back(piece.size());
      rank_labelled += labelled.back();
    }
  }
  const std::size_t rank_rows = N * S;
  d.rank_weight = labelled_share(rank_labelled, rank_rows,
                                 labelled_rows(all.targets, 0, all.size()), all.size());
  for (std::size_t j = 0; j < d.micro.size(); ++j)
    d.weight.push_back(labelled_share(labelled[j], rows[j], rank_labelled, rank_rows));
  return d;
}

// The gradients of the step's micro-batches, summed over the ranks with their shares as weights.
void reduce_gradients(const RunParts& p, LoopState& s, double weight) {
  p.backend.synchronize();
  if (p.comm.size() > 1) {
    const auto t = Clock::now();
    allreduce_gradients(p.comm, p.params, weight, s.staging);
    s.allreduce_seconds += seconds_since(t);
  }
}

// Read before the update, which clipping and the optimizer base on the same gradients.
void record_grad_norms(const RunParts& p, LayerNorms& norms) {
  for (std::size_t l = 0; l < p.model.layers(); ++l) {
    norms.wq_grad[l] = p.backend.grad_norm(p.model.w_q_name(l));
    norms.wk_grad[l] = p.backend.grad_norm(p.model.w_k_name(l));
  }
}

// --skip-outliers, as llm.c's train_gpt2.cu does it: the step's loss (the cross-entropy of the
// whole batch, agreed across the ranks) and its global gradient norm (after the allreduce and
// before clipping: the same gradients, so the same norm, on every rank) enter their detectors
// whatever is decided, then the step is an outlier when either z-score is finite and above the
// threshold. While the windows fill (the first 128 steps of a run) no step is skipped.
bool outlier_step(const RunParts& p, OutlierSkip& o, double loss) {
  const double z_loss = o.loss.update(loss);
  const double z_grad = o.grad_norm.update(p.backend.grad_norm());
  const double limit = p.c.skip_outliers;
  return (std::isfinite(z_loss) && z_loss > limit) || (std::isfinite(z_grad) && z_grad > limit);
}

void update_weights(const RunParts& p) {
  if (p.c.clip > 0) p.backend.clip_grad_norm(p.c.clip);
  p.backend.step();
  p.backend.synchronize();
}

// A logged step after its update: the replicas agree, the eval, metrics.csv's row. False when the
// eval loss diverged (loss_diverged: non-finite, or more than kDivergenceMargin nats above the
// loss at initialisation).
bool log_step(const RunParts& p, LoopState& s, double lr) {
  const std::size_t step = s.step;
  p.backend.sync_host();  // the weight norms of the row and the checksum read the host copy
  check_replicas(p.comm, p.params, step + 1);
  s.st = eval_all(p);
  s.eval_step = step + 1;
  log_row(p, s.norms, step + 1, s.last_loss, s.last_z_term, lr, s.st, s.skipped);
  s.result.layer0_final = layer_zero(p, s.st, s.norms);
  s.result.final_eval_loss = s.st.loss;
  s.result.final_eval_acc = s.st.accuracy;
  s.result.final_eval_bpb = s.st.bits_per_byte;
  if (!std::isfinite(s.st.loss)) {
    diverge(s.result, step + 1,
            s.st.nonfinite_row < p.eval.size()
                ? p.model.locate_nonfinite(
                      slice_batch(p.eval, s.st.nonfinite_row,
                                  std::min(p.eval.size(), s.st.nonfinite_row + eval_rows(p.c))))
                : std::string(),
            "eval loss");
    return false;
  }
  if (loss_diverged(s.st.loss, s.result.init_eval_loss)) {  // finite, but blown up
    char where[128];
    std::snprintf(where, sizeof where, "eval loss %.3g > %.4g at initialisation + %g nats",
                  s.st.loss, s.result.init_eval_loss, kDivergenceMargin);
    diverge(s.result, step + 1, where, "eval loss");
    return false;
  }
  return true;
}

void report_progress(const RunParts& p, const LoopState& s, double loss, double lr, bool log_now) {
  char detail[160];
  int n = std::snprintf(detail, sizeof detail, "loss %.4f eval_loss %.4f eval_acc %.3f", loss,
                        s.st.loss, s.st.accuracy);
  if (std::isfinite(s.st.bits_per_byte) && n > 0 && std::size_t(n) < sizeof detail)
    n += std::snprintf(detail + n, sizeof detail - std::size_t(n), " bpb %.4f", s.st.bits_per_byte);
  if (n > 0 && std::size_t(n) < sizeof detail)
    std::snprintf(detail + n, sizeof detail - std::size_t(n), " lr %.3g", lr);
  p.progress({"step", p.start, s.step + 1, p.steps, seconds_since(s.t0), detail, log_now});
}

// Step s.step: forward, backward, update, and the eval, checkpoint and progress when due. False
// when the run ends here (a rank asked to stop, or it diverged); s.step then counts the steps
// done.
bool train_step(const RunParts& p, LoopState& s) {
  const std::size_t step = s.step;
  const double lr = p.schedule.lr_at(step);
  p.backend.set_lr(lr);
  const auto P = static_cast<std::size_t>(p.backend.batch_threads());  // parts per micro-batch
  const StepData d = step_data(p, P);
  const std::size_t N = d.micro.size();
  // The dropout masks' key: one per piece (the step's own when N = 1).
  const auto dropout_step = [&](std::size_t k) { return static_cast<std::uint64_t>(step * N + k); };
  auto step_start = Clock::now();
  TrainBackend::Loss local;  // this rank's: the pieces' losses, weighted
  std::size_t failed = 0;    // the piece whose loss was non-finite (if one was)
  const auto add = [&](std::size_t k, const TrainBackend::Loss& loss) {
    local.cross_entropy += d.weight[k] * loss.cross_entropy;
    local.z_term += d.weight[k] * loss.z_term;
    if (std::isfinite(loss.total())) return true;
    failed = k;
    local.cross_entropy = std::numeric_limits<double>::quiet_NaN();
    return false;
  };
  p.backend.zero_grad();
  if (P == 1) {
    for (std::size_t k = 0; k < N; ++k) {
      p.backend.set_step(static_cast<std::uint64_t>(p.c.seed), dropout_step(k));
      if (!add(k, p.backend.forward_loss(d.micro[k], d.weight[k]))) break;
      p.backend.backward();  // adds d.weight[k] times its gradient
    }
  } else {  // one parallel region per micro-batch: its P parts at once
    for (std::size_t k = 0; k < N; k += P) {
      p.backend.set_step(static_cast<std::uint64_t>(p.c.seed), dropout_step(k));
      const std::vector<TrainBackend::Loss> losses = p.backend.forward_backward(
          std::span(d.micro).subspan(k, P), std::span(d.weight).subspan(k, P), dropout_step(k));
      bool finite = true;
      for (std::size_t t = 0; t < P && finite; ++t) finite = add(k + t, losses[t]);
      if (!finite) break;
    }
  }
  const std::optional<TrainBackend::Loss> agreed = agreed_loss(p, local, d.rank_weight);
  if (!agreed) {
    s.result.interrupted = true;
    return false;
  }
  if (!std::isfinite(agreed->total())) {
    p.backend.set_step(static_cast<std::uint64_t>(p.c.seed), dropout_step(failed));
    diverge(s.result, step + 1, p.backend.locate_nonfinite(d.micro[failed]), "loss");
    s.last_loss = std::numeric_limits<double>::quiet_NaN();
    return false;
  }
  s.last_loss = agreed->cross_entropy;
  s.last_z_term = agreed->z_term;
  reduce_gradients(p, s, d.rank_weight);
  s.step_seconds += seconds_since(step_start);
  const bool log_now =
      (step + 1) % static_cast<std::size_t>(p.c.eval_every) == 0 || step + 1 == p.steps;
  if (log_now) record_grad_norms(p, s.norms);
  step_start = Clock::now();
  // A skipped step leaves the weights, the optimizer's state and its step count as they were; the
  // step itself (the LR schedule's, the data stream's, the dropout keys') advances.
  s.skipped = s.outliers && outlier_step(p, *s.outliers, s.last_loss);
  if (s.skipped)
    ++s.outliers->skipped;
  else
    update_weights(p);
  s.step_seconds += seconds_since(step_start);
  if (log_now && !log_step(p, s, lr)) {
    ++s.step;  // the diverged step was taken
    return false;
  }
  if (p.c.save_every > 0 && (step + 1) % static_cast<std::size_t>(p.c.save_every) == 0)
    p.saver.save(step + 1, p.backend, p.opt, p.params, p.data_rng, outlier_state(s));
  if (p.progress) report_progress(p, s, s.last_loss, lr, log_now);
  return true;
}

// The run's figures once the loop ended: steps, losses, time and throughput.
void fill_result(const RunParts& p, LoopState& s, const TaskShape& shape) {
  TrainResult& result = s.result;
  const std::size_t step = s.step;
  result.steps_done = static_cast<int>(step);
  result.steps_to_target = p.log ? p.log->steps_to_target() : -1;
  result.final_train_loss = s.last_loss;
  if (result.diverged) result.final_eval_loss = std::numeric_limits<double>::quiet_NaN();
  result.seconds = seconds_since(s.t0);
  result.device = p.backend.name();
  result.step_seconds = s.step_seconds;
  const std::size_t steps_run = step > p.start ? step - p.start : 0;
  if (steps_run > 0 && s.step_seconds > 0)
    result.tokens_per_second = static_cast<double>(steps_run * static_cast<std::size_t>(p.c.batch) *
                                                   static_cast<std::size_t>(p.c.grad_accum) *
                                                   static_cast<std::size_t>(shape.seq_len)) /
                               s.step_seconds;
  result.flops_per_token =
      transformer_flops_per_token(p.c.model, static_cast<std::size_t>(shape.seq_len));
  result.world_size = p.comm.size();
  result.batch_threads = p.backend.batch_threads();
  result.distributed = p.comm.name();
  result.skipped_steps = s.outliers ? s.outliers->skipped : 0;
  const std::vector<ParamGroupPlan> plan = plan_param_groups(p.c);  // in p.opt's group order
  for (std::size_t g = 0; g < p.opt.size(); ++g) {
    const Optimizer<float>& opt = *p.opt.group(g).optimizer;
    for (std::size_t i = 0; i < opt.parameters().size(); ++i) {
      const std::size_t n = opt.parameters()[i].param->size();
      result.param_tensors += 1;
      result.param_values += n;
      if (opt.decays(i) && plan.at(g).weight_decay > 0) {
        result.decayed_tensors += 1;
        result.decayed_values += n;
      }
    }
  }
  if (steps_run > 0)
    result.allreduce_seconds_per_step = s.allreduce_seconds / static_cast<double>(steps_run);
  if (p.c.measure_peaks && steps_run > 0 && p.context.backend == Backend::cpu &&
      p.comm.size() == 1) {
    result.fma_peak = measure_fma_peak(p.context.threads);
    result.gemm_peak_gflops = measure_gemm_peak_gflops<float>(p.context.threads);
    if (p.c.precision == GemmPrecision::bf16 && amx_support().usable)
      result.amx_peak = measure_amx_peak(p.context.threads);
  }
}

// The run's last checks and files: the replicas agree, the final checkpoint, and on rank 0
// OUT/attention.json and OUT/summary.json.
void finish_outputs(const RunParts& p, const LoopState& s) {
  const TrainResult& result = s.result;
  if (p.comm.size() > 1 && !result.diverged) {
    p.backend.sync_host();
    check_replicas(p.comm, p.params, s.step);
  }
  // A diverged model is never saved: its weights may hold non-finite values.
  if (!result.diverged)
    p.saver.save(s.step, p.backend, p.opt, p.params, p.data_rng, outlier_state(s));
  if (p.lead && s.st.example_tq > 0)  // "init" is this invocation's first eval (the resumed step)
    write_attention_file(p.c.out + "/attention.json", s.first_st, p.start, s.st, s.eval_step);
  if (p.lead) write_summary(p.c.out + "/summary.json", p.c, result);
}

}  // namespace attnlab::app
