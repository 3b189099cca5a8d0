// The subcommands of the attnlab CLI, one source file each. A subcommand is a struct that holds
// the values of its flags (CLI11 writes into them while it parses, so the struct must stay where
// it is from add_* on), an add_* function that registers the subcommand and its flags, and a run_*
// function that does the work once the command line has parsed. run_* returns the exit status;
// bad input is thrown (BadInput, or what the application throws) and reported by main.
#pragma once

#include <cstdint>
#include <string>

#include <CLI/CLI.hpp>

#include "attnlab/app/context.hpp"
#include "attnlab/app/layer_check.hpp"
#include "attnlab/app/run_config.hpp"
#include "attnlab/app/saturation.hpp"
#include "attnlab/app/study.hpp"
#include "attnlab/app/tasks.hpp"
#include "attnlab/app/token_file.hpp"
#include "attnlab/app/tokenizer.hpp"
#include "attnlab/app/trainer.hpp"
#include "attnlab/distributed.hpp"
#include "common.hpp"

namespace attnlab::cli {

// train: one model; under mpirun the only subcommand that splits its work across the processes.
struct TrainCommand {
  CLI::App* cmd = nullptr;
  app::TrainConfig config;
  app::Context context;  // threads: the number of cores unless --threads says otherwise
  bool quiet = false;
};
void add_train_command(CLI::App& cli, TrainCommand& train);
int run_train_command(TrainCommand& train, Communicator& comm, CliContext& cli);

// eval: loss, accuracy and example predictions of a saved run.
struct EvalCommand {
  CLI::App* cmd = nullptr;
  std::string dir, valid, logits;
  int show = 4;
};
void add_eval_command(CLI::App& cli, EvalCommand& eval);
int run_eval_command(const EvalCommand& eval);

// study: the scaling study's grid of runs, or its outputs again (--report-only).
struct StudyCommand {
  CLI::App* cmd = nullptr;
  app::StudyPreset preset = app::StudyPreset::quick;
  app::StudyOptions options;
  std::string config;  // a study plan file instead of the preset
  bool dump_config = false, report_only = false, quiet = false;
};
void add_study_command(CLI::App& cli, StudyCommand& study);
int run_study_command(StudyCommand& study, const CliContext& cli);

// gradcheck: a central-difference gradient check of one layer.
struct GradcheckCommand {
  CLI::App* cmd = nullptr;
  app::CheckableLayer layer = app::CheckableLayer::attention;
  TransformerConfig model = app::default_model();
  int batch = 2, seq = 5;
  std::uint64_t seed = 0;
};
void add_gradcheck_command(CLI::App& cli, GradcheckCommand& gradcheck);
int run_gradcheck_command(const GradcheckCommand& gradcheck);

// saturation: attention saturation at initialisation against d_k.
struct SaturationCommand {
  CLI::App* cmd = nullptr;
  app::SaturationConfig config;
  std::string out = "runs/saturation";
};
void add_saturation_command(CLI::App& cli, SaturationCommand& saturation);
int run_saturation_command(const SaturationCommand& saturation, const CliContext& cli);

// generate: continue a prompt with a trained text model.
struct GenerateCommand {
  CLI::App* cmd = nullptr;
  app::GenerateRequest request;
  app::Context context;
  bool no_cache = false;
};
void add_generate_command(CLI::App& cli, GenerateCommand& generate);
int run_generate_command(GenerateCommand& generate);

// make-data: a task's examples written as data files.
struct MakeDataCommand {
  CLI::App* cmd = nullptr;
  app::TaskConfig task;
  std::string out = "data";
  int train = 2000, valid = 512;
  std::uint64_t seed = 0;
};
void add_make_data_command(CLI::App& cli, MakeDataCommand& make_data);
int run_make_data_command(const MakeDataCommand& make_data);

// tokenize: a BPE tokenizer trained (tokenize train), or text encoded with one (tokenize encode).
struct TokenizeCommand {
  CLI::App* cmd = nullptr;
  CLI::App* train = nullptr;
  CLI::App* encode = nullptr;
  app::TokenizerTrainOptions train_options;
  app::EncodeOptions encode_options;
};
void add_tokenize_command(CLI::App& cli, TokenizeCommand& tokenize);
int run_tokenize_command(const TokenizeCommand& tokenize);

}  // namespace attnlab::cli
