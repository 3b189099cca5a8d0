// attnlab saturation: attention saturation at initialisation against d_k, per mode (no training).
#include <cstdio>

#include "attnlab/app/plot.hpp"
#include "attnlab/app/saturation.hpp"
#include "commands.hpp"

namespace attnlab::cli {

using namespace attnlab::app;

void add_saturation_command(CLI::App& cli, SaturationCommand& s) {
  s.cmd = cli.add_subcommand(
      "saturation", "attention saturation at initialisation vs d_k, per mode (no training)");
  CLI::App& saturation = *s.cmd;
  saturation.add_option("--keys", s.config.keys, "keys per query Tk")
      ->check(CLI::Range(2, 4096))
      ->capture_default_str();
  saturation.add_option("--batch", s.config.batch, "sequences sampled")
      ->check(CLI::Range(1, 1024))
      ->capture_default_str();
  saturation.add_option("--d-model", s.config.d_model, "model width C")
      ->check(CLI::Range(1, 4096))
      ->capture_default_str();
  saturation.add_option("--seed", s.config.seed, "seed")
      ->check(CLI::NonNegativeNumber)
      ->capture_default_str();
  saturation.add_option("--out", s.out, "output directory")->capture_default_str();
}

int run_saturation_command(const SaturationCommand& s, const CliContext& cli) {
  const auto rows = saturation_sweep(s.config);
  std::fputs(saturation_table(rows, s.config.keys).c_str(), stdout);
  try {
    write_saturation(s.out, rows, s.config.keys);
  } catch (const PlotError& e) {
    return error_line(cli, e.what(), kExitFailure);
  }
  std::printf("\ntable: %s/saturation.md\nplot:  %s/saturation.png\n", s.out.c_str(),
              s.out.c_str());
  return 0;
}

}  // namespace attnlab::cli
