// JSON of the nested model config (TransformerConfig ⊃ BlockConfig ⊃ AttentionConfig ⊃
// SdpaConfig) and the field macro that the application's configs use too.
//
// Why a separate header: nn/ stays free of nlohmann-json (the library links it privately, and a
// user of the modules needs no JSON), so the (de)serialisers of the nn structs live here, one line
// per struct in config_json.cpp. Include <nlohmann/json.hpp> before expanding the macro.
//
// Reading overlays: from_json(j, config) sets the fields that j names and keeps the others, so a
// partial file (or a nested object) keeps the defaults of the value it is read into. A key that is
// not a field is an error naming its path; so is a value of the wrong type. Enums are strings
// (parsed by their parse_* functions, which reject an unknown name instead of picking the first).
#pragma once

#include <initializer_list>
#include <stdexcept>
#include <string>
#include <string_view>

#include <nlohmann/json_fwd.hpp>

#include "attnlab/nn/transformer.hpp"

namespace attnlab {

// A bad config value: path "block.attention.heads" and the problem.
struct ConfigError : std::invalid_argument {
  ConfigError(std::string path, const std::string& problem);
  std::string path;
  std::string problem;
};

void to_json(nlohmann::json& j, Scaling v);
void from_json(const nlohmann::json& j, Scaling& v);
void to_json(nlohmann::json& j, SdpaPath v);
void from_json(const nlohmann::json& j, SdpaPath& v);
void to_json(nlohmann::json& j, Norm v);
void from_json(const nlohmann::json& j, Norm& v);
void to_json(nlohmann::json& j, MlpActivation v);
void from_json(const nlohmann::json& j, MlpActivation& v);
void to_json(nlohmann::json& j, PositionEncoding v);
void from_json(const nlohmann::json& j, PositionEncoding& v);
// scaling, scale (null: none), causal, path. head_scale and the tile sizes are not config.
void to_json(nlohmann::json& j, const SdpaConfig& v);
void from_json(const nlohmann::json& j, SdpaConfig& v);
void to_json(nlohmann::json& j, const AttentionConfig& v);
void from_json(const nlohmann::json& j, AttentionConfig& v);
void to_json(nlohmann::json& j, const BlockConfig& v);
void from_json(const nlohmann::json& j, BlockConfig& v);
void to_json(nlohmann::json& j, const TransformerConfig& v);
void from_json(const nlohmann::json& j, TransformerConfig& v);

namespace config_json {

// Throws ConfigError unless j is an object whose keys are all in `fields`.
void check_keys(const nlohmann::json& j, std::string_view type,
                std::initializer_list<std::string_view> fields);

// Reads j[key] onto value when present; errors below come back with "key." prepended to the path.
template <class Json, class T>
void read_field(const Json& j, const char* key, T& value) {
  const auto it = j.find(key);
  if (it == j.end()) return;
  try {
    it->get_to(value);
  } catch (const ConfigError& e) {
    throw ConfigError(e.path.empty() ? key : std::string(key) + "." + e.path, e.problem);
  } catch (const std::exception& e) {  // a JSON type error or a parse_* rejection
    throw ConfigError(key, e.what());
  }
}

}  // namespace config_json
}  // namespace attnlab

#define ATTNLAB_JSON_FIELD_NAME(field) #field,
#define ATTNLAB_JSON_READ_FIELD(field) \
  ::attnlab::config_json::read_field(nlohmann_json_j, #field, nlohmann_json_t.field);

// to_json writes every listed field; from_json overlays the present ones and rejects other keys.
#define ATTNLAB_JSON_FIELDS(Type, ...)                                                      \
  void to_json(nlohmann::json& nlohmann_json_j, const Type& nlohmann_json_t) {              \
    NLOHMANN_JSON_EXPAND(NLOHMANN_JSON_PASTE(NLOHMANN_JSON_TO, __VA_ARGS__))                \
  }                                                                                         \
  void from_json(const nlohmann::json& nlohmann_json_j, Type& nlohmann_json_t) {            \
    ::attnlab::config_json::check_keys(                                                     \
        nlohmann_json_j, #Type,                                                             \
        {NLOHMANN_JSON_EXPAND(NLOHMANN_JSON_PASTE(ATTNLAB_JSON_FIELD_NAME, __VA_ARGS__))}); \
    NLOHMANN_JSON_EXPAND(NLOHMANN_JSON_PASTE(ATTNLAB_JSON_READ_FIELD, __VA_ARGS__))         \
  }
