#include "attnlab/app/run_config.hpp"

#include <cmath>
#include <fstream>
#include <sstream>

#include <nlohmann/json.hpp>

#include "attnlab/app/run_checkpoint.hpp"
#include "attnlab/app/text.hpp"
#include "attnlab/io/config_json.hpp"
#include "attnlab/io/safetensors.hpp"

namespace attnlab::app {

using json = nlohmann::json;

void to_json(json& j, TaskKind v) {
  j = std::string(to_string(v));
}
void from_json(const json& j, TaskKind& v) {
  v = parse_task(j.get<std::string>());
}

ATTNLAB_JSON_FIELDS(TaskConfig, kind, keys, values, pairs, queries, symbols, length, block, vocab,
                    chars)
ATTNLAB_JSON_FIELDS(TrainConfig, task, data_file, valid_file, model, optimizer, lr, beta1, beta2,
                    momentum, weight_decay, clip, schedule, min_lr, warmup, steps, batch, seed,
                    eval_every, eval_size, out, save_every, weights_only)

TransformerConfig default_model() {
  TransformerConfig m;
  m.max_len = 0;  // decided by the task
  m.layers = 1;
  m.block.attention.d_model = 64;
  m.block.attention.heads = 1;
  m.block.attn_only = true;
  m.block.d_ff = 0;  // 4 · d_model
  return m;
}

TransformerConfig resolve_model(const TransformerConfig& model, const TaskShape& shape) {
  TransformerConfig m = model;
  const char* op = "TransformerConfig";
  std::vector<std::size_t> vocab(shape.field_vocab.begin(), shape.field_vocab.end());
  const auto list = [](const std::vector<std::size_t>& v) {
    std::string s = "[";
    for (std::size_t i = 0; i < v.size(); ++i) s += (i ? ", " : "") + std::to_string(v[i]);
    return s + "]";
  };
  const auto agree = [&](std::size_t& field, int task_value, const char* name) {
    const auto want = static_cast<std::size_t>(task_value);
    check_arg(field == 0 || field == want, op, name,
              std::to_string(want) + " (decided by the task) or 0", std::to_string(field));
    field = want;
  };
  check_arg(m.vocab_sizes.empty() || m.vocab_sizes == vocab, op, "vocab_sizes",
            list(vocab) + " (decided by the task) or []", list(m.vocab_sizes));
  m.vocab_sizes = vocab;
  agree(m.max_len, shape.seq_len, "max_len");
  agree(m.out_vocab, shape.output_vocab, "out_vocab");
  if (m.block.d_ff == 0) m.block.d_ff = 4 * m.d_model();
  m.validate();
  return m;
}

void prepare_task(TrainConfig& c) {
  if (c.task.kind != TaskKind::text || c.task.vocab != "char" || !c.task.chars.empty()) return;
  if (c.data_file.empty()) return;  // validate() names the missing --data
  c.task.chars = char_vocabulary(read_text_file(c.data_file), c.data_file);
}

void validate(const TrainConfig& c) {
  const char* op = "train";
  if (c.task.kind == TaskKind::text) {
    // A language model predicts each token from the ones before it; without causal attention
    // position i would see its own target.
    check_arg(!c.data_file.empty(), op, "data_file", "a text file for task text (--data FILE)",
              "none");
    check_arg(c.model.block.attention.sdpa.causal, op, "model.block.attention.sdpa.causal",
              "true for task text (give --causal)", "false");
  }
  resolve_model(c.model, task_shape(c.task));
  check_arg(c.optimizer == "adamw" || c.optimizer == "sgd", op, "optimizer", "adamw|sgd",
            c.optimizer);
  check_arg(c.schedule == "constant" || c.schedule == "cosine", op, "schedule", "constant|cosine",
            c.schedule);
  check_arg(std::isfinite(c.lr) && c.lr > 0, op, "lr", "finite and > 0", std::to_string(c.lr));
  check_arg(c.steps >= 1, op, "steps", ">= 1", std::to_string(c.steps));
  check_arg(c.batch >= 1, op, "batch", ">= 1", std::to_string(c.batch));
  check_arg(c.warmup >= 0 && c.warmup <= c.steps, op, "warmup", "in [0, steps]",
            std::to_string(c.warmup));
  check_arg(c.eval_every >= 1, op, "eval_every", ">= 1", std::to_string(c.eval_every));
  check_arg(c.eval_size >= 1, op, "eval_size", ">= 1", std::to_string(c.eval_size));
  check_arg(c.save_every >= 0, op, "save_every", ">= 0", std::to_string(c.save_every));
  check_arg(std::isfinite(c.clip) && c.clip >= 0, op, "clip", "finite and >= 0",
            std::to_string(c.clip));
  check_arg(std::isfinite(c.weight_decay) && c.weight_decay >= 0, op, "weight_decay",
            "finite and >= 0", std::to_string(c.weight_decay));
  // The target at position i of reverse (x_{L-1-i}) and of sort (the i-th smallest of all) needs
  // later tokens, which causal attention hides: such a run could never learn.
  const bool needs_future = c.task.kind == TaskKind::reverse || c.task.kind == TaskKind::sort;
  if (needs_future && c.model.block.attention.sdpa.causal)
    throw std::invalid_argument("train: task " + std::string(to_string(c.task.kind)) +
                                " cannot be learned with --causal (model.block.attention.sdpa."
                                "causal): its target at position i depends on later tokens");
  check_arg(std::isfinite(c.min_lr) && c.min_lr >= 0 && c.min_lr <= c.lr, op, "min_lr",
            "in [0, lr]", std::to_string(c.min_lr));
}

namespace {

// Checkpoints written before the nested config hold a flat "model" (d_model, heads, ... side by
// side, positions a bool, d_ff possibly absent) and the task kind under "task". Rewritten into
// today's layout; everything else kept.
json from_flat_layout(json j) {
  const json flat = j.at("model");
  json attention = {{"d_model", flat.at("d_model")},
                    {"heads", flat.at("heads")},
                    {"d_k", flat.at("d_k")},
                    {"d_v", flat.at("d_v")},
                    {"qk_norm", flat.at("qk_norm")},
                    {"learnable_scale", flat.at("learnable_scale")},
                    {"sdpa",
                     {{"scaling", flat.at("scaling")},
                      {"scale", flat.at("scale")},
                      {"causal", flat.at("causal")}}}};
  json block = {{"attention", attention},
                {"attn_only", flat.at("attn_only")},
                {"norm", flat.at("norm")},
                {"d_ff", flat.value("d_ff", 0)}};
  j["model"] = {{"layers", flat.at("layers")},
                {"positions", flat.at("positions").get<bool>() ? "learned" : "none"},
                {"block", block}};
  json& task = j.at("task");
  if (task.contains("task")) {
    task["kind"] = task.at("task");
    task.erase("task");
  }
  return j;
}

}  // namespace

std::string to_json_text(const TrainConfig& config) {
  return json(config).dump(2);
}

void read_json_text(const std::string& text, TrainConfig& config) {
  json j;
  try {
    j = json::parse(text);
  } catch (const json::exception& e) {
    throw std::invalid_argument(std::string("config: not valid JSON: ") + e.what());
  }
  if (j.is_object() && j.contains("model") && j.at("model").is_object() &&
      j.at("model").contains("d_model")) {
    try {
      j = from_flat_layout(std::move(j));
    } catch (const json::exception& e) {
      throw std::invalid_argument(std::string("config (flat layout): ") + e.what());
    }
  }
  j.get_to(config);
}

void read_config_file(const std::string& path, TrainConfig& config) {
  std::ifstream in(path);
  if (!in) throw std::invalid_argument(path + ": cannot open the config file");
  std::stringstream ss;
  ss << in.rdbuf();
  try {
    read_json_text(ss.str(), config);
  } catch (const std::invalid_argument& e) {
    throw std::invalid_argument(path + ": " + e.what());
  }
}

void write_config_file(const std::string& path, const TrainConfig& config) {
  const std::string text = to_json_text(config) + "\n";
  write_file_atomic(path, std::as_bytes(std::span(text.data(), text.size())));
}

void read_run_config(const std::string& run_dir, TrainConfig& config) {
  const std::string path = run_dir + "/model.safetensors";
  const std::string text = read_run_meta(path).config_json;
  try {
    read_json_text(text, config);
  } catch (const std::invalid_argument& e) {
    throw std::invalid_argument(path + ": model_config: " + e.what());
  }
}

}  // namespace attnlab::app
