// attnlab gradcheck: a central-difference gradient check of one layer, in double precision.
#include <cstdio>

#include "attnlab/app/layer_check.hpp"
#include "attnlab/threads.hpp"
#include "commands.hpp"

namespace attnlab::cli {

using namespace attnlab::app;

void add_gradcheck_command(CLI::App& cli, GradcheckCommand& g) {
  g.cmd = cli.add_subcommand("gradcheck",
                             "central-difference gradient check of one layer (double precision)");
  CLI::App& gradcheck = *g.cmd;
  add_enum_option(gradcheck, "--layer", g.layer, "layer to check");
  // A small model by default: the check perturbs every weight one at a time.
  g.model.block.attention.d_model = 8;
  g.model.block.attention.heads = 2;
  g.model.block.attn_only = false;
  add_model_flags(gradcheck, g.model);
  gradcheck.add_option("--batch", g.batch, "batch size B")
      ->check(CLI::Range(1, 64))
      ->capture_default_str();
  gradcheck.add_option("--seq", g.seq, "sequence length T")
      ->check(CLI::Range(1, 256))
      ->capture_default_str();
  gradcheck.add_option("--seed", g.seed, "seed")
      ->check(CLI::NonNegativeNumber)
      ->capture_default_str();
}

int run_gradcheck_command(const GradcheckCommand& g) {
  set_num_threads(1);  // tiny double-precision layers: threads only add overhead
  GradcheckReport report;
  try {
    report = check_layer(g.layer, g.model, g.batch, g.seq, g.seed);
  } catch (const std::invalid_argument& e) {
    throw BadInput(with_heads_hint(e.what(), g.model));
  }
  std::fputs(report.table().c_str(), stdout);
  const bool ok = layer_check_passed(report);
  std::printf(
      "%s: max relative error %.3g (tolerance %.0e; a tensor whose gradient norms are both "
      "under %.0e counts as a zero gradient)\n",
      ok ? "PASS" : "FAIL", report.max_rel_error(), kLayerGradTolerance, kZeroGradientNorm);
  return ok ? 0 : kExitFailure;
}

}  // namespace attnlab::cli
