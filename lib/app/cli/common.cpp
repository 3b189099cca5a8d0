#include "common.hpp"

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <vector>

#include "attnlab/app/config_bounds.hpp"
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

CLI::Validator bounded(std::string_view key) {
  const app::FieldBound& b = app::field_bound(key);
  return CLI::Validator([&b](std::string& text) { return app::check_flag_text(b, text); },
                        app::bound_expectation(b, false));
}

void add_model_flags(CLI::App& cmd, TransformerConfig& m) {
  AttentionConfig& a = m.block.attention;
  cmd.add_option("--d-model", a.d_model, "model width C")
      ->check(bounded("model.block.attention.d_model"))
      ->capture_default_str();
  cmd.add_option("--heads", a.heads, "attention heads H")
      ->check(bounded("model.block.attention.heads"))
      ->capture_default_str();
  cmd.add_option("--kv-heads", a.kv_heads,
                 "key/value heads, dividing --heads (grouped-query attention; 1: multi-query; "
                 "default: --heads)")
      ->check(bounded("model.block.attention.kv_heads"));
  cmd.add_option("--d-k", a.d_k, "head dim of q and k (default d_model / heads)")
      ->check(bounded("model.block.attention.d_k"));
  cmd.add_option("--d-v", a.d_v, "head dim of v (default d_model / heads)")
      ->check(bounded("model.block.attention.d_v"));
  cmd.add_option("--layers", m.layers, "transformer blocks")
      ->check(bounded("model.layers"))
      ->capture_default_str();
  cmd.add_flag("--attn-only", m.block.attn_only, "blocks without the MLP");
  cmd.add_option("--d-ff", m.block.d_ff, "MLP width F (default 4 * d_model; swiglu: 8/3 * d_model)")
      ->check(bounded("model.block.d_ff"));
  add_enum_option(cmd, "--mlp", m.block.mlp, "the MLP's activation");
  add_enum_option(cmd, "--norm", m.block.norm, "normalisation");
  add_enum_option(cmd, "--positions", m.positions, "position encoding");
  cmd.add_option("--rope-theta", a.rope_theta, "RoPE's base theta (with --positions rope)")
      ->check(bounded("model.block.attention.rope_theta"))
      ->capture_default_str();
  cmd.add_option("--rope-fraction", a.rope_fraction,
                 "the fraction of the head dim RoPE rotates, in (0, 1] (partial RoPE)")
      ->check(bounded("model.block.attention.rope_fraction"))
      ->capture_default_str();
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
  cmd.add_option("--window", a.sdpa.window,
                 "sliding-window attention: each query sees its N latest keys (needs --causal)")
      ->check(bounded("model.block.attention.sdpa.window"));
  cmd.add_option("--attn-dropout", a.dropout,
                 "dropout on the attention weights in training (0 <= p < 1; none in eval)")
      ->check(bounded("model.block.attention.dropout"));
  cmd.add_option("--dropout", m.block.dropout,
                 "dropout on the residual branches in training (0 <= p < 1; none in eval)")
      ->check(bounded("model.block.dropout"));
  add_enum_option(cmd, "--scaling", a.sdpa.scaling, "attention scale");
  cmd.add_option_function<double>(
         "--scale", [&a](const double& v) { a.sdpa.scale = v; },
         "explicit attention scale (overrides --scaling)")
      ->check(bounded("model.block.attention.sdpa.scale"));
  cmd.add_option("--attn-softcap", a.sdpa.softcap,
                 "cap the attention scores smoothly: c * tanh(s * q.k / c), before ALiBi and the "
                 "mask (Gemma 2: 50)")
      ->check(bounded("model.block.attention.sdpa.softcap"));
  cmd.add_option("--logit-softcap", m.logit_softcap,
                 "cap the output logits smoothly: c * tanh(logits / c) (nanochat: 15; > 0)")
      ->check(bounded("model.logit_softcap"));
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
  cmd.add_option("--keys", t.keys, "recall/mqar: key symbols")
      ->check(bounded("task.keys"))
      ->capture_default_str();
  cmd.add_option("--values", t.values, "recall/mqar: value symbols")
      ->check(bounded("task.values"))
      ->capture_default_str();
  cmd.add_option("--pairs", t.pairs, "recall/mqar: key-value pairs per example")
      ->check(bounded("task.pairs"))
      ->capture_default_str();
  cmd.add_option("--queries", t.queries, "mqar: queries per example")
      ->check(bounded("task.queries"))
      ->capture_default_str();
  cmd.add_option("--symbols", t.symbols, "reverse/sort: alphabet size")
      ->check(bounded("task.symbols"))
      ->capture_default_str();
  cmd.add_option("--length", t.length, "reverse/sort: sequence length")
      ->check(bounded("task.length"))
      ->capture_default_str();
  cmd.add_option("--block", t.block, "text: tokens per example (the context length)")
      ->check(bounded("task.block"))
      ->capture_default_str();
  add_enum_option(cmd, "--vocab", t.vocab, "text: the vocabulary");
}

}  // namespace attnlab::cli
