#include "attnlab/io/config_json.hpp"

#include <set>
#include <vector>

#include <nlohmann/json.hpp>

namespace attnlab {

ConfigError::ConfigError(std::string path_in, const std::string& problem_in)
    : std::invalid_argument(path_in.empty() ? "config: " + problem_in
                                            : "config key '" + path_in + "': " + problem_in),
      path(std::move(path_in)),
      problem(problem_in) {}

namespace config_json {

void check_keys(const nlohmann::json& j, std::string_view type,
                std::initializer_list<std::string_view> fields) {
  check_keys(j, type, std::vector<std::string_view>(fields));
}

void check_keys(const nlohmann::json& j, std::string_view type,
                const std::vector<std::string_view>& fields) {
  if (!j.is_object())
    throw ConfigError("", "expected a JSON object (" + std::string(type) + "), got " +
                              std::string(j.type_name()));
  for (const auto& item : j.items()) {
    bool known = false;
    for (std::string_view f : fields) known = known || item.key() == f;
    if (known) continue;
    std::string expected;
    for (std::string_view f : fields) expected += (expected.empty() ? "" : ", ") + std::string(f);
    throw ConfigError(
        item.key(), "unknown key in " + std::string(type) + " (expected one of: " + expected + ")");
  }
}

namespace {

// nlohmann's DOM parser with two refusals more: a key given twice in one object (nlohmann keeps the
// last silently) and nesting deeper than kMaxConfigDepth. sax_parse calls these by name, so they
// hide the base's.
class StrictSax : public nlohmann::detail::json_sax_dom_parser<nlohmann::json> {
  using Base = nlohmann::detail::json_sax_dom_parser<nlohmann::json>;

 public:
  explicit StrictSax(nlohmann::json& result) : Base(result, true) {}
  bool start_object(std::size_t n) {
    if (!enter()) return false;
    frames_.push_back({true, {}, {}});
    return Base::start_object(n);
  }
  bool end_object() {
    frames_.pop_back();
    return Base::end_object();
  }
  bool start_array(std::size_t n) {
    if (!enter()) return false;
    frames_.push_back({false, {}, {}});
    return Base::start_array(n);
  }
  bool end_array() {
    frames_.pop_back();
    return Base::end_array();
  }
  bool key(std::string& k) {
    Frame& f = frames_.back();
    if (!f.seen.insert(k).second) {
      problem_ = "the key '" + k + "' is given twice" + where() +
                 " (a key may appear once: which one was meant?)";
      return false;
    }
    f.key = k;
    return Base::key(k);
  }
  const std::string& problem() const { return problem_; }

 private:
  struct Frame {
    bool object;
    std::set<std::string> seen;
    std::string key;
  };
  bool enter() {
    if (frames_.size() < kMaxConfigDepth) return true;
    problem_ = "nested deeper than " + std::to_string(kMaxConfigDepth) + " levels" + where();
    return false;
  }
  std::string where() const {
    std::string path;
    for (std::size_t i = 0; i + 1 < frames_.size(); ++i)
      path += frames_[i].object ? (path.empty() ? "" : ".") + frames_[i].key : "[]";
    return path.empty() ? "" : " in " + path;
  }
  std::vector<Frame> frames_;
  std::string problem_;
};

}  // namespace

nlohmann::json parse(std::string_view text) {
  nlohmann::json result;
  StrictSax sax(result);
  bool ok = false;
  try {
    ok = nlohmann::json::sax_parse(text, &sax);
  } catch (const nlohmann::json::exception& e) {
    throw std::invalid_argument(std::string("config: not valid JSON: ") + e.what());
  }
  if (!ok) throw ConfigError("", sax.problem());
  return result;
}

std::string join_path(std::string_view key, std::string_view path) {
  if (path.empty()) return std::string(key);
  if (path.front() == '[') return std::string(key) + std::string(path);
  return std::string(key) + "." + std::string(path);
}

void write_name(nlohmann::json& j, std::string_view name) {
  j = std::string(name);
}

std::string read_name(const nlohmann::json& j) {
  if (!j.is_string()) throw ConfigError("", "expected a string, got " + shown(j));
  return j.get<std::string>();
}

std::string shown(const nlohmann::json& j) {
  // The replace handler: invalid UTF-8 in a string is shown as U+FFFD instead of throwing.
  return shown_text(j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace), 64);
}

}  // namespace config_json

namespace {

// SdpaConfig's JSON fields but the optional scale, in order: the one list the writer, the key
// check and the reader walk. A new field of the config (an AttentionVariant knob a layer fixes)
// is one line here.
template <class Config, class Visit>
void visit_sdpa_fields(Config& v, Visit&& visit) {
  visit("scaling", v.scaling);
  visit("causal", v.causal);
  visit("window", v.window);
  visit("softcap", v.softcap);
  visit("path", v.path);
}

}  // namespace

// By hand: the optional scale is null or a number (nlohmann 3.11 has no std::optional support).
void to_json(nlohmann::json& j, const SdpaConfig& v) {
  j = nlohmann::json::object();
  visit_sdpa_fields(v, [&](const char* key, const auto& field) { j[key] = field; });
  j["scale"] = v.scale ? nlohmann::json(*v.scale) : nlohmann::json(nullptr);
}

void from_json(const nlohmann::json& j, SdpaConfig& v) {
  std::vector<std::string_view> keys;
  visit_sdpa_fields(v, [&](const char* key, auto&) { keys.emplace_back(key); });
  keys.insert(keys.begin() + 1, "scale");  // after scaling, as the files spell it
  config_json::check_keys(j, "SdpaConfig", keys);
  visit_sdpa_fields(v,
                    [&](const char* key, auto& field) { config_json::read_field(j, key, field); });
  if (const auto it = j.find("scale"); it != j.end()) {
    if (it->is_null()) {
      v.scale.reset();
    } else {
      double s = 0;
      config_json::read_field(j, "scale", s);
      v.scale = s;
    }
  }
}

ATTNLAB_JSON_FIELDS(AttentionConfig, d_model, heads, kv_heads, d_k, d_v, d_context, sdpa, qk_norm,
                    learnable_scale, alibi, dropout, rope, rope_theta, rope_fraction,
                    rope_interleaved)
ATTNLAB_JSON_FIELDS(BlockConfig, attention, d_ff, attn_only, mlp, norm, bias, dropout)
ATTNLAB_JSON_FIELDS(TransformerConfig, vocab_sizes, max_len, layers, out_vocab, positions, block,
                    logit_softcap, tie_embeddings)

ATTNLAB_JSON_FIELDS(ParamSelector, pattern, rank, kind)

namespace {
// null: not set; else a finite number (read_value's check).
void read_optional(const nlohmann::json& j, const char* key, std::optional<double>& v) {
  const auto it = j.find(key);
  if (it == j.end()) return;
  if (it->is_null()) {
    v.reset();
    return;
  }
  double x = 0;
  config_json::read_field(j, key, x);
  v = x;
}

nlohmann::json optional_json(const std::optional<double>& v) {
  return v ? nlohmann::json(*v) : nlohmann::json(nullptr);
}
}  // namespace

// By hand: lr_mult and weight_decay are null or a number, as SdpaConfig's scale.
void to_json(nlohmann::json& j, const ParamGroupSpec& v) {
  j = {{"name", v.name},
       {"match", v.match},
       {"optimizer", v.optimizer},
       {"lr_mult", optional_json(v.lr_mult)},
       {"weight_decay", optional_json(v.weight_decay)}};
}

void from_json(const nlohmann::json& j, ParamGroupSpec& v) {
  config_json::check_keys(j, "ParamGroupSpec",
                          {"name", "match", "optimizer", "lr_mult", "weight_decay"});
  config_json::read_field(j, "name", v.name);
  config_json::read_field(j, "match", v.match);
  config_json::read_field(j, "optimizer", v.optimizer);
  read_optional(j, "lr_mult", v.lr_mult);
  read_optional(j, "weight_decay", v.weight_decay);
}

}  // namespace attnlab
