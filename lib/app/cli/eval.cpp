// attnlab eval: loss, accuracy and example predictions of a saved run.
#include <cstdio>

#include "attnlab/app/trainer.hpp"
#include "commands.hpp"

namespace attnlab::cli {

void add_eval_command(CLI::App& cli, EvalCommand& e) {
  e.cmd = cli.add_subcommand("eval", "loss, accuracy and example predictions of a trained run");
  CLI::App& eval = *e.cmd;
  eval.add_option("--checkpoint", e.dir, "a run directory (holding model.safetensors)")
      ->required()
      ->check(CLI::ExistingDirectory);
  eval.add_option("--valid", e.valid, "evaluate on this data file instead of the task's eval set")
      ->check(CLI::ExistingFile);
  eval.add_option("--logits", e.logits,
                  "also write the eval set's logits (N, T, V) to this safetensors file");
  eval.add_option("--show", e.show, "examples to print")
      ->check(CLI::Range(0, 1000))
      ->capture_default_str();
}

int run_eval_command(const EvalCommand& e) {
  const app::EvalReport r = app::evaluate_run(e.dir, e.show, e.valid, e.logits);
  std::fputs(r.text.c_str(), stdout);
  return 0;
}

}  // namespace attnlab::cli
