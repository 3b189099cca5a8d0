// attnlab train: one model, from flags, a run config (--config) or a saved run (--resume).
#include <algorithm>
#include <atomic>
#include <cmath>
#include <csignal>
#include <cstdio>
#include <optional>
#include <string>
#include <vector>

#include "attnlab/app/param_groups.hpp"
#include "attnlab/app/token_file.hpp"
#include "attnlab/blas.hpp"
#include "commands.hpp"

namespace attnlab::cli {

using namespace attnlab::app;

namespace {

// Set by SIGINT/SIGTERM during `train`; the run reads it through its Context and stops with a
// checkpoint. The CLI's own: the library holds no such flag. Static storage because a signal
// handler can reach nothing else.
std::atomic<bool> stop_requested{false};
std::atomic<int> stop_signal{0};  // the signal that asked, for the exit status 128 + signal
static_assert(std::atomic<bool>::is_always_lock_free && std::atomic<int>::is_always_lock_free,
              "a signal handler may only store lock-free");

void on_signal(int signal) {
  stop_signal.store(signal);
  stop_requested.store(true);
}

// The flags that may come with --resume (run control and steps); any other is refused.
const std::vector<std::string> kResumeFlags = {
    "--resume", "--steps",      "--out",        "--threads",    "--thread-split",
    "--device", "--save-every", "--eval-batch", "--stop-after", "--quiet"};

// The two ways to load a whole config: added first, so that the flags after them override it.
void add_config_sources(CLI::App& train, TrainConfig& tc) {
  train
      .add_option_function<std::string>(
          "--config", [&tc](const std::string& path) { read_config_file(path, tc); },
          "load a run config (JSON, e.g. a run's OUT/config.json); flags override it. "
          "Parameter groups (param_groups: per-group optimizer, lr_mult, weight_decay) are set "
          "here only")
      ->check(CLI::ExistingFile);
  train
      .add_option_function<std::string>(
          "--resume",
          [&tc](const std::string& dir) {
            tc.task.tokenizer = dir + "/" + app::kTokenizerModel;  // a BPE run's own copy
            read_run_config(dir, tc);
            tc.resume = dir;
            tc.out = dir;
          },
          "continue the run saved in this directory (with its config, threads, thread split "
          "and device; only --steps, --out, --threads, --thread-split, --device, --save-every, "
          "--eval-batch, --stop-after and --quiet may be given)")
      ->check(CLI::ExistingDirectory);
}

void add_data_flags(CLI::App& train, TrainConfig& tc) {
  train
      .add_option("--data", tc.data_file,
                  "train on this data file (format: data/README.md; with --task text, any text "
                  "file, or a token directory of attnlab tokenize encode)")
      ->check(CLI::ExistingPath);
  train.add_option("--valid", tc.valid_file, "evaluate on this data file")
      ->check(CLI::ExistingFile);
  train
      .add_option("--pack-documents", tc.pack_documents,
                  "task text: the corpus is documents ended by this delimiter (escapes \\n \\t "
                  "\\r \\\\; with no value a blank line); attention stays within a document, "
                  "causally, and no target crosses one. A BPE token directory uses "
                  "its own document starts (tokenize encode --doc-delimiter)")
      ->expected(0, 1)
      ->default_str("\\n\\n");
  train.add_flag("--pack-rope-restart", tc.pack_rope_restart,
                 "with --pack-documents and --positions rope: positions restart at each document");
}

// --pack-documents' value with its escapes (\n, \t, \r, \\) decoded; one line and exit 2 for
// an empty delimiter or another escape.
std::string document_delimiter(const std::string& text) {
  const auto bad = [&](const std::string& why) {
    return BadInput(
        "train: --pack-documents expected a non-empty delimiter (escapes \\n \\t "
        "\\r \\\\; with no value a blank line), got '" +
        text + "'" + why);
  };
  std::string out;
  for (std::size_t i = 0; i < text.size(); ++i) {
    if (text[i] != '\\') {
      out += text[i];
      continue;
    }
    const char e = i + 1 < text.size() ? text[++i] : '\0';
    if (e == 'n')
      out += '\n';
    else if (e == 't')
      out += '\t';
    else if (e == 'r')
      out += '\r';
    else if (e == '\\')
      out += '\\';
    else
      throw bad(" (an unknown escape)");
  }
  if (out.empty()) throw bad("");
  return out;
}

// The optimizer, the schedule and the steps: the enum knobs and the switches here, the numeric
// knobs of TrainConfig (lr, steps, batch, ..., the evals and checkpoints) from their table.
void add_optimizer_flags(CLI::App& train, TrainConfig& tc) {
  add_enum_option(train, "--optimizer", tc.optimizer, "optimizer");
  train
      .add_option("--muon-nesterov", tc.muon_nesterov,
                  "Muon: Nesterov momentum (true, muon.py's default) or plain")
      ->capture_default_str();
  add_enum_option(train, "--muon-scale", tc.muon_scale, "Muon: the update scale");
  add_enum_option(train, "--schedule", tc.schedule, "LR schedule");
  add_enum_option(train, "--decay", tc.decay,
                  "AdamW's weight decay per step (SGD's is coupled L2: the default only)");
  add_enum_option(train, "--decay-params", tc.decay_params,
                  "the parameters --weight-decay applies to");
  add_enum_option(train, "--precision", tc.precision,
                  "the arithmetic of the GEMMs (on a device, bf16 also runs the attention on "
                  "tensor cores)");
  add_knob_flags(train, tc);
}

// Where and how the run goes: threads, device, outputs, checkpoints, progress (the intervals of
// the evals and checkpoints are knobs, above).
void add_run_control_flags(CLI::App& train, TrainCommand& t) {
  TrainConfig& tc = t.config;
  train.add_option("--threads", t.context.threads, "worker threads")
      ->check(CLI::Range(1, 1024))
      ->capture_default_str();
  add_enum_option(train, "--thread-split", tc.thread_split, "how the threads share a CPU step");
  add_enum_option(train, "--device", t.context.backend, "where the training step runs");
  train.add_option("--out", tc.out, "output directory")->capture_default_str();
  train.add_flag("--weights-only", tc.weights_only,
                 "checkpoints hold the weights and config only (no optimizer state): smaller "
                 "files to evaluate or share, not to resume");
  train
      .add_option("--stop-after", tc.stop_after,
                  "stop after step N with a checkpoint, as if interrupted (exit 130)")
      ->check(CLI::Range(1, 100000000));
  train.add_flag("--quiet", t.quiet, "no progress output");
}

// With --resume the saved run's config decides everything but run control and steps.
void check_resume_flags(const CLI::App& train) {
  for (const CLI::Option* opt : train.get_options())
    if (opt->count() > 0 &&
        std::find(kResumeFlags.begin(), kResumeFlags.end(), opt->get_name()) == kResumeFlags.end())
      throw BadInput(opt->get_name() +
                     " cannot be given with --resume: the saved run's config decides it "
                     "(with --resume only --steps, --out, --threads, --device, "
                     "--thread-split, --save-every, --stop-after and --quiet may be given)");
}

// Tokens/s of the training steps and, on the CPU, the model FLOPs utilisation against the two
// peaks the trainer measured after the steps at the run's thread count: the cores' FMA peak (what
// the cores can do at all) and the sgemm peak (nanoGPT's and llm.c's MFU denominator).
void print_throughput(const TrainResult& r) {
  if (r.tokens_per_second <= 0) return;
  const double gflops = r.flops_per_token * r.tokens_per_second / 1e9;
  std::fprintf(stdout, "throughput: %.0f tokens/s, %.2f MFLOP/token, %.1f GFLOP/s\n",
               r.tokens_per_second, r.flops_per_token / 1e6, gflops);
  if (r.fma_peak.gflops <= 0) return;
  std::fprintf(stdout,
               "utilisation: %.0f%% of the cores' FMA peak measured now, %s; MFU %.0f%% of the "
               "sgemm peak measured now, %.1f GFLOP/s (core %s)\n",
               100 * gflops / r.fma_peak.gflops, to_string(r.fma_peak).c_str(),
               100 * gflops / r.gemm_peak_gflops, r.gemm_peak_gflops, blas_info().core.c_str());
  if (r.amx_peak.gflops > 0)
    std::fprintf(stdout, "bf16: %.0f%% of the cores' AMX bf16 peak measured now, %s\n",
                 100 * gflops / r.amx_peak.gflops, to_string(r.amx_peak).c_str());
}

// A finished run's last lines on rank 0: steps, time, losses, throughput and the output files.
void print_done(const TrainResult& r, const TrainConfig& config) {
  std::string where = r.device;
  if (r.world_size > 1)
    where += " x " + r.distributed;  // "cpu x MPI (Open MPI v4.1.4), 2 processes"
  std::fprintf(stdout,
               "done: %d steps in %.1f s on %s, eval loss %.4f (at init %.4f), eval accuracy "
               "%.3f",
               r.steps_done, r.seconds, where.c_str(), r.final_eval_loss, r.init_eval_loss,
               r.final_eval_acc);
  if (std::isfinite(r.final_eval_bpb))
    std::fprintf(stdout, ", %.4f bits per byte", r.final_eval_bpb);
  std::fprintf(stdout, "\n");
  if (r.world_size > 1 && r.tokens_per_second > 0)  // MFU needs the peak of N processes: not shown
    std::fprintf(stdout,
                 "throughput: %.0f tokens/s over %d processes; gradient allreduce %.2f ms per step "
                 "on rank 0\n",
                 r.tokens_per_second, r.world_size, 1e3 * r.allreduce_seconds_per_step);
  else
    print_throughput(r);
  if (config.weight_decay > 0)
    std::fprintf(stdout,
                 "weight decay %g (decay_params %s%s): %zu of %zu parameter tensors, %zu of %zu "
                 "values\n",
                 config.weight_decay, to_string(config.decay_params).data(),
                 config.decay == WeightDecayMode::independent ? ", independent of the base lr" : "",
                 r.decayed_tensors, r.param_tensors, r.decayed_values, r.param_values);
  if (r.skipped_steps > 0)
    std::fprintf(stdout,
                 "skipped the update of %d of %d steps as outliers (--skip-outliers %g: loss or "
                 "gradient norm z-score over the last 128 steps)\n",
                 r.skipped_steps, r.steps_done, config.skip_outliers);
  const char* out = config.out.c_str();
  std::fprintf(stdout,
               "outputs: %s/config.json, %s/metrics.csv, %s/metrics.jsonl, %s/summary.json, "
               "%s/model.safetensors\n",
               out, out, out, out, out);
}

int run_train(TrainConfig config, Context context, CliContext& cli) {
  context.stop = &stop_requested;
  std::signal(SIGINT, on_signal);
  std::signal(SIGTERM, on_signal);
  cli.in_train = true;
  if (config.precision == GemmPrecision::bf16 && context.backend == Backend::cpu && cli.rank == 0) {
    const BlasInfo& blas = blas_info();
    std::fprintf(stdout, "precision: bf16 gemms, %s (%s)\n", blas.bf16_engine_name.c_str(),
                 blas.bf16_reason.c_str());
    if (blas.bf16_engine == Bf16Engine::emulated)
      std::fprintf(stdout,
                   "precision: bf16 is not faster here: its gemms are emulated and run slower "
                   "than fp32 (fp32 is the default for that reason)\n");
  }
  const TrainResult r = train_model(config, context);
  // As POSIX tools: 128 + the signal (SIGINT 130, SIGTERM 143); --stop-after counts as SIGINT.
  const int signal = stop_signal.load();
  const int status = r.diverged      ? kExitDiverged
                     : r.interrupted ? (signal > 0 ? 128 + signal : kExitInterrupted)
                                     : 0;
  if (cli.rank != 0) return status;  // the same outcome on every rank; rank 0 tells it
  if (r.diverged) {
    std::fprintf(stdout, "diverged at step %d (%s); outputs in %s\n", r.diverged_step,
                 r.diverged_where.c_str(), config.out.c_str());
    return status;
  }
  if (r.interrupted) {
    std::fprintf(stdout,
                 "interrupted at step %d: checkpoint saved in %s (continue with --resume %s)\n",
                 r.steps_done, config.out.c_str(), config.out.c_str());
    return status;
  }
  print_done(r, config);
  return 0;
}

}  // namespace

void add_train_command(CLI::App& cli, TrainCommand& t) {
  t.cmd = cli.add_subcommand(
      "train", "train one model; writes metrics.csv, summary.json, model.safetensors");
  CLI::App& train = *t.cmd;
  t.config.model.block.attn_only = false;
  add_config_sources(train, t.config);
  add_task_flags(train, t.config.task);
  add_data_flags(train, t.config);
  add_model_flags(train, t.config.model);
  add_optimizer_flags(train, t.config);
  add_run_control_flags(train, t);
}

namespace {

// A resumed run goes on with the saved run's threads, thread split and device, each of which
// changes the last digits of the results, unless the command line gives them; one given with
// another value is used, and rank 0 says that the results will differ from the unbroken run's.
void restore_run_context(TrainCommand& t, const CliContext& cli) {
  const std::string path = t.config.resume + "/model.safetensors";
  const std::optional<RunContextRecord> saved = read_run_context(read_run_meta(path), path);
  if (!saved) return;  // written before the record was kept: the flags and defaults decide
  std::string changed;
  const auto take = [&](const char* flag, auto& value, const auto& was, auto text) {
    if (t.cmd->count(flag) == 0)
      value = was;
    else if (value != was)
      changed += std::string(changed.empty() ? "" : ", ") + flag + " " + text(value) +
                 " (the saved run's: " + text(was) + ")";
  };
  const auto number = [](int n) { return std::to_string(n); };
  const auto name = [](auto e) { return std::string(enum_name(e)); };
  take("--threads", t.context.threads, saved->threads, number);
  take("--thread-split", t.config.thread_split, saved->thread_split, name);
  take("--device", t.context.backend, saved->device, name);
  if (!changed.empty() && cli.rank == 0)
    std::fprintf(stderr,
                 "attnlab: warning: train: resuming with %s: the results will differ from an "
                 "uninterrupted run's in the last digits\n",
                 changed.c_str());
}

}  // namespace

int run_train_command(TrainCommand& t, Communicator& comm, CliContext& cli) {
  TrainConfig& tc = t.config;
  if (!tc.resume.empty()) {
    check_resume_flags(*t.cmd);
    restore_run_context(t, cli);
  }
  if (t.cmd->count("--pack-documents") > 0)
    tc.pack_documents = document_delimiter(tc.pack_documents);
  tc.progress = !t.quiet;
  tc.measure_peaks = true;
  prepare_token_task(tc);  // a token directory's BPE tokenizer, from --data DIR
  prepare_task(tc);        // a text task's vocabulary, from --data
  try {
    validate(tc);
  } catch (const std::invalid_argument& e) {
    throw BadInput(with_heads_hint(e.what(), tc.model));
  }
  t.context.comm = &comm;
  if ((!tc.param_groups.empty() || tc.optimizer == OptimizerKind::muon) && !t.quiet &&
      cli.rank == 0) {  // for the user to check them
    std::fprintf(stdout, "%s\n", param_groups_text(plan_param_groups(tc)).c_str());
    std::fflush(stdout);
  }
  return run_train(tc, t.context, cli);
}

}  // namespace attnlab::cli
