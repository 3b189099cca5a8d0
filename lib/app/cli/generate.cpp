// attnlab generate: continue a prompt with a trained text model, printing as it goes.
#include <cstdio>

#include "attnlab/app/trainer.hpp"
#include "commands.hpp"

namespace attnlab::cli {

using namespace attnlab::app;

void add_generate_command(CLI::App& cli, GenerateCommand& g) {
  g.cmd = cli.add_subcommand(
      "generate", "continue a prompt with a trained text model (task text), printing as it goes");
  CLI::App& gen = *g.cmd;
  GenerateRequest& gr = g.request;
  gen.add_option("--checkpoint", gr.run_dir, "a run directory of task text")
      ->required()
      ->check(CLI::ExistingDirectory);
  gen.add_option("--prompt", gr.prompt, "the text to continue")->capture_default_str();
  // The default prompt, a newline: set after capture_default_str, so the help shows no default
  // rather than a line break.
  gr.prompt = "\n";
  gen.add_option("--tokens", gr.tokens, "tokens to generate")
      ->check(CLI::Range(1, 100000000))
      ->capture_default_str();
  gen.add_option("--temperature", gr.sampler.temperature, "softmax temperature")
      ->check(kFinite)
      ->check(CLI::Range(1e-6, 1e6))
      ->capture_default_str();
  gen.add_option("--top-k", gr.sampler.top_k, "sample among the k most likely (0: all)")
      ->check(CLI::Range(0, 1 << 24))
      ->capture_default_str();
  gen.add_option("--top-p", gr.sampler.top_p,
                 "sample within the smallest most-likely set of this mass (nucleus)")
      ->check(CLI::Range(1e-9, 1.0))
      ->capture_default_str();
  gen.add_option("--seed", gr.sampler.seed, "seed of the sampler")
      ->check(CLI::NonNegativeNumber)
      ->capture_default_str();
  gen.add_flag("--greedy", gr.sampler.greedy, "always the most likely token (deterministic)");
  gen.add_flag("--no-cache", g.no_cache,
               "recompute the whole context per token instead of using the KV cache");
  gen.add_option("--threads", g.context.threads, "worker threads")
      ->check(CLI::Range(1, 1024))
      ->capture_default_str();
  add_enum_option(gen, "--device", g.context.backend, "where the model runs");
}

int run_generate_command(GenerateCommand& g) {
  GenerateRequest& gr = g.request;
  gr.use_cache = !g.no_cache;
  bool started = false;  // the prompt is echoed once the checkpoint and prompt checked out
  const GenerateReport r = generate_from_run(gr, g.context, [&](const std::string& piece) {
    if (!started) std::fputs(gr.prompt.c_str(), stdout);
    started = true;
    std::fputs(piece.c_str(), stdout);
    std::fflush(stdout);
  });
  std::fputs("\n", stdout);
  std::fprintf(stderr, "generated %d tokens in %.2f s: %.0f tokens/s (%s)\n", r.tokens, r.seconds,
               r.seconds > 0 ? r.tokens / r.seconds : 0.0,
               gr.use_cache ? "KV cache" : "no cache: the whole context per token");
  return 0;
}

}  // namespace attnlab::cli
