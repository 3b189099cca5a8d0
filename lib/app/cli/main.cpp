// attnlab: the command-line tool. A thin layer: CLI11 parses and validates the flags, lib/app
// does the work. Exit status: 0 success, 1 a failed check or I/O failure, 2 bad input (one line
// "attnlab: error: ..." on stderr), 3 a diverged training run, 130 interrupted by SIGINT or
// --stop-after and 143 by SIGTERM (checkpoint saved).
//
// Under an MPI launcher (mpirun -np N attnlab train ...), `train` splits each batch across the N
// processes (attnlab/distributed.hpp); rank 0 alone prints and writes files. Bad input is found by
// every rank and reported once, by rank 0. A rank that fails mid-run prints its error and ends the
// job with MPI_Abort, so no rank waits forever in a collective.
//
// This file builds the command line and maps what the subcommands throw to exit statuses; each
// subcommand lives in its own file (commands.hpp).
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <optional>
#include <string>

#include <CLI/CLI.hpp>

#include "attnlab/app/data_file.hpp"
#include "attnlab/blas.hpp"
#include "attnlab/cuda.hpp"
#include "attnlab/distributed.hpp"
#include "attnlab/io/checkpoint.hpp"
#include "attnlab/memory.hpp"
#include "attnlab/threads.hpp"
#include "commands.hpp"

using namespace attnlab;
using namespace attnlab::cli;

namespace {

// Every subcommand's flags, in the order of the help text.
struct Commands {
  TrainCommand train;
  EvalCommand eval;
  StudyCommand study;
  GradcheckCommand gradcheck;
  SaturationCommand saturation;
  GenerateCommand generate;
  MakeDataCommand make_data;
  TokenizeCommand tokenize;
};

// The build: version, git revision, backends (CUDA with its devices, MPI, OpenMP's threads), BLAS.
std::string version_text(CliContext& cli) {
  print_blas_warning(cli);
  std::string cuda = "not built";
  if (cuda_built()) {
    const int devices = cuda_device_count();
    cuda = "built, " + (devices == 0 ? std::string("no device")
                                     : std::to_string(devices) + " device" +
                                           (devices == 1 ? "" : "s") + ": " + cuda_device_name());
  }
  const std::string mpi =
      !mpi_built() ? "not built"
                   : (cli.world > 1 ? "built, " + std::to_string(cli.world) + " processes"
                                    : "built (launch with mpirun -np N)");
  const std::string sentencepiece =
      app::sentencepiece_built() ? "built (BPE: attnlab tokenize)" : "not built";
  return std::string("attnlab ") + ATTNLAB_VERSION + " (git " + ATTNLAB_GIT_REVISION + ")" +
         "\nbackends: cpu (OpenMP, " + std::to_string(default_num_threads()) +
         " threads by default); cuda: " + cuda + "; mpi: " + mpi +
         "\ntokenizer: sentencepiece: " + sentencepiece + "\nblas: " + blas_summary(blas_info()) +
         "\ncpu features: " + to_string(blas_info().cpu);
}

// The top-level options and every subcommand, bound to `commands`.
void add_commands(CLI::App& app, Commands& commands, CliContext& cli) {
  app.require_subcommand(1);
  app.set_version_flag(
      "--version", [&cli] { return version_text(cli); },
      "print the version, git revision, backends and BLAS kernels, then exit");
  app.set_help_all_flag("--help-all", "help for every subcommand");
  add_train_command(app, commands.train);
  add_eval_command(app, commands.eval);
  add_study_command(app, commands.study);
  add_gradcheck_command(app, commands.gradcheck);
  add_saturation_command(app, commands.saturation);
  add_generate_command(app, commands.generate);
  add_make_data_command(app, commands.make_data);
  add_tokenize_command(app, commands.tokenize);
}

// Parses the command line: nullopt when a subcommand is to run, else the exit status (help and
// --version print on rank 0 only; a parse error is bad input).
std::optional<int> parse(CLI::App& app, int argc, char** argv, const CliContext& cli) {
  try {
    app.parse(argc, argv);
  } catch (const CLI::CallForHelp& e) {
    return cli.rank == 0 ? app.exit(e) : 0;
  } catch (const CLI::CallForAllHelp& e) {
    return cli.rank == 0 ? app.exit(e) : 0;
  } catch (const CLI::CallForVersion& e) {
    return cli.rank == 0 ? app.exit(e) : 0;
  } catch (const CLI::ParseError& e) {
    if (argc > 1 && argv[1][0] != '-' && app.get_subcommands().empty())
      return error_line(
          cli,
          std::string("unknown subcommand '") + argv[1] +
              "' (expected train, eval, generate, study, gradcheck, saturation, make-data or "
              "tokenize)",
          kExitBadInput);
    return error_line(cli, e.what(), kExitBadInput);
  } catch (const std::exception& e) {  // --config or --resume could not be loaded
    return error_line(cli, e.what(), kExitBadInput);
  }
  return std::nullopt;
}

// Runs the parsed subcommand; what it throws is main's to report.
int run_command(const CLI::App& app, Commands& c, Communicator& comm, CliContext& cli) {
  if (cli.rank == 0) print_blas_warning(cli);
  if (!app.get_subcommands().empty()) cli.command = app.get_subcommands().front()->get_name();
  if (cli.world > 1 && !*c.train.cmd)
    throw BadInput(std::string(app.get_subcommands().front()->get_name()) +
                   ": runs in one process; under mpirun only train splits its work across the " +
                   std::to_string(cli.world) + " processes");
  if (*c.train.cmd) return run_train_command(c.train, comm, cli);
  if (*c.generate.cmd) return run_generate_command(c.generate);
  if (*c.eval.cmd) return run_eval_command(c.eval);
  if (*c.study.cmd) return run_study_command(c.study, cli);
  if (*c.gradcheck.cmd) return run_gradcheck_command(c.gradcheck);
  if (*c.saturation.cmd) return run_saturation_command(c.saturation, cli);
  if (*c.make_data.cmd) return run_make_data_command(c.make_data);
  if (*c.tokenize.cmd) return run_tokenize_command(c.tokenize);
  return 0;
}

// The exit status of what a subcommand threw, reported on stderr: called inside a catch block, it
// rethrows the exception to tell the kinds apart.
int report_failure(const CliContext& cli, Communicator& comm) {
  try {
    throw;
  } catch (const app::RankFailure& e) {  // the other ranks may wait in a collective: end the job
    error_line(cli, e.what(), kExitFailure, true);
    std::fflush(stderr);
    comm.abort(kExitFailure);
  } catch (const app::PeerFailure& e) {
    return error_line(cli, e.what(), e.bad_input() ? kExitBadInput : kExitFailure, !e.quiet());
  } catch (const BadInput& e) {
    return error_line(cli, e.what(), kExitBadInput, cli.in_train);
  } catch (const app::DataFileError& e) {
    return error_line(cli, e.what(), kExitBadInput, cli.in_train);
  } catch (const CheckpointError& e) {
    return error_line(cli, e.what(), kExitBadInput, cli.in_train);
  } catch (const std::invalid_argument& e) {
    return error_line(cli, e.what(), kExitBadInput, cli.in_train);
  } catch (const std::bad_alloc& e) {  // past the memory estimate's check (see run_config.hpp)
    const bool sized = dynamic_cast<const OutOfMemory*>(&e) != nullptr;
    return error_line(cli,
                      cli.command + ": out of memory: " +
                          (sized ? e.what() : "a tensor could not be allocated (std::bad_alloc)") +
                          " (the run's estimate was within ATTNLAB_MEMORY_LIMIT or the memory "
                          "available when it started)",
                      kExitFailure, cli.in_train);
  } catch (const std::exception& e) {  // a ReplicaMismatch comes to every rank: rank 0 tells it
    return error_line(cli, e.what(), kExitFailure,
                      cli.in_train && dynamic_cast<const ReplicaMismatch*>(&e) == nullptr);
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  // The BLAS kernels for this CPU, first: where OpenBLAS loaded a generic fallback core, this
  // starts the program again with OPENBLAS_CORETYPE set (attnlab/blas.hpp), before MPI, malloc
  // tuning or any thread of attnlab's.
  attnlab::blas::init_process(argv);
  // Steps reuse their freed activations instead of page-faulting them in again; a user's own
  // malloc settings win.
  if (!std::getenv("MALLOC_MMAP_THRESHOLD_") && !std::getenv("MALLOC_TRIM_THRESHOLD_") &&
      !std::getenv("GLIBC_TUNABLES"))
    attnlab::keep_freed_memory();
  CliContext cli;
  // Under mpirun: MPI's world (finalised when main returns); otherwise a single process.
  std::unique_ptr<Communicator> comm;
  try {
    comm = init_distributed(&argc, &argv);
  } catch (const std::exception& e) {
    return error_line(cli, e.what(), kExitFailure);
  }
  cli.rank = comm->rank();
  cli.world = comm->size();
  CLI::App app{
      "attnlab: train toy transformers and measure how attention scaling (none, 1/sqrt(d_k), "
      "1/d_k) affects stability"};
  Commands commands;
  add_commands(app, commands, cli);
  if (const std::optional<int> status = parse(app, argc, argv, cli)) return *status;

  try {
    return run_command(app, commands, *comm, cli);
  } catch (...) {
    return report_failure(cli, *comm);
  }
}
