// The bounds of a run config's numeric fields: one table that both the flags (their CLI11
// validators, built from it in the CLI) and the JSON files (--config, a study's groups[i].base, a
// checkpoint's model_config) check, so a value is refused with the same words whichever way it
// came. The type of a field (an integer that must not wrap, a finite float) is checked by the one
// JSON conversion of attnlab/io/config_json.hpp before these bounds; the rules between fields
// (heads dividing d_model, warmup <= steps) are validate()'s and TransformerConfig's.
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json_fwd.hpp>

namespace attnlab::app {

struct FieldBound {
  std::string_view key;   // the path in a TrainConfig's JSON: "model.block.attention.heads"
  std::string_view flag;  // the train flag that sets it ("--heads"), or "" when none does
  bool integer = false;   // an integer (else a real number)
  long double lo = 0, hi = 0;
  bool lo_open = false;  // (lo, ...: lo itself is refused
  // A file may also hold 0 for this field, meaning what this says (the flag has no such value):
  // "d_model / heads". Empty: 0 is refused unless inside [lo, hi].
  std::string_view zero_means = {};
};

// Every bounded field of a TrainConfig, in the order of its JSON.
const std::vector<FieldBound>& train_config_bounds();

// The entry of `key`; std::logic_error when there is none (a programming error).
const FieldBound& field_bound(std::string_view key);

// "an integer in [1, 256]", "a number in (0, 1]"; from_file adds "or 0 (<zero_means>)".
std::string bound_expectation(const FieldBound& b, bool from_file);

// "" when value lies within the bound, else "expected <expectation>, got <as_written>".
std::string bound_problem(const FieldBound& b, long double value, std::string_view as_written,
                          bool from_file);

// The flag's check of its text: parses it as a number and applies the bound ("" when fine).
std::string check_flag_text(const FieldBound& b, const std::string& text);

// The file's check: every bounded key present in j (a TrainConfig's JSON object) lies within its
// bound; ConfigError naming the key path (relative to j) otherwise. Keys of the wrong type are left
// to the conversion that follows.
void check_train_config_bounds(const nlohmann::json& j);

}  // namespace attnlab::app
