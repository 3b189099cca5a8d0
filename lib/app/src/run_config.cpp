#include "attnlab/app/run_config.hpp"

#include <sys/resource.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <sstream>

#include <nlohmann/json.hpp>

#include "attnlab/app/config_bounds.hpp"
#include "attnlab/app/param_groups.hpp"
#include "attnlab/app/run_checkpoint.hpp"
#include "attnlab/app/text.hpp"
#include "attnlab/io/config_json.hpp"
#include "attnlab/io/safetensors.hpp"
#include "config_file.hpp"

namespace attnlab::app {

using json = nlohmann::json;

namespace {

// The enum field `key` of a TrainConfig's JSON: a name of E, or refused before any field is read
// in the words validate() used while these fields were strings ("train: <key> expected a|b|c, got
// <text>"). Another JSON type is left to the conversion.
template <TableEnum E>
void check_name(const json& j, const char* key, NameList list = NameList::pipes,
                bool quoted = false) {
  const auto it = j.find(key);
  if (it == j.end() || !it->is_string()) return;
  try {
    parse_enum<E>(it->get<std::string>(), {"train", key, list, quoted});
  } catch (const std::invalid_argument& e) {
    throw ConfigError(key, e.what());
  }
}

// The check of a TrainConfig's JSON object: the bounds of its numbers and the names of its enums.
void check_train_config(const json& j) {
  check_train_config_bounds(j);
  check_name<OptimizerKind>(j, "optimizer");
  check_name<MuonScale>(j, "muon_scale");
  check_name<DecayParams>(j, "decay_params");
  check_name<WeightDecayMode>(j, "decay");
  check_name<LrScheduleKind>(j, "schedule");
  check_name<GemmPrecision>(j, "precision", NameList::or_words, true);
}

}  // namespace

// TaskConfig's JSON is ATTNLAB_JSON_FIELDS written out, for one difference: tokenizer_hash is
// written only when a BPE run has one, so that every other config keeps exactly its keys.
void to_json(json& nlohmann_json_j, const TaskConfig& nlohmann_json_t) {
  NLOHMANN_JSON_EXPAND(NLOHMANN_JSON_PASTE(NLOHMANN_JSON_TO, kind, keys, values, pairs, queries,
                                           symbols, length, block, vocab, chars))
  if (!nlohmann_json_t.tokenizer_hash.empty())
    nlohmann_json_j["tokenizer_hash"] = nlohmann_json_t.tokenizer_hash;
}
void from_json(const json& nlohmann_json_j, TaskConfig& nlohmann_json_t) {
  config_json::check_keys(nlohmann_json_j, "TaskConfig",
                          {"kind", "keys", "values", "pairs", "queries", "symbols", "length",
                           "block", "vocab", "chars", "tokenizer_hash"});
  NLOHMANN_JSON_EXPAND(NLOHMANN_JSON_PASTE(ATTNLAB_JSON_READ_FIELD, kind, keys, values, pairs,
                                           queries, symbols, length, block, vocab, chars,
                                           tokenizer_hash))
}
ATTNLAB_JSON_FIELDS_CHECKED(TrainConfig, check_train_config, task, data_file, valid_file,
                            pack_documents, pack_rope_restart, model, optimizer, lr, beta1, beta2,
                            momentum, muon_lr, muon_momentum, muon_nesterov, muon_ns_steps,
                            muon_scale, weight_decay, decay_params, decay, param_groups, clip,
                            z_loss, skip_outliers, schedule, min_lr, warmdown, warmup, steps, batch,
                            grad_accum, precision, seed, eval_every, eval_size, eval_batch, out,
                            save_every, weights_only)

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
  if (m.block.d_ff == 0) m.block.d_ff = default_mlp_width(m.d_model(), m.block.mlp);
  m.validate();
  return m;
}

void prepare_task(TrainConfig& c) {
  if (c.task.kind != TaskKind::text || c.task.vocab != VocabKind::chars || !c.task.chars.empty())
    return;
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
  if (!c.pack_documents.empty()) {
    check_arg(c.task.kind == TaskKind::text, op, "pack_documents (--pack-documents)",
              "task text (packing cuts a text into documents)",
              "task " + std::string(enum_name(c.task.kind)));
    check_arg(c.model.block.attention.sdpa.window == 0, op, "pack_documents (--pack-documents)",
              "no window beside it (the document mask replaces the causal rule)",
              "window " + std::to_string(c.model.block.attention.sdpa.window));
    check_arg(c.task.vocab != VocabKind::bpe || c.pack_documents == kDefaultDocumentDelimiter, op,
              "pack_documents (--pack-documents)",
              "the default delimiter for a BPE token directory (its documents were cut by "
              "tokenize encode --doc-delimiter and are read from tokens.json)",
              "a delimiter of " + std::to_string(c.pack_documents.size()) + " bytes");
  }
  if (c.pack_rope_restart) {
    check_arg(!c.pack_documents.empty(), op, "pack_rope_restart (--pack-rope-restart)",
              "pack_documents (--pack-documents) beside it", "no packing");
    check_arg(c.model.positions == PositionEncoding::rope, op,
              "pack_rope_restart (--pack-rope-restart)",
              "positions rope (--positions rope): the restart is RoPE's",
              "positions " + std::string(enum_name(c.model.positions)));
  }
  resolve_model(c.model, task_shape(c.task));
  // SGD's weight decay is torch.optim.SGD's coupled L2 (g + wd · p): it has no decoupled update to
  // make independent of the LR.
  check_arg(c.optimizer != OptimizerKind::sgd || c.decay == WeightDecayMode::decoupled, op, "decay",
            std::string(enum_name(WeightDecayMode::decoupled)) + " (the default) with optimizer " +
                std::string(enum_name(OptimizerKind::sgd)) +
                ", whose weight decay is coupled L2 (torch.optim.SGD's); " +
                std::string(enum_name(WeightDecayMode::independent)) + " is for " +
                std::string(enum_name(OptimizerKind::adamw)),
            enum_name(c.decay));
  check_arg(std::isfinite(c.warmdown) && c.warmdown >= 0 && c.warmdown <= 1, op, "warmdown",
            "in [0, 1]", std::to_string(c.warmdown));
  check_arg(std::isfinite(c.skip_outliers) && c.skip_outliers >= 0, op, "skip_outliers",
            "finite and >= 0 (0: off)", std::to_string(c.skip_outliers));
  check_arg(std::isfinite(c.lr) && c.lr > 0, op, "lr", "finite and > 0", std::to_string(c.lr));
  check_arg(c.steps >= 1, op, "steps", ">= 1", std::to_string(c.steps));
  check_arg(c.batch >= 1, op, "batch", ">= 1", std::to_string(c.batch));
  check_arg(c.grad_accum >= 1, op, "grad_accum", ">= 1", std::to_string(c.grad_accum));
  check_arg(std::isfinite(c.z_loss) && c.z_loss >= 0, op, "z_loss", "finite and >= 0",
            std::to_string(c.z_loss));
  check_arg(c.warmup >= 0 && c.warmup <= c.steps, op, "warmup", "in [0, steps]",
            std::to_string(c.warmup));
  check_arg(c.eval_every >= 1, op, "eval_every", ">= 1", std::to_string(c.eval_every));
  check_arg(c.eval_size >= 1, op, "eval_size", ">= 1", std::to_string(c.eval_size));
  check_arg(c.eval_batch >= 0, op, "eval_batch", ">= 0 (0: --batch)", std::to_string(c.eval_batch));
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
  check_param_groups(c);
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
                {"positions", flat.at("positions").get<bool>() ? PositionEncoding::learned
                                                               : PositionEncoding::none},
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
  json j = config_json::parse(text);
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
  read_config_file_text(path, "config file",
                        [&](const std::string& text) { read_json_text(text, config); });
}

void write_config_file(const std::string& path, const TrainConfig& config) {
  const std::string text = to_json_text(config) + "\n";
  write_file_atomic(path, std::as_bytes(std::span(text.data(), text.size())));
}

void read_run_config(const std::string& run_dir, TrainConfig& config) {
  const std::string path = run_dir + "/model.safetensors";
  read_saved_config(read_run_meta(path), path, config);
}

namespace {

std::string shape_text(const std::vector<std::size_t>& shape) {
  std::string s = "(";
  for (std::size_t i = 0; i < shape.size(); ++i) s += (i ? ", " : "") + std::to_string(shape[i]);
  return s + (shape.size() == 1 ? ",)" : ")");
}

}  // namespace

void read_saved_config(const RunMeta& meta, const std::string& path, TrainConfig& config) {
  std::vector<ParameterShape> want;
  try {
    read_json_text(meta.config_json, config);
    want = transformer_parameter_shapes(resolve_model(config.model, task_shape(config.task)));
  } catch (const std::invalid_argument& e) {
    throw std::invalid_argument(path + ": model_config: " + e.what());
  }
  // The tensors first: a config that describes another model than the file holds is refused
  // before a model (of a size the metadata alone decides) is built.
  const auto refuse = [&](const std::string& what) {
    throw std::invalid_argument(path + ": model_config disagrees with the file's tensors: " + what);
  };
  for (const ParameterShape& p : want) {
    const auto it = std::find_if(meta.model_tensors.begin(), meta.model_tensors.end(),
                                 [&](const auto& t) { return t.first == p.name; });
    if (it == meta.model_tensors.end())
      refuse("the config's model has '" + p.name + "' " + shape_text(p.shape) +
             ", which the file does not hold");
    if (it->second != p.shape)
      refuse("'" + p.name + "' is " + shape_text(p.shape) + " in the config's model and " +
             shape_text(it->second) + " in the file");
  }
  if (meta.model_tensors.size() != want.size()) {
    for (const auto& tensor : meta.model_tensors) {
      const std::string& name = tensor.first;
      const bool known = std::any_of(want.begin(), want.end(),
                                     [&](const ParameterShape& p) { return p.name == name; });
      if (!known) refuse("the file holds '" + name + "', which the config's model does not have");
    }
  }
}

std::string run_context_json(const RunContextRecord& record) {
  const nlohmann::json j = {{"threads", record.threads},
                            {"thread_split", std::string(enum_name(record.thread_split))},
                            {"device", std::string(enum_name(record.device))}};
  return j.dump();
}

std::optional<RunContextRecord> read_run_context(const RunMeta& meta, const std::string& path) {
  if (meta.run_context.empty()) return std::nullopt;
  RunContextRecord r;
  try {
    const nlohmann::json j = nlohmann::json::parse(meta.run_context);
    r.threads = j.at("threads").get<int>();
    r.thread_split = parse_enum<ThreadSplit>(j.at("thread_split").get<std::string>());
    r.device = parse_enum<Backend>(j.at("device").get<std::string>());
    if (r.threads < 1) throw std::invalid_argument("threads " + std::to_string(r.threads));
  } catch (const std::exception& e) {
    throw CheckpointError(path, "metadata 'run_context' is not a run context (" + meta.run_context +
                                    "): " + e.what());
  }
  return r;
}

std::size_t eval_rows(const TrainConfig& c) {
  return static_cast<std::size_t>(std::min(c.eval_batch > 0 ? c.eval_batch : c.batch, c.eval_size));
}

MemoryEstimate estimate_memory(const TrainConfig& c) {
  validate(c);
  const TransformerConfig m = resolve_model(c.model, task_shape(c.task));
  const AttentionConfig& a = m.block.attention;
  constexpr double kFloat = sizeof(float);
  const double P = transformer_parameter_count(m);
  const double C = double(a.d_model), H = double(a.heads), F = double(m.block.d_ff);
  const double D = double(std::max(a.head_dim_k(), a.head_dim_v()));
  const double T = double(m.max_len), V = double(m.out_vocab), L = double(m.layers);
  // Per example, in floats: each block keeps its inputs, norms, q, k, v, attention output, the
  // MLP's hidden activations (with their gradients during the backward) and the attention
  // weights, scores and q·k products that the eval's statistics read; the embedding and the
  // logits with their probabilities and gradient.
  const double mlp = m.block.mlp == MlpActivation::swiglu ? 7 * F : 4 * F;  // SwiGLU: 2F + F
  // Under bf16 on the CPU each layer also keeps the bf16 roundings of its GEMMs' inputs (x for the
  // projections, the merged heads, the MLP's input and hidden layer) and of its weights, 2 bytes a
  // value, for its backward (attnlab/operand_keep.hpp).
  const bool bf16 = c.precision == GemmPrecision::bf16;
  const double kept = bf16 ? (3 * C + F) / 2 : 0;
  const double per_block = T * (16 * C + mlp + 4 * H * D + kept) + 3 * H * T * T;
  const double per_example = L * per_block + T * (2 * C + 3 * V);
  MemoryEstimate e;
  e.parameters = (bf16 ? 2.5 : 2) * P * kFloat;  // values and gradients (and the roundings)
  e.optimizer = optimizer_state_values(plan_param_groups(c)) * kFloat;  // AdamW 2, SGD 1 per value
  // The eval set runs in chunks of eval_rows (evaluate): --eval-size costs time, not memory.
  e.activations = std::max(2.0 * c.batch, double(eval_rows(c))) * per_example * kFloat;
  return e;
}

namespace {

// /proc/meminfo's or /proc/self/status's "Key:   1234 kB" in bytes, or -1.
double proc_kb(const char* file, const char* key) {
  std::ifstream in(file);
  std::string line;
  const std::string prefix = std::string(key) + ":";
  while (std::getline(in, line)) {
    if (!line.starts_with(prefix)) continue;
    std::istringstream fields(line.substr(prefix.size()));
    double kb = -1;
    fields >> kb;
    return kb >= 0 ? kb * 1024 : -1;
  }
  return -1;
}

std::string gib(double bytes) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.2f GiB", bytes / (1024.0 * 1024.0 * 1024.0));
  return buf;
}

}  // namespace

std::optional<MemoryLimit> memory_limit() {
  if (const char* env = std::getenv("ATTNLAB_MEMORY_LIMIT"); env && *env) {
    const std::string text = env;
    if (text == "none") return std::nullopt;
    std::size_t used = 0;
    double v = -1;
    try {
      v = std::stod(text, &used);
    } catch (const std::exception&) {
      used = 0;
    }
    std::string unit = text.substr(used);
    const std::string units = "KMGT";
    double scale = 1;
    if (unit.size() == 1 && units.find(unit[0]) != std::string::npos)
      scale = std::pow(1024.0, double(units.find(unit[0]) + 1));
    else if (!unit.empty())
      v = -1;
    check_arg(used > 0 && std::isfinite(v) && v > 0, "memory limit", "ATTNLAB_MEMORY_LIMIT",
              "a size in bytes, with an optional K, M, G or T suffix, or none", text);
    return MemoryLimit{v * scale, "ATTNLAB_MEMORY_LIMIT=" + text};
  }
  std::optional<MemoryLimit> limit;
  if (const double avail = proc_kb("/proc/meminfo", "MemAvailable"); avail > 0)
    limit = MemoryLimit{avail, "MemAvailable in /proc/meminfo"};
  rlimit as{};
  if (::getrlimit(RLIMIT_AS, &as) == 0 && as.rlim_cur != RLIM_INFINITY) {
    const double used = std::max(0.0, proc_kb("/proc/self/status", "VmSize"));
    const double left = std::max(0.0, double(as.rlim_cur) - used);
    if (!limit || left < limit->bytes)
      limit = MemoryLimit{left, "the address space left under ulimit -v"};
  }
  return limit;
}

void check_memory(const MemoryEstimate& e, std::string_view what, double copies) {
  const std::optional<MemoryLimit> limit = memory_limit();
  if (!limit || copies * e.total() <= limit->bytes) return;
  std::string need = "about " + gib(copies * e.total());
  if (copies > 1) need += " (" + std::to_string(long(copies)) + " runs at once)";
  throw std::invalid_argument(
      std::string(what) + ": the run would need " + need + " (parameters and gradients " +
      gib(e.parameters) + ", optimizer state " + gib(e.optimizer) + ", activations " +
      gib(e.activations) + "), more than the " + gib(limit->bytes) + " available (" +
      limit->source +
      "); lower --batch, --eval-batch, --block or the model's size, or set ATTNLAB_MEMORY_LIMIT");
}

}  // namespace attnlab::app
