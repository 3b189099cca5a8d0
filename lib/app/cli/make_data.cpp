// attnlab make-data: a task's training and validation examples, written as data files.
#include <cstdio>
#include <filesystem>

#include "attnlab/app/data_file.hpp"
#include "attnlab/app/tasks.hpp"
#include "commands.hpp"

namespace attnlab::cli {

using namespace attnlab::app;

void add_make_data_command(CLI::App& cli, MakeDataCommand& m) {
  m.cmd =
      cli.add_subcommand("make-data", "write DIR/<task>/{train,valid}.txt in the data-file format");
  CLI::App& make_data = *m.cmd;
  add_task_flags(make_data, m.task);
  make_data.add_option("--out", m.out, "data root directory")->capture_default_str();
  make_data.add_option("--train-size", m.train, "training examples")
      ->check(CLI::Range(1, 10000000))
      ->capture_default_str();
  make_data.add_option("--valid-size", m.valid, "validation examples")
      ->check(CLI::Range(1, 10000000))
      ->capture_default_str();
  make_data
      .add_option("--seed", m.seed, "seed of the training examples (valid is the fixed eval set)")
      ->check(CLI::NonNegativeNumber)
      ->capture_default_str();
}

int run_make_data_command(const MakeDataCommand& m) {
  const TaskConfig c = m.task;
  task_shape(c);  // std::invalid_argument naming the field
  const std::string dir = m.out + "/" + std::string(to_string(c.kind));
  std::filesystem::create_directories(dir);
  Rng rng(m.seed);
  write_data_file(dir + "/train.txt", generate_batch(c, static_cast<std::size_t>(m.train), rng),
                  to_string(c.kind));
  write_data_file(dir + "/valid.txt", eval_batch(c, static_cast<std::size_t>(m.valid)),
                  to_string(c.kind));
  std::printf("wrote %s/train.txt (%d examples) and %s/valid.txt (%d examples)\n", dir.c_str(),
              m.train, dir.c_str(), m.valid);
  return 0;
}

}  // namespace attnlab::cli
