#include "attnlab/app/config_bounds.hpp"

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <limits>
#include <stdexcept>

#include <nlohmann/json.hpp>

#include "attnlab/io/config_json.hpp"

namespace attnlab::app {

namespace {

constexpr long double kMaxSeed = 18446744073709551615.0L;  // 2^64 - 1, exact in long double
// Any finite double: the fields whose flags had no upper bound.
constexpr long double kMaxReal = std::numeric_limits<double>::max();

}  // namespace

const std::vector<FieldBound>& train_config_bounds() {
  // The flags' ranges as they were when each was added; a file gives the same fields the same
  // ranges. Widening one here widens both.
  static const std::vector<FieldBound> bounds = {
      {"task.keys", "--keys", true, 1, 100000},
      {"task.values", "--values", true, 1, 100000},
      {"task.pairs", "--pairs", true, 1, 100000},
      {"task.queries", "--queries", true, 1, 100000},
      {"task.symbols", "--symbols", true, 2, 100000},
      {"task.length", "--length", true, 1, 100000},
      {"task.block", "--block", true, 1, 1 << 20},
      {"model.max_len", "", true, 0, 1 << 20},
      {"model.layers", "--layers", true, 1, 64},
      {"model.out_vocab", "", true, 0, 1 << 24},
      {"model.logit_softcap", "--logit-softcap", false, 0, kMaxReal, true, "no cap"},
      {"model.block.d_ff", "--d-ff", true, 1, 65536, false, "4 * d_model; swiglu: 8/3 * d_model"},
      {"model.block.dropout", "--dropout", false, 0, 0.999999},
      {"model.block.attention.d_model", "--d-model", true, 1, 4096},
      {"model.block.attention.heads", "--heads", true, 1, 256},
      {"model.block.attention.kv_heads", "--kv-heads", true, 1, 256, false, "as many as heads"},
      {"model.block.attention.d_k", "--d-k", true, 1, 8192, false, "d_model / heads"},
      {"model.block.attention.d_v", "--d-v", true, 1, 8192, false, "d_model / heads"},
      {"model.block.attention.d_context", "", true, 0, 8192},
      {"model.block.attention.dropout", "--attn-dropout", false, 0, 0.999999},
      {"model.block.attention.rope_theta", "--rope-theta", false, 0, kMaxReal, true},
      {"model.block.attention.rope_fraction", "--rope-fraction", false, 0, 1, true},
      {"model.block.attention.sdpa.window", "--window", true, 1, 1 << 20, false, "no window"},
      {"model.block.attention.sdpa.scale", "--scale", false, 0, kMaxReal, true},
      {"model.block.attention.sdpa.softcap", "--attn-softcap", false, 0, kMaxReal, true, "no cap"},
      {"lr", "--lr", false, 1e-12, 1e3},
      {"beta1", "", false, 0, 0.999999},
      {"beta2", "--beta2", false, 0, 0.999999},
      {"momentum", "", false, 0, 0.999999},
      {"muon_lr", "--muon-lr", false, 1e-12, 1e3},
      {"muon_momentum", "--muon-momentum", false, 0, 0.999999},
      {"muon_ns_steps", "--muon-ns-steps", true, 1, 100},
      {"weight_decay", "--weight-decay", false, 0, 1e3},
      {"clip", "--clip", false, 0, 1e12},
      {"z_loss", "--z-loss", false, 0, 1},
      {"skip_outliers", "--skip-outliers", false, 0, kMaxReal, true, "off"},
      {"min_lr", "--min-lr", false, 0, 1e3},
      {"warmdown", "--warmdown", false, 0, 1},
      {"warmup", "--warmup", true, 0, 100000000},
      {"steps", "--steps", true, 1, 100000000},
      {"batch", "--batch", true, 1, 1000000},
      {"grad_accum", "--grad-accum", true, 1, 4096},
      {"seed", "--seed", true, 0, kMaxSeed},
      {"eval_every", "--eval-every", true, 1, 100000000},
      {"eval_size", "--eval-size", true, 1, 1000000},
      {"eval_batch", "--eval-batch", true, 0, 1000000},
      {"save_every", "--save-every", true, 0, 100000000},
  };
  return bounds;
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
