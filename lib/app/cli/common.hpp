// The pieces every subcommand of the attnlab CLI shares: exit statuses, the one-line error report,
// the invocation's place in an MPI job, and the flags that several subcommands take.
//
// The application (lib/app) and the library throw; the CLI turns what they throw into one line
// "attnlab: error: ..." on stderr and an exit status (main.cpp decides which).
#pragma once

#include <stdexcept>
#include <string>

#include <CLI/CLI.hpp>

#include "attnlab/app/tasks.hpp"
#include "attnlab/enum_table.hpp"
#include "attnlab/nn/transformer.hpp"

namespace attnlab::cli {

inline constexpr int kExitFailure = 1;
inline constexpr int kExitBadInput = 2;
inline constexpr int kExitDiverged = 3;
inline constexpr int kExitInterrupted = 130;

// Any problem with what the user gave us: printed as one line, exit status 2.
struct BadInput : std::runtime_error {
  using std::runtime_error::runtime_error;
};

// This invocation's place in an MPI job (rank 0 of 1 when not launched by MPI), and what the error
// report needs to know about how far it got. Made by main and passed to whoever reports.
struct CliContext {
  int rank = 0, world = 1;
  // True once train_model was entered: a non-zero rank then prints its own setup error (the ranks
  // agreed on who reports; see PeerFailure), where before it every rank failed alike.
  bool in_train = false;
  bool blas_warning_printed = false;  // print_blas_warning's once per process
  std::string command = "attnlab";    // the subcommand being run, for messages
};

// One line of at most about 2,000 characters: newlines and tabs become spaces, control characters
// and bytes that are not UTF-8 become '?' (a message may quote a hostile file).
std::string printable_line(std::string_view text);

// Prints `message` as one line (printable_line) on rank 0 only, unless `this_rank_only` (an error
// of this rank's alone: then the line names the rank); returns `status`.

int error_line(const CliContext& cli, const std::string& message, int status,
               bool this_rank_only = false);

// The BLAS choice's warning (e.g. fast kernels failed their self-check), once per process on
// stderr.
void print_blas_warning(CliContext& cli);

// Rejects NaN and infinities, which CLI11's Range lets through (every comparison with NaN fails).
extern const CLI::Validator kFinite;

// The flags of the numeric knobs (attnlab/app/config_bounds.hpp) reached from `root`, in the
// table's order: each bound to its field, checked against its bound (which a file's value of the
// same key meets too, with the same message), its help from the table with the default (the
// field's value now, or what 0 means). Root: app::TaskConfig, TransformerConfig or
// app::TrainConfig (the knobs outside task and model).
template <class Root>
void add_knob_flags(CLI::App& cmd, Root& root);

// A flag's choices: the names of E's table (attnlab/enum_table.hpp), refused as CLI11 refuses any
// other value ("--norm: batchnorm not in {layernorm,rmsnorm,none}").
template <TableEnum E>
CLI::IsMember choices() {
  return CLI::IsMember(enum_name_list<E>());
}

// A flag that sets `value` by name: its choices from E's table, the help `what` followed by the
// table's help of each name, and the default shown as the name of `value` when the flag is added.
// Bound as a callback, so like every flag it overrides what --config or --resume loaded.
template <TableEnum E>
CLI::Option* add_enum_option(CLI::App& cmd, const std::string& flag, E& value,
                             const std::string& what) {
  return cmd
      .add_option_function<std::string>(
          flag, [&value](const std::string& name) { value = parse_enum<E>(name); },
          what + " (" + enum_help_text<E>() + ")")
      ->check(choices<E>())
      ->default_str(std::string(enum_name(value)));
}

// Flags shared by train and gradcheck, bound to the model config's own fields (a flag given on the
// command line overrides what --config or --resume loaded: CLI11 stores the flags after those
// two options' callbacks ran, in the order the options were added).
void add_model_flags(CLI::App& cmd, TransformerConfig& m);

// Flags shared by train and make-data: the task and its shape.
void add_task_flags(CLI::App& cmd, app::TaskConfig& t);

// A d_model that the heads do not divide: the config's error, plus the flags to change.
std::string with_heads_hint(const std::string& message, const TransformerConfig& m);

}  // namespace attnlab::cli
