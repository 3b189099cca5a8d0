// JSON of the nested model config (TransformerConfig ⊃ BlockConfig ⊃ AttentionConfig ⊃
// SdpaConfig) and the field macro that the application's configs use too.
//
// Why a separate header: nn/ stays free of nlohmann-json (the library links it privately, and a
// user of the modules needs no JSON), so the (de)serialisers of the nn structs live here, one line
// per struct in config_json.cpp. Include <nlohmann/json.hpp> before expanding the macro.
//
// Reading overlays: from_json(j, config) sets the fields that j names and keeps the others, so a
// partial file (or a nested object) keeps the defaults of the value it is read into. A key that is
// not a field is an error naming its path; so is a value of the wrong type. An enum with a table
// (attnlab/enum_table.hpp) is its name, read by parse_enum, which rejects an unknown name in the
// words of the enum's parse_* function instead of picking the first.
#pragma once

#include <cmath>
#include <cstdint>
#include <initializer_list>
#include <limits>
#include <stdexcept>
#include <string>
#include <string_view>
#include <type_traits>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "attnlab/enum_table.hpp"
#include "attnlab/nn/transformer.hpp"
#include "attnlab/optim/param_groups.hpp"

namespace attnlab {

// A bad config value: path "block.attention.heads" and the problem.
struct ConfigError : std::invalid_argument {
  ConfigError(std::string path, const std::string& problem);
  std::string path;
  std::string problem;
};

namespace config_json {
// A table enum's JSON: its name as a string; and back, the string (ConfigError "expected a
// string, got ..." for another JSON type).
void write_name(nlohmann::json& j, std::string_view name);
std::string read_name(const nlohmann::json& j);
}  // namespace config_json

// Every table enum (Scaling, Norm, TaskKind, ...) is its name in JSON; reading refuses an unknown
// name with parse_enum's message. An enum outside namespace attnlab brings these two in with a
// using-declaration in its own namespace, where argument-dependent lookup finds them.
template <TableEnum E>
void to_json(nlohmann::json& j, E v) {
  config_json::write_name(j, enum_name(v));
}
template <TableEnum E>
void from_json(const nlohmann::json& j, E& v) {
  v = parse_enum<E>(config_json::read_name(j));
}

// scaling, scale (null: none), causal, path. head_scale and the tile sizes are not config.
void to_json(nlohmann::json& j, const SdpaConfig& v);
void from_json(const nlohmann::json& j, SdpaConfig& v);
void to_json(nlohmann::json& j, const AttentionConfig& v);
void from_json(const nlohmann::json& j, AttentionConfig& v);
void to_json(nlohmann::json& j, const BlockConfig& v);
void from_json(const nlohmann::json& j, BlockConfig& v);
void to_json(nlohmann::json& j, const TransformerConfig& v);
void from_json(const nlohmann::json& j, TransformerConfig& v);
// Parameter groups (optim/param_groups.hpp): pattern, rank, kind; name, match, optimizer, lr_mult
// and weight_decay, the last two null when not set (the default group's value; 1 for lr_mult).
void to_json(nlohmann::json& j, const ParamSelector& v);
void from_json(const nlohmann::json& j, ParamSelector& v);
void to_json(nlohmann::json& j, const ParamGroupSpec& v);
void from_json(const nlohmann::json& j, ParamGroupSpec& v);

namespace config_json {

// The check of ATTNLAB_JSON_FIELDS: none.
inline void no_check(const nlohmann::json&) {}

template <class T>
struct is_vector : std::false_type {};
template <class T, class A>
struct is_vector<std::vector<T, A>> : std::true_type {};

// Throws ConfigError unless j is an object whose keys are all in `fields`.
void check_keys(const nlohmann::json& j, std::string_view type,
                std::initializer_list<std::string_view> fields);
void check_keys(const nlohmann::json& j, std::string_view type,
                const std::vector<std::string_view>& fields);

// Config files nest no deeper than this (ours: 5 levels).
inline constexpr std::size_t kMaxConfigDepth = 64;

// Parses a config file's text: JSON with no key given twice in one object and nesting no deeper
// than kMaxConfigDepth (ConfigError naming the key or the depth); std::invalid_argument "config:
// not valid JSON: ..." for a syntax error (an empty file, invalid UTF-8, a truncated text).
nlohmann::json parse(std::string_view text);

// The path of a nested key: "block" + "heads" -> "block.heads", "groups" + "[0].base" ->
// "groups[0].base".
std::string join_path(std::string_view key, std::string_view path);

// A JSON value as the error shows it: its text, cut to 64 characters.
std::string shown(const nlohmann::json& j);

// "an integer in [lo, hi]" for the integer type T (the bounds of the C++ type; a field's own bounds
// are checked after).
template <class T>
std::string integer_range_text() {
  return "an integer in [" + std::to_string(std::numeric_limits<T>::min()) + ", " +
         std::to_string(std::numeric_limits<T>::max()) + "]";
}

// The one checked conversion from JSON: a bool must be true or false; an integer field takes an
// integer (or a float with an integral value, 1e3) within its C++ type's range, so -3 never wraps
// to a huge count and 1e30 is never converted with undefined behaviour; a floating field takes a
// finite number; a string a string; a list converts each element, the index in the error path
// ("[2]"); anything else is the type's own from_json (an object overlay). Errors are ConfigError
// with the value as written.
template <class Json, class T>
void read_value(const Json& j, T& value) {
  if constexpr (std::is_same_v<T, bool>) {
    if (!j.is_boolean()) throw ConfigError("", "expected true or false, got " + shown(j));
    value = j.template get<bool>();
  } else if constexpr (std::is_integral_v<T>) {
    const auto refuse = [&] {
      throw ConfigError("", "expected " + integer_range_text<T>() + ", got " + shown(j));
    };
    if (j.is_number_unsigned()) {
      const auto u = j.template get<std::uint64_t>();
      if (u > static_cast<std::uint64_t>(std::numeric_limits<T>::max())) refuse();
      value = static_cast<T>(u);
    } else if (j.is_number_integer()) {
      const auto i = j.template get<std::int64_t>();
      if constexpr (std::is_unsigned_v<T>) {
        if (i < 0 || static_cast<std::uint64_t>(i) > std::numeric_limits<T>::max()) refuse();
      } else {
        if (i < std::numeric_limits<T>::min() || i > std::numeric_limits<T>::max()) refuse();
      }
      value = static_cast<T>(i);
    } else if (j.is_number_float()) {
      // long double holds every 64-bit integer exactly, so the range test is exact.
      const long double d = j.template get<double>();
      if (!(d == std::floor(d)) || d < static_cast<long double>(std::numeric_limits<T>::min()) ||
          d > static_cast<long double>(std::numeric_limits<T>::max()))
        refuse();
      value = static_cast<T>(d);
    } else {
      refuse();
    }
  } else if constexpr (std::is_floating_point_v<T>) {
    if (!j.is_number()) throw ConfigError("", "expected a number, got " + shown(j));
    const double d = j.template get<double>();
    if (!std::isfinite(d) || std::fabs(d) > static_cast<double>(std::numeric_limits<T>::max()))
      throw ConfigError("", "expected a finite number, got " + shown(j));
    value = static_cast<T>(d);
  } else if constexpr (std::is_same_v<T, std::string>) {
    if (!j.is_string()) throw ConfigError("", "expected a string, got " + shown(j));
    value = j.template get<std::string>();
  } else if constexpr (is_vector<T>::value) {
    if (!j.is_array()) throw ConfigError("", "expected a JSON array, got " + shown(j));
    T out(j.size());
    for (std::size_t i = 0; i < j.size(); ++i) {
      // Appended, not "[" + ...: GCC 12 at -O3 warns falsely (-Wrestrict) on const char* +
      // string&&.
      std::string at = "[";
      at.append(std::to_string(i)).append("]");
      try {
        read_value(j[i], out[i]);
      } catch (const ConfigError& e) {
        throw ConfigError(join_path(at, e.path), e.problem);
      } catch (const std::exception& e) {  // a JSON type error or a parse_* rejection
        throw ConfigError(at, e.what());
      }
    }
    value = std::move(out);
  } else {
    j.get_to(value);
  }
}

// Reads j[key] onto value when present (read_value); errors below come back with "key." prepended
// to the path.
template <class Json, class T>
void read_field(const Json& j, const char* key, T& value) {
  const auto it = j.find(key);
  if (it == j.end()) return;
  try {
    read_value(*it, value);
  } catch (const ConfigError& e) {
    throw ConfigError(join_path(key, e.path), e.problem);
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
#define ATTNLAB_JSON_FIELDS(Type, ...) \
  ATTNLAB_JSON_FIELDS_CHECKED(Type, ::attnlab::config_json::no_check, __VA_ARGS__)

// The same, with check(j) called on the object before any field is read (bounds that a field's
// type cannot say: see lib/README.md, "Input").
#define ATTNLAB_JSON_FIELDS_CHECKED(Type, check, ...)                                       \
  void to_json(nlohmann::json& nlohmann_json_j, const Type& nlohmann_json_t) {              \
    NLOHMANN_JSON_EXPAND(NLOHMANN_JSON_PASTE(NLOHMANN_JSON_TO, __VA_ARGS__))                \
  }                                                                                         \
  void from_json(const nlohmann::json& nlohmann_json_j, Type& nlohmann_json_t) {            \
    ::attnlab::config_json::check_keys(                                                     \
        nlohmann_json_j, #Type,                                                             \
        {NLOHMANN_JSON_EXPAND(NLOHMANN_JSON_PASTE(ATTNLAB_JSON_FIELD_NAME, __VA_ARGS__))}); \
    check(nlohmann_json_j);                                                                 \
    NLOHMANN_JSON_EXPAND(NLOHMANN_JSON_PASTE(ATTNLAB_JSON_READ_FIELD, __VA_ARGS__))         \
  }
