// The run config's numeric knobs, each declared once: its JSON path, its field, its train flag
// with the flag's help, and its bounds. The CLI's flags are made from this table (their CLI11
// validators, their help and their defaults), and the JSON files (--config, a study's
// groups[i].base, a checkpoint's model_config) are checked against the same bounds, so a value is
// refused with the same words whichever way it came. The type of a field (an integer that must not
// wrap, a finite float) is checked by the one JSON conversion of attnlab/io/config_json.hpp before
// these bounds; the rules between fields (heads dividing d_model, warmup <= steps) are
// validate()'s and TransformerConfig's. Enum knobs have their own tables (attnlab/enum_table.hpp);
// the switches (--qk-norm, --causal, ...) are one line each in the CLI.
#pragma once

#include <optional>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

#include <nlohmann/json_fwd.hpp>

namespace attnlab {
struct TransformerConfig;
}

namespace attnlab::app {

struct TaskConfig;
struct TrainConfig;

// Where a knob's value lives. std::size_t and std::uint64_t are each one of the two unsigned
// types (the same one on Linux).
using KnobField =
    std::variant<int*, unsigned long*, unsigned long long*, double*, std::optional<double>*>;
// The field, reached from the part of the run config that the key starts with: the TaskConfig for
// "task.", the TransformerConfig for "model.", the TrainConfig itself otherwise. So the flags of
// `make-data` (a task only) and `gradcheck` (a model only) come from the same rows as train's.
using KnobAccess = std::variant<KnobField (*)(TaskConfig&), KnobField (*)(TransformerConfig&),
                                KnobField (*)(TrainConfig&)>;

struct FieldBound {
  std::string_view key;   // the path in a TrainConfig's JSON: "model.block.attention.heads"
  KnobAccess field;       // the same path as a pointer (ATTNLAB_KNOB_* in config_bounds.cpp)
  bool integer = false;   // an integer field (else a real number): from the field's type
  std::string_view flag;  // the train flag that sets it ("--heads"), or "" when none does
  std::string_view help;  // the flag's help, without its default (shown from the field)
  long double lo = 0, hi = 0;
  bool lo_open = false;  // (lo, ...: lo itself is refused
  // A file may also hold 0 for this field, meaning what this says (the flag has no such value):
  // "d_model / heads". Empty: 0 is refused unless inside [lo, hi].
  std::string_view zero_means = {};
};

// Every numeric knob of a TrainConfig, in the order of the flags' help.
const std::vector<FieldBound>& train_config_bounds();

// The field of knob `b` in `config`, whichever part of it the knob belongs to.
KnobField knob_field(const FieldBound& b, TrainConfig& config);

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
