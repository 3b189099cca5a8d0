#include "attnlab/app/config_bounds.hpp"

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <limits>
#include <stdexcept>
#include <type_traits>
#include <utility>

#include <nlohmann/json.hpp>

#include "attnlab/app/run_config.hpp"
#include "attnlab/io/config_json.hpp"

namespace attnlab::app {

namespace {

constexpr long double kMaxSeed = 18446744073709551615.0L;  // 2^64 - 1, exact in long double
// Any finite double: the fields whose flags had no upper bound.
constexpr long double kMaxReal = std::numeric_limits<double>::max();

}  // namespace

// A row's key, its field and whether that is an integer, from the field's path in its part of
// the config: ATTNLAB_KNOB_MODEL(block.d_ff) is "model.block.d_ff", &m.block.d_ff, true.
#define ATTNLAB_KNOB_AT(Root, prefix, path)                               \
  prefix #path, KnobAccess([](Root& r) -> KnobField { return &r.path; }), \
      std::is_integral_v<std::remove_cvref_t<decltype(std::declval<Root&>().path)>>
#define ATTNLAB_KNOB_TASK(path) ATTNLAB_KNOB_AT(TaskConfig, "task.", path)
#define ATTNLAB_KNOB_MODEL(path) ATTNLAB_KNOB_AT(TransformerConfig, "model.", path)
#define ATTNLAB_KNOB(path) ATTNLAB_KNOB_AT(TrainConfig, "", path)

const std::vector<FieldBound>& train_config_bounds() {
  // The flags' ranges as they were when each was added; a file gives the same fields the same
  // ranges. Widening one here widens both.
  static const std::vector<FieldBound> bounds = {
      {ATTNLAB_KNOB_TASK(keys), "--keys", "recall/mqar: key symbols", 1, 100000},
      {ATTNLAB_KNOB_TASK(values), "--values", "recall/mqar: value symbols", 1, 100000},
      {ATTNLAB_KNOB_TASK(pairs), "--pairs", "recall/mqar: key-value pairs per example", 1, 100000},
      {ATTNLAB_KNOB_TASK(queries), "--queries", "mqar: queries per example", 1, 100000},
      {ATTNLAB_KNOB_TASK(symbols), "--symbols", "reverse/sort: alphabet size", 2, 100000},
      {ATTNLAB_KNOB_TASK(length), "--length", "reverse/sort: sequence length", 1, 100000},
      {ATTNLAB_KNOB_TASK(block), "--block", "text: tokens per example (the context length)", 1,
       1 << 20},
      {ATTNLAB_KNOB_MODEL(block.attention.d_model), "--d-model", "model width C", 1, 4096},
      {ATTNLAB_KNOB_MODEL(block.attention.heads), "--heads", "attention heads H", 1, 256},
      {ATTNLAB_KNOB_MODEL(block.attention.kv_heads), "--kv-heads",
       "key/value heads, dividing --heads (grouped-query attention; 1: multi-query)", 1, 256, false,
       "as many as heads"},
      {ATTNLAB_KNOB_MODEL(block.attention.d_k), "--d-k", "head dim of q and k", 1, 8192, false,
       "d_model / heads"},
      {ATTNLAB_KNOB_MODEL(block.attention.d_v), "--d-v", "head dim of v", 1, 8192, false,
       "d_model / heads"},
      {ATTNLAB_KNOB_MODEL(block.attention.d_context), "", "", 0, 8192},
      {ATTNLAB_KNOB_MODEL(layers), "--layers", "transformer blocks", 1, 64},
      {ATTNLAB_KNOB_MODEL(max_len), "", "", 0, 1 << 20},
      {ATTNLAB_KNOB_MODEL(out_vocab), "", "", 0, 1 << 24},
      {ATTNLAB_KNOB_MODEL(block.d_ff), "--d-ff", "MLP width F", 1, 65536, false,
       "4 * d_model; swiglu: 8/3 * d_model"},
      {ATTNLAB_KNOB_MODEL(block.attention.rope_theta), "--rope-theta",
       "RoPE's base theta (with --positions rope)", 0, kMaxReal, true},
      {ATTNLAB_KNOB_MODEL(block.attention.rope_fraction), "--rope-fraction",
       "the fraction of the head dim RoPE rotates, in (0, 1] (partial RoPE)", 0, 1, true},
      {ATTNLAB_KNOB_MODEL(block.attention.sdpa.window), "--window",
       "sliding-window attention: each query sees its N latest keys (needs --causal)", 1, 1 << 20,
       false, "no window"},
      {ATTNLAB_KNOB_MODEL(block.attention.dropout), "--attn-dropout",
       "dropout on the attention weights in training (none in eval)", 0, 0.999999},
      {ATTNLAB_KNOB_MODEL(block.dropout), "--dropout",
       "dropout on the residual branches in training (none in eval)", 0, 0.999999},
      {ATTNLAB_KNOB_MODEL(block.attention.sdpa.scale), "--scale",
       "explicit attention scale (overrides --scaling)", 0, kMaxReal, true},
      {ATTNLAB_KNOB_MODEL(block.attention.sdpa.softcap), "--attn-softcap",
       "cap the attention scores smoothly: c * tanh(s * q.k / c), before ALiBi and the mask "
       "(Gemma 2: 50)",
       0, kMaxReal, true, "no cap"},
      {ATTNLAB_KNOB_MODEL(logit_softcap), "--logit-softcap",
       "cap the output logits smoothly: c * tanh(logits / c) (nanochat: 15)", 0, kMaxReal, true,
       "no cap"},
      {ATTNLAB_KNOB(lr), "--lr", "peak learning rate", 1e-12, 1e3},
      {ATTNLAB_KNOB(beta1), "", "", 0, 0.999999},
      {ATTNLAB_KNOB(beta2), "--beta2", "AdamW: the second moment's decay", 0, 0.999999},
      {ATTNLAB_KNOB(momentum), "", "", 0, 0.999999},
      {ATTNLAB_KNOB(muon_lr), "--muon-lr", "Muon: the hidden matrices' peak learning rate", 1e-12,
       1e3},
      {ATTNLAB_KNOB(muon_momentum), "--muon-momentum", "Muon: the momentum (muon.py's 0.95)", 0,
       0.999999},
      {ATTNLAB_KNOB(muon_ns_steps), "--muon-ns-steps", "Muon: Newton-Schulz steps", 1, 100},
      {ATTNLAB_KNOB(min_lr), "--min-lr", "cosine and wsd: the LR at the end of the decay", 0, 1e3},
      {ATTNLAB_KNOB(warmdown), "--warmdown",
       "wsd: the fraction of the steps, at the end, whose LR decays linearly to --min-lr "
       "(nanochat's warmdown ratio)",
       0, 1},
      {ATTNLAB_KNOB(warmup), "--warmup", "warmup steps", 0, 100000000},
      {ATTNLAB_KNOB(steps), "--steps", "training steps", 1, 100000000},
      {ATTNLAB_KNOB(batch), "--batch", "examples per micro-batch (per step without --grad-accum)",
       1, 1000000},
      {ATTNLAB_KNOB(grad_accum), "--grad-accum",
       "gradient accumulation: N micro-batches of --batch per step, with the gradient of the N * "
       "batch rows' mean loss",
       1, 4096},
      {ATTNLAB_KNOB(clip), "--clip", "clip the global grad norm to this (0: off)", 0, 1e12},
      {ATTNLAB_KNOB(skip_outliers), "--skip-outliers",
       "skip the update of a step whose loss or gradient norm has a z-score over the last 128 "
       "steps above this (llm.c's -sl/-sg; 5 is usual, above sqrt(127) none fires); metrics.csv's "
       "skipped column",
       0, kMaxReal, true, "off"},
      {ATTNLAB_KNOB(z_loss), "--z-loss",
       "PaLM's z-loss: add z * logsumexp(logits)^2 per position (1e-4 is usual; 0: off); "
       "metrics.csv's z_loss column",
       0, 1},
      {ATTNLAB_KNOB(weight_decay), "--weight-decay", "decoupled weight decay (AdamW) or L2 (SGD)",
       0, 1e3},
      {ATTNLAB_KNOB(seed), "--seed", "seed of the initial weights and the data stream", 0,
       kMaxSeed},
      {ATTNLAB_KNOB(eval_every), "--eval-every", "evaluate and log every N steps", 1, 100000000},
      {ATTNLAB_KNOB(eval_size), "--eval-size", "examples in the fixed eval set", 1, 1000000},
      {ATTNLAB_KNOB(eval_batch), "--eval-batch",
       "rows per eval forward (0: --batch); eval memory follows it, not --eval-size", 0, 1000000},
      {ATTNLAB_KNOB(save_every), "--save-every", "checkpoint every N steps (0: at the end only)", 0,
       100000000},
  };
  return bounds;
}

#undef ATTNLAB_KNOB
#undef ATTNLAB_KNOB_MODEL
#undef ATTNLAB_KNOB_TASK
#undef ATTNLAB_KNOB_AT

KnobField knob_field(const FieldBound& b, TrainConfig& config) {
  return std::visit(
      [&config](auto at) -> KnobField {
        using At = decltype(at);
        if constexpr (std::is_same_v<At, KnobField (*)(TaskConfig&)>)
          return at(config.task);
        else if constexpr (std::is_same_v<At, KnobField (*)(TransformerConfig&)>)
          return at(config.model);
        else
          return at(config);
      },
      b.field);
}

const FieldBound& field_bound(std::string_view key) {
  for (const FieldBound& b : train_config_bounds())
    if (b.key == key) return b;
  throw std::logic_error("field_bound: no bound for '" + std::string(key) + "'");
}

namespace {

std::string number_text(long double v, bool integer) {
  char buf[64];
  if (integer)
    std::snprintf(buf, sizeof buf, "%.0Lf", v);
  else
    std::snprintf(buf, sizeof buf, "%.7Lg", v);
  return buf;
}

}  // namespace

std::string bound_expectation(const FieldBound& b, bool from_file) {
  std::string s = std::string(b.integer ? "an integer in " : "a number in ") +
                  (b.lo_open ? "(" : "[") + number_text(b.lo, b.integer) + ", " +
                  number_text(b.hi, b.integer) + "]";
  if (from_file && !b.zero_means.empty()) s += " or 0 (" + std::string(b.zero_means) + ")";
  return s;
}

std::string bound_problem(const FieldBound& b, long double value, std::string_view as_written,
                          bool from_file) {
  const bool integral = value == std::floor(value);
  const bool above_lo = b.lo_open ? value > b.lo : value >= b.lo;
  bool ok = std::isfinite(value) && (!b.integer || integral) && above_lo && value <= b.hi;
  if (from_file && !b.zero_means.empty() && value == 0) ok = true;
  if (ok) return {};
  return "expected " + bound_expectation(b, from_file) + ", got " + std::string(as_written);
}

std::string check_flag_text(const FieldBound& b, const std::string& text) {
  long double v = NAN;
  try {
    std::size_t used = 0;
    v = std::stold(text, &used);
    if (used != text.size()) v = NAN;
  } catch (const std::exception&) {  // not a number, or out of long double's range
  }
  return bound_problem(b, v, text, false);
}

void check_train_config_bounds(const nlohmann::json& j) {
  for (const FieldBound& b : train_config_bounds()) {
    const nlohmann::json* at = &j;
    std::string_view rest = b.key;
    while (at && !rest.empty()) {
      const std::size_t dot = rest.find('.');
      const std::string name(rest.substr(0, dot));
      rest = dot == std::string_view::npos ? std::string_view() : rest.substr(dot + 1);
      const auto it = at->is_object() ? at->find(name) : at->end();
      at = at->is_object() && it != at->end() ? &*it : nullptr;
    }
    if (!at || !at->is_number()) continue;  // absent, null (scale), or the conversion's to refuse
    long double v = 0;
    if (at->is_number_unsigned())
      v = static_cast<long double>(at->get<std::uint64_t>());
    else if (at->is_number_integer())
      v = static_cast<long double>(at->get<std::int64_t>());
    else
      v = at->get<double>();
    const std::string problem = bound_problem(b, v, config_json::shown(*at), true);
    if (!problem.empty()) throw ConfigError(std::string(b.key), problem);
  }
}

}  // namespace attnlab::app
