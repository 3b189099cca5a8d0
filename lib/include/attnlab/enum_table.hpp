// One table per enum: the name of each value (its spelling in flags, config files, checkpoints and
// messages) and a phrase of help, written once, next to the enum. Everything that turns such an
// enum into text or back goes through its table: to_string and the parse_* functions are thin
// wrappers over enum_name and parse_enum, the CLI offers enum_name_list() as a flag's choices and
// enum_help_text() in its help, and io/config_json.hpp reads and writes every table enum as its
// name. A new value is one line in the table (and the code that gives it a meaning).
//
// A table is a specialisation of EnumTable in namespace attnlab, after its enum:
//
//   enum class Norm { layernorm, rmsnorm, none };
//   template <>
//   struct EnumTable<Norm> {
//     static constexpr EnumEntry<Norm> entries[] = {
//         {Norm::layernorm, "layernorm", "LayerNorm"},
//         {Norm::rmsnorm, "rmsnorm", "RMSNorm"},
//         {Norm::none, "none", "the identity"}};
//     static constexpr EnumParseText parse = {"parse_norm", "norm"};
//   };
//
// `entries` holds every value once, in the order lists and messages show them; names are string
// literals (so a name's data() is NUL-terminated). `parse` words the error of parse_enum, so that
// each enum keeps the message its parser always gave:
//   "parse_norm: norm expected layernorm|rmsnorm|none, got 'batchnorm'".
// No macros and no registry: the tables are constexpr data, the helpers plain templates.
#pragma once

#include <array>
#include <concepts>
#include <cstddef>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <type_traits>
#include <vector>

namespace attnlab {

template <class E>
struct EnumEntry {
  E value;
  std::string_view name;  // a string literal
  std::string_view help;  // a phrase for help texts; "" when the name says it all
};

// How an error lists the names: a|b|c, "a, b or c", or "'a', 'b' or 'c'".
enum class NameList { pipes, or_words, quoted_or };

// parse_enum's error: "<op>: <noun> expected <names>, got <text>", or "<op>: expected <names>, got
// <text>" without a noun; the text in single quotes when `quoted`, cut to 200 bytes (shown_text).
struct EnumParseText {
  std::string_view op;
  std::string_view noun = {};
  NameList list = NameList::pipes;
  bool quoted = true;
};

// Specialised next to each enum (see above); an enum without a table has no names.
template <class E>
struct EnumTable;

template <class E>
concept TableEnum = std::is_enum_v<E> && requires {
  EnumTable<E>::entries[0].value;
  { EnumTable<E>::parse } -> std::convertible_to<EnumParseText>;
};

// The table's entries, in its order.
template <TableEnum E>
constexpr std::span<const EnumEntry<E>> enum_entries() {
  return EnumTable<E>::entries;
}

// The name of `value` ("?" for a value the table lacks, e.g. a cast integer).
template <TableEnum E>
constexpr std::string_view enum_name(E value) {
  for (const EnumEntry<E>& e : EnumTable<E>::entries)
    if (e.value == value) return e.name;
  return "?";
}

// The help phrase of `value` ("" when it has none or the table lacks the value).
template <TableEnum E>
constexpr std::string_view enum_help(E value) {
  for (const EnumEntry<E>& e : EnumTable<E>::entries)
    if (e.value == value) return e.help;
  return {};
}

// The value named `name`, or nullopt.
template <TableEnum E>
constexpr std::optional<E> find_enum(std::string_view name) {
  for (const EnumEntry<E>& e : EnumTable<E>::entries)
    if (e.name == name) return e.value;
  return std::nullopt;
}

namespace enum_detail {

std::string join_names(std::span<const std::string_view> names, NameList list);
[[noreturn]] void refuse(const EnumParseText& how, std::span<const std::string_view> names,
                         std::string_view text);
std::string help_text(std::span<const std::string_view> names,
                      std::span<const std::string_view> helps);

template <TableEnum E>
constexpr auto names() {
  std::array<std::string_view, std::size(EnumTable<E>::entries)> out{};
  for (std::size_t i = 0; i < out.size(); ++i) out[i] = EnumTable<E>::entries[i].name;
  return out;
}

}  // namespace enum_detail

// The names joined as `list` says: "layernorm|rmsnorm|none" by default.
template <TableEnum E>
std::string enum_names(NameList list = NameList::pipes) {
  return enum_detail::join_names(enum_detail::names<E>(), list);
}

// The names, for a CLI flag's choices.
template <TableEnum E>
std::vector<std::string> enum_name_list() {
  const auto names = enum_detail::names<E>();
  return {names.begin(), names.end()};
}

// "name: help; name: help; ..." (an entry without help: its name alone), for a flag's help.
template <TableEnum E>
std::string enum_help_text() {
  std::array<std::string_view, std::size(EnumTable<E>::entries)> helps{};
  for (std::size_t i = 0; i < helps.size(); ++i) helps[i] = EnumTable<E>::entries[i].help;
  return enum_detail::help_text(enum_detail::names<E>(), helps);
}

// The value named `text`; std::invalid_argument worded by `how` otherwise.
template <TableEnum E>
E parse_enum(std::string_view text, const EnumParseText& how) {
  if (const std::optional<E> value = find_enum<E>(text)) return *value;
  enum_detail::refuse(how, enum_detail::names<E>(), text);
}

// The same, worded by the table's `parse`.
template <TableEnum E>
E parse_enum(std::string_view text) {
  return parse_enum<E>(text, EnumTable<E>::parse);
}

// The same, worded by the table's `parse` with the caller's op and noun: parse_backend(name,
// "train", "device") says "train: device expected 'cpu' or 'cuda', got 'tpu'".
template <TableEnum E>
E parse_enum(std::string_view text, std::string_view op, std::string_view noun) {
  EnumParseText how = EnumTable<E>::parse;
  how.op = op;
  how.noun = noun;
  return parse_enum<E>(text, how);
}

}  // namespace attnlab
