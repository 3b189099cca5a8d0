#include "common.hpp"

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <optional>
#include <variant>
#include <vector>

#include "attnlab/app/config_bounds.hpp"
#include "attnlab/app/run_config.hpp"
#include "attnlab/blas.hpp"

namespace attnlab::cli {

using app::TaskConfig;

std::string printable_line(std::string_view text) {
  // Long enough for any message of ours; a file's megabyte-long value is cut.
  constexpr std::size_t kMaxLine = 2000;
  std::string out;
  for (std::size_t i = 0; i < text.size() && out.size() < kMaxLine;) {
    const auto c = static_cast<unsigned char>(text[i]);
    // The length of a well-formed UTF-8 sequence starting here (0: not one).
    std::size_t n = c < 0x80                ? 1
                    : c >= 0xC2 && c < 0xE0 ? 2
                    : c >= 0xE0 && c < 0xF0 ? 3
                    : c >= 0xF0 && c < 0xF5 ? 4
                                            : 0;
    for (std::size_t k = 1; k < n; ++k)
      if (i + k >= text.size() || (static_cast<unsigned char>(text[i + k]) & 0xC0) != 0x80) n = 0;
    if (n == 0) {
      out += '?';  // invalid UTF-8 from a file is not sent to the terminal
      ++i;
    } else if (c == '\n' || c == '\r' || c == '\t') {
      out += ' ';
      ++i;
    } else if (c < 0x20 || c == 0x7F) {
      out += '?';
      ++i;
    } else {
      out.append(text.substr(i, n));
      i += n;
    }
  }
  if (out.size() >= kMaxLine) out += "... (" + std::to_string(text.size()) + " characters)";
  return out;
}

int error_line(const CliContext& cli, const std::string& message, int status, bool this_rank_only) {
  if (cli.rank != 0 && !this_rank_only) return status;
  const std::string one = printable_line(message);
  if (cli.world > 1 && cli.rank != 0 && !one.starts_with("rank "))  // RankFailure names it already
    std::fprintf(stderr, "attnlab: error: rank %d: %s\n", cli.rank, one.c_str());
  else
    std::fprintf(stderr, "attnlab: error: %s\n", one.c_str());
  return status;
}

void print_blas_warning(CliContext& cli) {
  const std::string& warning = blas_info().warning;
  if (cli.blas_warning_printed || warning.empty()) return;
  cli.blas_warning_printed = true;
  std::fprintf(stderr, "attnlab: warning: %s\n", warning.c_str());
}

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

namespace {

CLI::Validator bounded(const app::FieldBound& b) {
  return CLI::Validator([&b](std::string& text) { return app::check_flag_text(b, text); },
                        app::bound_expectation(b, false));
}

std::string knob_help(const app::FieldBound& b) {
  std::string help(b.help);
  if (!b.zero_means.empty()) help += " (default: " + std::string(b.zero_means) + ")";
  return help;
}

template <class T>
CLI::Option* add_knob_option(CLI::App& cmd, const app::FieldBound& b, T& field) {
  CLI::Option* opt = cmd.add_option(std::string(b.flag), field, knob_help(b));
  if (b.zero_means.empty()) opt->capture_default_str();
  return opt;
}

// An optional field (the explicit scale): unset unless given, so no default to show.
CLI::Option* add_knob_option(CLI::App& cmd, const app::FieldBound& b,
                             std::optional<double>& field) {
  return cmd.add_option_function<double>(
      std::string(b.flag), [&field](const double& v) { field = v; }, knob_help(b));
}

}  // namespace

template <class Root>
void add_knob_flags(CLI::App& cmd, Root& root) {
  for (const app::FieldBound& b : app::train_config_bounds()) {
    const auto* at = std::get_if<app::KnobField (*)(Root&)>(&b.field);
    if (at == nullptr || b.flag.empty()) continue;
    std::visit([&](auto* field) { add_knob_option(cmd, b, *field)->check(bounded(b)); },
               (*at)(root));
  }
}

template void add_knob_flags(CLI::App&, app::TaskConfig&);
template void add_knob_flags(CLI::App&, TransformerConfig&);
template void add_knob_flags(CLI::App&, app::TrainConfig&);

void add_model_flags(CLI::App& cmd, TransformerConfig& m) {
  AttentionConfig& a = m.block.attention;
  add_knob_flags(cmd, m);
  cmd.add_flag("--attn-only", m.block.attn_only, "blocks without the MLP");
  add_enum_option(cmd, "--mlp", m.block.mlp, "the MLP's activation");
  add_enum_option(cmd, "--norm", m.block.norm, "normalisation");
  add_enum_option(cmd, "--positions", m.positions, "position encoding");
  cmd.add_flag("--rope-interleaved", a.rope_interleaved,
               "RoPE on pairs (2i, 2i+1), the paper's, instead of GPT-NeoX's (i, i + rot/2)");
  cmd.add_flag_function(
      "--no-bias", [&m](std::int64_t) { m.block.bias = false; },
      "no biases (nanoGPT's bias=False): the MLP's and the LayerNorms' beta (QK-norm keeps its "
      "own)");
  cmd.add_flag("--qk-norm", a.qk_norm, "LayerNorm on q and k per head");
  cmd.add_flag("--learnable-scale", a.learnable_scale, "a learnable attention scale per head");
  cmd.add_flag("--alibi", a.alibi, "ALiBi: a linear distance penalty per head (Press et al. 2022)");
  cmd.add_flag("--causal", a.sdpa.causal, "causal attention");
  add_enum_option(cmd, "--scaling", a.sdpa.scaling, "attention scale");
  cmd.add_flag("--tie-embeddings", m.tie_embeddings,
               "the head shares the token embedding table (logits = h W_e^T; nanoGPT's "
               "wte.weight = lm_head.weight); needs one input field whose vocabulary is the "
               "output's");
}

std::string with_heads_hint(const std::string& message, const TransformerConfig& m) {
  if (message.find("divisible by heads") == std::string::npos) return message;
  return message + " (--d-model " + std::to_string(m.d_model()) + " --heads " +
         std::to_string(m.block.attention.heads) + ": give --d-k and --d-v to decouple them)";
}

void add_task_flags(CLI::App& cmd, TaskConfig& t) {
  add_enum_option(cmd, "--task", t.kind, "task");
  add_knob_flags(cmd, t);
  add_enum_option(cmd, "--vocab", t.vocab, "text: the vocabulary");
}

}  // namespace attnlab::cli
