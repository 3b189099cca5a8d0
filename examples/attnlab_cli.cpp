// attnlab: the command-line tool. A thin layer: CLI11 parses and validates the flags, lib/app
// does the work. Exit status: 0 success, 1 a failed check or I/O failure, 2 bad input (one line
// "attnlab: error: ..." on stderr), 3 a diverged training run, 130 interrupted by SIGINT or
// --stop-after and 143 by SIGTERM (checkpoint saved).
//
// Under an MPI launcher (mpirun -np N attnlab train ...), `train` splits each batch across the N
// processes (attnlab/distributed.hpp); rank 0 alone prints and writes files. Bad input is found by
// every rank and reported once, by rank 0. A rank that fails mid-run prints its error and ends the
// job with MPI_Abort, so no rank waits forever in a collective.
#include <algorithm>
#include <atomic>
#include <cmath>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <iostream>
#include <string>

#include <CLI/CLI.hpp>

#include "attnlab/app/data_file.hpp"
#include "attnlab/app/layer_check.hpp"
#include "attnlab/app/plot.hpp"
#include "attnlab/app/saturation.hpp"
#include "attnlab/app/study.hpp"
#include "attnlab/app/tasks.hpp"
#include "attnlab/app/trainer.hpp"
#include "attnlab/blas.hpp"
#include "attnlab/context.hpp"
#include "attnlab/cuda.hpp"
#include "attnlab/distributed.hpp"
#include "attnlab/io/checkpoint.hpp"
#include "attnlab/memory.hpp"
#include "attnlab/threads.hpp"

using namespace attnlab;
using namespace attnlab::app;

namespace {

constexpr int kExitFailure = 1;
constexpr int kExitBadInput = 2;
constexpr int kExitDiverged = 3;
constexpr int kExitInterrupted = 130;

// Any problem with what the user gave us: printed as one line, exit status 2.
struct BadInput : std::runtime_error {
  using std::runtime_error::runtime_error;
};

// This process's place in an MPI job (rank 0 of 1 when not launched by MPI).
int g_rank = 0, g_world = 1;

// Prints on rank 0 only, unless `this_rank_only` (an error of this rank's alone: then the line
// names the rank).
int error_line(const std::string& message, int status, bool this_rank_only = false) {
  if (g_rank != 0 && !this_rank_only) return status;
  std::string one = message;
  for (char& c : one)
    if (c == '\n' || c == '\r') c = ' ';
  if (g_world > 1 && g_rank != 0 && !one.starts_with("rank "))  // RankFailure names it already
    std::fprintf(stderr, "attnlab: error: rank %d: %s\n", g_rank, one.c_str());
  else
    std::fprintf(stderr, "attnlab: error: %s\n", one.c_str());
  return status;
}

// blas::init's warning (e.g. fast kernels failed their self-check), once per process on stderr.
void print_blas_warning() {
  static bool printed = false;
  const std::string& warning = blas_info().warning;
  if (printed || warning.empty()) return;
  printed = true;
  std::fprintf(stderr, "attnlab: warning: %s\n", warning.c_str());
}

// The build: version, git revision, backends (CUDA with its devices, MPI, OpenMP's threads), BLAS.
std::string version_text() {
  print_blas_warning();
  std::string cuda = "not built";
  if (cuda_built()) {
    const int devices = cuda_device_count();
    cuda = "built, " + (devices == 0 ? std::string("no device")
                                     : std::to_string(devices) + " device" +
                                           (devices == 1 ? "" : "s") + ": " + cuda_device_name());
  }
  const std::string mpi = !mpi_built()
                              ? "not built"
                              : (g_world > 1 ? "built, " + std::to_string(g_world) + " processes"
                                             : "built (launch with mpirun -np N)");
  return std::string("attnlab ") + ATTNLAB_VERSION + " (git " + ATTNLAB_GIT_REVISION + ")" +
         "\nbackends: cpu (OpenMP, " + std::to_string(default_num_threads()) +
         " threads by default); cuda: " + cuda + "; mpi: " + mpi +
         "\nblas: " + blas_summary(blas_info()) + "\ncpu features: " + to_string(blas_info().cpu);
}

// Set by SIGINT/SIGTERM during `train`; the run reads it through its Context and stops with a
// checkpoint. The CLI's own: the library holds no such flag.
std::atomic<bool> stop_requested{false};
std::atomic<int> stop_signal{0};  // the signal that asked, for the exit status 128 + signal
static_assert(std::atomic<bool>::is_always_lock_free && std::atomic<int>::is_always_lock_free,
              "a signal handler may only store lock-free");

void on_signal(int signal) {
  stop_signal.store(signal);
  stop_requested.store(true);
}

// Rejects NaN and infinities, which CLI11's Range lets through (every comparison with NaN fails).
const CLI::Validator kFinite(
    [](std::string& text) {
      try {
        std::size_t used = 0;
        const double v = std::stod(text, &used);
        if (used == text.size() && std::isfinite(v)) return std::string();
      } catch (const std::exception&) {
      }
      return "value " + text + " is not a finite number";
    },
    "FINITE");

// A dropout probability: 0 <= p < 1.
const CLI::Validator kDropProbability(
    [](std::string& text) {
      try {
        std::size_t used = 0;
        const double v = std::stod(text, &used);
        if (used == text.size() && v >= 0.0 && v < 1.0) return std::string();
      } catch (const std::exception&) {
      }
      return "value " + text + " is not a probability in [0, 1)";
    },
    "PROBABILITY");

const std::vector<std::string> kTasks = {"recall", "mqar", "reverse", "sort", "text"};
const std::vector<std::string> kModes = {"none", "sqrt_dk", "dk"};

// Flags shared by train and gradcheck, bound to the model config's own fields (a flag given on the
// command line overrides what --config or --resume loaded: CLI11 stores the flags after those
// two options' callbacks ran, in the order the options were added).
void add_model_flags(CLI::App& app, TransformerConfig& m) {
  AttentionConfig& a = m.block.attention;
  app.add_option("--d-model", a.d_model, "model width C")
      ->check(CLI::Range(1, 4096))
      ->capture_default_str();
  app.add_option("--heads", a.heads, "attention heads H")
      ->check(CLI::Range(1, 256))
      ->capture_default_str();
  app.add_option("--kv-heads", a.kv_heads,
                 "key/value heads, dividing --heads (grouped-query attention; 1: multi-query; "
                 "default: --heads)")
      ->check(CLI::Range(1, 256));
  app.add_option("--d-k", a.d_k, "head dim of q and k (default d_model / heads)")
      ->check(CLI::Range(1, 8192));
  app.add_option("--d-v", a.d_v, "head dim of v (default d_model / heads)")
      ->check(CLI::Range(1, 8192));
  app.add_option("--layers", m.layers, "transformer blocks")
      ->check(CLI::Range(1, 64))
      ->capture_default_str();
  app.add_flag("--attn-only", m.block.attn_only, "blocks without the MLP");
  app.add_option("--d-ff", m.block.d_ff, "MLP width F (default 4 * d_model)")
      ->check(CLI::Range(1, 65536));
  app.add_option_function<std::string>(
         "--norm", [&m](const std::string& s) { m.block.norm = attnlab::parse_norm(s); },
         "normalisation")
      ->check(CLI::IsMember({"layernorm", "rmsnorm", "none"}))
      ->default_str(std::string(to_string(m.block.norm)));
  app.add_option_function<std::string>(
         "--positions",
         [&m](const std::string& s) { m.positions = attnlab::parse_position_encoding(s); },
         "position encoding (none suits --alibi)")
      ->check(CLI::IsMember({"learned", "sinusoidal", "none"}))
      ->default_str(std::string(to_string(m.positions)));
  app.add_flag("--qk-norm", a.qk_norm, "LayerNorm on q and k per head");
  app.add_flag("--learnable-scale", a.learnable_scale, "a learnable attention scale per head");
  app.add_flag("--alibi", a.alibi, "ALiBi: a linear distance penalty per head (Press et al. 2022)");
  app.add_flag("--causal", a.sdpa.causal, "causal attention");
  app.add_option("--window", a.sdpa.window,
                 "sliding-window attention: each query sees its N latest keys (needs --causal)")
      ->check(CLI::Range(1, 1 << 20));
  app.add_option("--attn-dropout", a.dropout,
                 "dropout on the attention weights in training (0 <= p < 1; none in eval)")
      ->check(kDropProbability);
  app.add_option("--dropout", m.block.dropout,
                 "dropout on the residual branches in training (0 <= p < 1; none in eval)")
      ->check(kDropProbability);
  app.add_option_function<std::string>(
         "--scaling", [&a](const std::string& s) { a.sdpa.scaling = parse_scaling(s); },
         "attention scale: 1, 1/sqrt(d_k) or 1/d_k")
      ->check(CLI::IsMember(kModes))
      ->default_str(std::string(to_string(a.sdpa.scaling)));
  app.add_option_function<double>(
         "--scale", [&a](const double& v) { a.sdpa.scale = v; },
         "explicit attention scale (overrides --scaling)")
      ->check(kFinite)
      ->check(CLI::PositiveNumber);
}

// A d_model that the heads do not divide: the config's error, plus the flags to change.
std::string with_heads_hint(const std::string& message, const TransformerConfig& m) {
  if (message.find("divisible by heads") == std::string::npos) return message;
  return message + " (--d-model " + std::to_string(m.d_model()) + " --heads " +
         std::to_string(m.block.attention.heads) + ": give --d-k and --d-v to decouple them)";
}

void add_task_flags(CLI::App& app, TaskConfig& t) {
  app.add_option_function<std::string>(
         "--task", [&t](const std::string& s) { t.kind = parse_task(s); }, "task")
      ->check(CLI::IsMember(kTasks))
      ->default_str(std::string(to_string(t.kind)));
  app.add_option("--keys", t.keys, "recall/mqar: key symbols")
      ->check(CLI::Range(1, 100000))
      ->capture_default_str();
  app.add_option("--values", t.values, "recall/mqar: value symbols")
      ->check(CLI::Range(1, 100000))
      ->capture_default_str();
  app.add_option("--pairs", t.pairs, "recall/mqar: key-value pairs per example")
      ->check(CLI::Range(1, 100000))
      ->capture_default_str();
  app.add_option("--queries", t.queries, "mqar: queries per example")
      ->check(CLI::Range(1, 100000))
      ->capture_default_str();
  app.add_option("--symbols", t.symbols, "reverse/sort: alphabet size")
      ->check(CLI::Range(2, 100000))
      ->capture_default_str();
  app.add_option("--length", t.length, "reverse/sort: sequence length")
      ->check(CLI::Range(1, 100000))
      ->capture_default_str();
  app.add_option("--block", t.block, "text: tokens per example (the context length)")
      ->check(CLI::Range(1, 1 << 20))
      ->capture_default_str();
  app.add_option("--vocab", t.vocab,
                 "text: char (the characters of --data, stored in the checkpoint) or byte (the "
                 "256 byte values, for any file)")
      ->check(CLI::IsMember({"char", "byte"}))
      ->capture_default_str();
}

// The flags that may come with --resume (run control and steps); any other is refused.
const std::vector<std::string> kResumeFlags = {"--resume",     "--steps",  "--out",
                                               "--threads",    "--device", "--save-every",
                                               "--stop-after", "--quiet"};

// Tokens/s of the training steps and, on the CPU, the model FLOPs utilisation: model FLOPs per
// second over the sgemm peak measured now on the run's thread count (nanoGPT's and llm.c's MFU).
void print_throughput(const TrainResult& r, const Context& context) {
  if (r.tokens_per_second <= 0) return;
  const double gflops = r.flops_per_token * r.tokens_per_second / 1e9;
  if (context.backend != Backend::cpu) {
    std::fprintf(stdout, "throughput: %.0f tokens/s, %.2f MFLOP/token, %.1f GFLOP/s\n",
                 r.tokens_per_second, r.flops_per_token / 1e6, gflops);
    return;
  }
  const double peak = measure_gemm_peak_gflops<float>(context.threads);
  std::fprintf(stdout,
               "throughput: %.0f tokens/s, %.2f MFLOP/token, %.1f GFLOP/s = MFU %.0f%% of the "
               "sgemm peak measured now (%.0f GFLOP/s at %d thread%s, core %s)\n",
               r.tokens_per_second, r.flops_per_token / 1e6, gflops, 100 * gflops / peak, peak,
               context.threads, context.threads == 1 ? "" : "s", blas_info().core.c_str());
}

// True once train_model was entered: a non-zero rank then prints its own setup error (the ranks
// agreed on who reports; see PeerFailure), where before it every rank failed alike.
bool g_in_train = false;

int run_train(TrainConfig config, Context context) {
  context.stop = &stop_requested;
  std::signal(SIGINT, on_signal);
  std::signal(SIGTERM, on_signal);
  g_in_train = true;
  const TrainResult r = train_model(config, context);
  // As POSIX tools: 128 + the signal (SIGINT 130, SIGTERM 143); --stop-after counts as SIGINT.
  const int signal = stop_signal.load();
  const int status = r.diverged      ? kExitDiverged
                     : r.interrupted ? (signal > 0 ? 128 + signal : kExitInterrupted)
                                     : 0;
  if (g_rank != 0) return status;  // the same outcome on every rank; rank 0 tells it
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
  std::string where = r.device;
  if (r.world_size > 1)
    where += " x " + r.distributed;  // "cpu x MPI (Open MPI v4.1.4), 2 processes"
  std::fprintf(stdout,
               "done: %d steps in %.1f s on %s, eval loss %.4f (at init %.4f), eval accuracy "
               "%.3f\n",
               r.steps_done, r.seconds, where.c_str(), r.final_eval_loss, r.init_eval_loss,
               r.final_eval_acc);
  if (r.world_size > 1 && r.tokens_per_second > 0)  // MFU needs the peak of N processes: not shown
    std::fprintf(stdout,
                 "throughput: %.0f tokens/s over %d processes; gradient allreduce %.2f ms per step "
                 "on rank 0\n",
                 r.tokens_per_second, r.world_size, 1e3 * r.allreduce_seconds_per_step);
  else
    print_throughput(r, context);
  const char* out = config.out.c_str();
  std::fprintf(stdout,
               "outputs: %s/config.json, %s/metrics.csv, %s/metrics.jsonl, %s/summary.json, "
               "%s/model.safetensors\n",
               out, out, out, out, out);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  // Steps reuse their freed activations instead of page-faulting them in again; a user's own
  // malloc settings win.
  if (!std::getenv("MALLOC_MMAP_THRESHOLD_") && !std::getenv("MALLOC_TRIM_THRESHOLD_") &&
      !std::getenv("GLIBC_TUNABLES"))
    attnlab::keep_freed_memory();
  // Under mpirun: MPI's world (finalised when main returns); otherwise a single process.
  std::unique_ptr<Communicator> comm;
  try {
    comm = init_distributed(&argc, &argv);
  } catch (const std::exception& e) {
    return error_line(e.what(), kExitFailure);
  }
  g_rank = comm->rank();
  g_world = comm->size();
  CLI::App app{
      "attnlab: train toy transformers and measure how attention scaling (none, 1/sqrt(d_k), "
      "1/d_k) affects stability"};
  app.require_subcommand(1);
  app.set_version_flag("--version", version_text,
                       "print the version, git revision, backends and BLAS kernels, then exit");
  app.set_help_all_flag("--help-all", "help for every subcommand");

  // ---- train ----
  auto* train = app.add_subcommand(
      "train", "train one model; writes metrics.csv, summary.json, model.safetensors");
  TrainConfig tc;
  Context train_context;  // threads: the number of cores unless --threads says otherwise
  std::string train_device = backend_name(train_context.backend);
  tc.model.block.attn_only = false;
  // First: the two ways to load a whole config; the flags below then override it.
  train
      ->add_option_function<std::string>(
          "--config", [&tc](const std::string& path) { read_config_file(path, tc); },
          "load a run config (JSON, e.g. a run's OUT/config.json); flags override it")
      ->check(CLI::ExistingFile);
  train
      ->add_option_function<std::string>(
          "--resume",
          [&tc](const std::string& dir) {
            read_run_config(dir, tc);
            tc.resume = dir;
            tc.out = dir;
          },
          "continue the run saved in this directory (with its config; only --steps, --out, "
          "--threads, --device, --save-every, --stop-after and --quiet may be given)")
      ->check(CLI::ExistingDirectory);
  add_task_flags(*train, tc.task);
  train
      ->add_option("--data", tc.data_file,
                   "train on this data file (format: data/README.md; with --task text, any text "
                   "file)")
      ->check(CLI::ExistingFile);
  train->add_option("--valid", tc.valid_file, "evaluate on this data file")
      ->check(CLI::ExistingFile);
  add_model_flags(*train, tc.model);
  train->add_option("--optimizer", tc.optimizer, "optimizer")
      ->check(CLI::IsMember({"adamw", "sgd"}))
      ->capture_default_str();
  train->add_option("--lr", tc.lr, "peak learning rate")
      ->check(kFinite)
      ->check(CLI::Range(1e-12, 1e3))
      ->capture_default_str();
  train
      ->add_option("--schedule", tc.schedule,
                   "LR schedule (cosine: linear warmup then cosine decay)")
      ->check(CLI::IsMember({"constant", "cosine"}))
      ->capture_default_str();
  train->add_option("--min-lr", tc.min_lr, "cosine: the LR at the end of the decay")
      ->check(kFinite)
      ->check(CLI::Range(0.0, 1e3))
      ->capture_default_str();
  train->add_option("--beta2", tc.beta2, "AdamW: the second moment's decay")
      ->check(kFinite)
      ->check(CLI::Range(0.0, 0.999999))
      ->capture_default_str();
  train->add_option("--warmup", tc.warmup, "warmup steps")
      ->check(CLI::Range(0, 100000000))
      ->capture_default_str();
  train->add_option("--steps", tc.steps, "training steps")
      ->check(CLI::Range(1, 100000000))
      ->capture_default_str();
  train->add_option("--batch", tc.batch, "examples per step")
      ->check(CLI::Range(1, 1000000))
      ->capture_default_str();
  train->add_option("--clip", tc.clip, "clip the global grad norm to this (0: off)")
      ->check(kFinite)
      ->check(CLI::Range(0.0, 1e12))
      ->capture_default_str();
  train->add_option("--weight-decay", tc.weight_decay, "decoupled weight decay (AdamW) or L2 (SGD)")
      ->check(kFinite)
      ->check(CLI::Range(0.0, 1e3))
      ->capture_default_str();
  train->add_option("--seed", tc.seed, "seed of the initial weights and the data stream")
      ->check(CLI::NonNegativeNumber)
      ->capture_default_str();
  train->add_option("--threads", train_context.threads, "worker threads")
      ->check(CLI::Range(1, 1024))
      ->capture_default_str();
  train
      ->add_option("--device", train_device,
                   "where the training step runs: cpu, or cuda (the whole step on the GPU; "
                   "needs a build with the CUDA backend and a device)")
      ->check(CLI::IsMember({"cpu", "cuda"}))
      ->capture_default_str();
  train->add_option("--out", tc.out, "output directory")->capture_default_str();
  train->add_option("--eval-every", tc.eval_every, "evaluate and log every N steps")
      ->check(CLI::Range(1, 100000000))
      ->capture_default_str();
  train->add_option("--eval-size", tc.eval_size, "examples in the fixed eval set")
      ->check(CLI::Range(1, 1000000))
      ->capture_default_str();
  train->add_option("--save-every", tc.save_every, "checkpoint every N steps (0: at the end only)")
      ->check(CLI::Range(0, 100000000))
      ->capture_default_str();
  train->add_flag("--weights-only", tc.weights_only,
                  "checkpoints hold the weights and config only (no optimizer state): smaller "
                  "files to evaluate or share, not to resume");
  train
      ->add_option("--stop-after", tc.stop_after,
                   "stop after step N with a checkpoint, as if interrupted (exit 130)")
      ->check(CLI::Range(1, 100000000));
  bool quiet = false;
  train->add_flag("--quiet", quiet, "no progress output");

  // ---- eval ----
  auto* eval =
      app.add_subcommand("eval", "loss, accuracy and example predictions of a trained run");
  std::string eval_dir, eval_valid, eval_logits;
  int eval_show = 4;
  eval->add_option("--checkpoint", eval_dir, "a run directory (holding model.safetensors)")
      ->required()
      ->check(CLI::ExistingDirectory);
  eval->add_option("--valid", eval_valid,
                   "evaluate on this data file instead of the task's eval set")
      ->check(CLI::ExistingFile);
  eval->add_option("--logits", eval_logits,
                   "also write the eval set's logits (N, T, V) to this safetensors file");
  eval->add_option("--show", eval_show, "examples to print")
      ->check(CLI::Range(0, 1000))
      ->capture_default_str();

  // ---- study ----
  auto* study =
      app.add_subcommand("study", "the scaling study: mode x d_k x LR x seeds, tables and plots");
  std::string preset = "quick";
  StudyOptions so;
  auto* preset_option =
      study
          ->add_option("--preset", preset,
                       "micro: seconds; quick: < 10 min on 2 cores with --jobs 2; full: hours")
          ->check(CLI::IsMember({"micro", "quick", "full"}))
          ->capture_default_str();
  std::string study_config;
  study
      ->add_option("--config", study_config,
                   "run a custom grid: a study plan as JSON (e.g. data/configs/study_micro.json)")
      ->check(CLI::ExistingFile)
      ->excludes(preset_option);
  bool dump_config = false;
  study->add_flag(
      "--dump-config", dump_config,
      "print the plan (preset or --config) as JSON and exit: a start for a custom grid");
  study->add_option("--jobs", so.jobs, "training runs in parallel (each single-threaded)")
      ->check(CLI::Range(1, 256))
      ->capture_default_str();
  study->add_option("--out", so.out, "output directory")->capture_default_str();
  study->add_option("--steps", so.steps, "override the preset's training steps")
      ->check(CLI::Range(1, 100000000));
  bool report_only = false;
  study->add_flag("--report-only", report_only,
                  "write summary.md, the figures and report.html again from the finished study "
                  "in --out (its summary.csv and runs/; no training)");
  bool study_quiet = false;
  study->add_flag("--quiet", study_quiet, "no progress output");

  // ---- gradcheck ----
  auto* gradcheck = app.add_subcommand(
      "gradcheck", "central-difference gradient check of one layer (double precision)");
  std::string layer = "attention";
  TransformerConfig gc_model = default_model();
  int gc_batch = 2, gc_seq = 5;
  std::uint64_t gc_seed = 0;
  gradcheck->add_option("--layer", layer, "layer to check")
      ->check(CLI::IsMember(checkable_layers()))
      ->capture_default_str();
  gc_model.block.attention.d_model = 8;
  gc_model.block.attention.heads = 2;
  gc_model.block.attn_only = false;
  add_model_flags(*gradcheck, gc_model);
  gradcheck->add_option("--batch", gc_batch, "batch size B")
      ->check(CLI::Range(1, 64))
      ->capture_default_str();
  gradcheck->add_option("--seq", gc_seq, "sequence length T")
      ->check(CLI::Range(1, 256))
      ->capture_default_str();
  gradcheck->add_option("--seed", gc_seed, "seed")
      ->check(CLI::NonNegativeNumber)
      ->capture_default_str();

  // ---- saturation ----
  auto* saturation = app.add_subcommand(
      "saturation", "attention saturation at initialisation vs d_k, per mode (no training)");
  SaturationConfig sc;
  std::string sat_out = "runs/saturation";
  saturation->add_option("--keys", sc.keys, "keys per query Tk")
      ->check(CLI::Range(2, 4096))
      ->capture_default_str();
  saturation->add_option("--batch", sc.batch, "sequences sampled")
      ->check(CLI::Range(1, 1024))
      ->capture_default_str();
  saturation->add_option("--d-model", sc.d_model, "model width C")
      ->check(CLI::Range(1, 4096))
      ->capture_default_str();
  saturation->add_option("--seed", sc.seed, "seed")
      ->check(CLI::NonNegativeNumber)
      ->capture_default_str();
  saturation->add_option("--out", sat_out, "output directory")->capture_default_str();

  // ---- generate ----
  auto* gen = app.add_subcommand(
      "generate", "continue a prompt with a trained text model (task text), printing as it goes");
  GenerateRequest gr;
  Context gen_context;
  std::string gen_device = backend_name(gen_context.backend);
  bool no_cache = false;
  gen->add_option("--checkpoint", gr.run_dir, "a run directory of task text")
      ->required()
      ->check(CLI::ExistingDirectory);
  gen->add_option("--prompt", gr.prompt, "the text to continue")->capture_default_str();
  gr.prompt = "\n";
  gen->add_option("--tokens", gr.tokens, "tokens to generate")
      ->check(CLI::Range(1, 100000000))
      ->capture_default_str();
  gen->add_option("--temperature", gr.sampler.temperature, "softmax temperature")
      ->check(kFinite)
      ->check(CLI::Range(1e-6, 1e6))
      ->capture_default_str();
  gen->add_option("--top-k", gr.sampler.top_k, "sample among the k most likely (0: all)")
      ->check(CLI::Range(0, 1 << 24))
      ->capture_default_str();
  gen->add_option("--top-p", gr.sampler.top_p,
                  "sample within the smallest most-likely set of this mass (nucleus)")
      ->check(CLI::Range(1e-9, 1.0))
      ->capture_default_str();
  gen->add_option("--seed", gr.sampler.seed, "seed of the sampler")
      ->check(CLI::NonNegativeNumber)
      ->capture_default_str();
  gen->add_flag("--greedy", gr.sampler.greedy, "always the most likely token (deterministic)");
  gen->add_flag("--no-cache", no_cache,
                "recompute the whole context per token instead of using the KV cache");
  gen->add_option("--threads", gen_context.threads, "worker threads")
      ->check(CLI::Range(1, 1024))
      ->capture_default_str();
  gen->add_option("--device", gen_device, "cpu or cuda")
      ->check(CLI::IsMember({"cpu", "cuda"}))
      ->capture_default_str();

  // ---- make-data ----
  auto* make_data =
      app.add_subcommand("make-data", "write DIR/<task>/{train,valid}.txt in the data-file format");
  TaskConfig md_task;
  std::string md_out = "data";
  int md_train = 2000, md_valid = 512;
  std::uint64_t md_seed = 0;
  add_task_flags(*make_data, md_task);
  make_data->add_option("--out", md_out, "data root directory")->capture_default_str();
  make_data->add_option("--train-size", md_train, "training examples")
      ->check(CLI::Range(1, 10000000))
      ->capture_default_str();
  make_data->add_option("--valid-size", md_valid, "validation examples")
      ->check(CLI::Range(1, 10000000))
      ->capture_default_str();
  make_data
      ->add_option("--seed", md_seed, "seed of the training examples (valid is the fixed eval set)")
      ->check(CLI::NonNegativeNumber)
      ->capture_default_str();

  try {
    app.parse(argc, argv);
  } catch (const CLI::CallForHelp& e) {
    return g_rank == 0 ? app.exit(e) : 0;
  } catch (const CLI::CallForAllHelp& e) {
    return g_rank == 0 ? app.exit(e) : 0;
  } catch (const CLI::CallForVersion& e) {
    return g_rank == 0 ? app.exit(e) : 0;
  } catch (const CLI::ParseError& e) {
    if (argc > 1 && argv[1][0] != '-' && app.get_subcommands().empty())
      return error_line(
          std::string("unknown subcommand '") + argv[1] +
              "' (expected train, eval, generate, study, gradcheck, saturation or make-data)",
          kExitBadInput);
    return error_line(e.what(), kExitBadInput);
  } catch (const std::exception& e) {  // --config or --resume could not be loaded
    return error_line(e.what(), kExitBadInput);
  }

  try {
    if (g_rank == 0) print_blas_warning();
    if (g_world > 1 && !*train)
      throw BadInput(std::string(app.get_subcommands().front()->get_name()) +
                     ": runs in one process; under mpirun only train splits its work across the " +
                     std::to_string(g_world) + " processes");
    if (*train) {
      if (!tc.resume.empty())
        for (const CLI::Option* opt : train->get_options())
          if (opt->count() > 0 && std::find(kResumeFlags.begin(), kResumeFlags.end(),
                                            opt->get_name()) == kResumeFlags.end())
            throw BadInput(opt->get_name() +
                           " cannot be given with --resume: the saved run's config decides it "
                           "(with --resume only --steps, --out, --threads, --device, "
                           "--save-every, --stop-after and --quiet may be given)");
      tc.progress = !quiet;
      prepare_task(tc);  // a text task's vocabulary, from --data
      try {
        validate(tc);
      } catch (const std::invalid_argument& e) {
        throw BadInput(with_heads_hint(e.what(), tc.model));
      }
      train_context.backend = parse_backend(train_device, "train", "--device");
      train_context.comm = comm.get();
      return run_train(tc, train_context);
    }
    if (*gen) {
      gr.use_cache = !no_cache;
      gen_context.backend = parse_backend(gen_device, "generate", "--device");
      bool started = false;  // the prompt is echoed once the checkpoint and prompt checked out
      const GenerateReport r = generate_from_run(gr, gen_context, [&](const std::string& piece) {
        if (!started) std::fputs(gr.prompt.c_str(), stdout);
        started = true;
        std::fputs(piece.c_str(), stdout);
        std::fflush(stdout);
      });
      std::fputs("\n", stdout);
      std::fprintf(stderr, "generated %d tokens in %.2f s: %.0f tokens/s (%s)\n", r.tokens,
                   r.seconds, r.seconds > 0 ? r.tokens / r.seconds : 0.0,
                   gr.use_cache ? "KV cache" : "no cache: the whole context per token");
      return 0;
    }
    if (*eval) {
      const EvalReport r = evaluate_run(eval_dir, eval_show, eval_valid, eval_logits);
      std::fputs(r.text.c_str(), stdout);
      return 0;
    }
    if (*study) {
      so.progress = !study_quiet;
      StudyPlan plan;
      if (study_config.empty())
        plan = study_preset(preset);
      else
        read_study_file(study_config, plan);
      if (dump_config) {
        std::printf("%s\n", to_json_text(plan).c_str());
        return 0;
      }
      const StudyOutcome r = report_only ? report_study(plan, so)
                                         : run_study(plan, so, Context{});  // each job: its own
      if (report_only)
        std::printf("study '%s': the outputs of %zu runs written again in %.1f s\n",
                    plan.preset.c_str(), r.runs.size(), r.seconds);
      else
        std::printf("\nstudy '%s': %zu runs in %.0f s\n", plan.preset.c_str(), r.runs.size(),
                    r.seconds);
      std::printf("report: %s\n", r.report_html.c_str());
      std::printf("table:  %s\n", r.summary_md.c_str());
      std::printf("csv:    %s\n", r.summary_csv.c_str());
      for (const auto& p : r.plots) std::printf("plot:   %s\n", p.c_str());
      if (!r.plot_error.empty()) return error_line(r.plot_error, kExitFailure);
      return 0;
    }
    if (*gradcheck) {
      set_num_threads(1);  // tiny double-precision layers: threads only add overhead
      GradcheckReport report;
      try {
        report = check_layer(layer, gc_model, gc_batch, gc_seq, gc_seed);
      } catch (const std::invalid_argument& e) {
        throw BadInput(with_heads_hint(e.what(), gc_model));
      }
      std::fputs(report.table().c_str(), stdout);
      const bool ok = layer_check_passed(report);
      std::printf(
          "%s: max relative error %.3g (tolerance %.0e; a tensor whose gradient norms are both "
          "under %.0e counts as a zero gradient)\n",
          ok ? "PASS" : "FAIL", report.max_rel_error(), kLayerGradTolerance, kZeroGradientNorm);
      return ok ? 0 : kExitFailure;
    }
    if (*saturation) {
      const auto rows = saturation_sweep(sc);
      std::fputs(saturation_table(rows, sc.keys).c_str(), stdout);
      try {
        write_saturation(sat_out, rows, sc.keys);
      } catch (const PlotError& e) {
        return error_line(e.what(), kExitFailure);
      }
      std::printf("\ntable: %s/saturation.md\nplot:  %s/saturation.png\n", sat_out.c_str(),
                  sat_out.c_str());
      return 0;
    }
    if (*make_data) {
      const TaskConfig c = md_task;
      task_shape(c);  // std::invalid_argument naming the field
      const std::string dir = md_out + "/" + std::string(to_string(c.kind));
      std::filesystem::create_directories(dir);
      Rng rng(md_seed);
      write_data_file(dir + "/train.txt",
                      generate_batch(c, static_cast<std::size_t>(md_train), rng),
                      to_string(c.kind));
      write_data_file(dir + "/valid.txt", eval_batch(c, static_cast<std::size_t>(md_valid)),
                      to_string(c.kind));
      std::printf("wrote %s/train.txt (%d examples) and %s/valid.txt (%d examples)\n", dir.c_str(),
                  md_train, dir.c_str(), md_valid);
      return 0;
    }
  } catch (const RankFailure& e) {  // the other ranks may wait in a collective: end the job
    error_line(e.what(), kExitFailure, true);
    std::fflush(stderr);
    comm->abort(kExitFailure);
  } catch (const PeerFailure& e) {
    return error_line(e.what(), e.bad_input() ? kExitBadInput : kExitFailure, !e.quiet());
  } catch (const BadInput& e) {
    return error_line(e.what(), kExitBadInput, g_in_train);
  } catch (const DataFileError& e) {
    return error_line(e.what(), kExitBadInput, g_in_train);
  } catch (const CheckpointError& e) {
    return error_line(e.what(), kExitBadInput, g_in_train);
  } catch (const std::invalid_argument& e) {
    return error_line(e.what(), kExitBadInput, g_in_train);
  } catch (const std::exception& e) {  // a ReplicaMismatch comes to every rank: rank 0 tells it
    return error_line(e.what(), kExitFailure,
                      g_in_train && dynamic_cast<const ReplicaMismatch*>(&e) == nullptr);
  }
  return 0;
}
