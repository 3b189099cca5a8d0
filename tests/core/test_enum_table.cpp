// The enum tables (attnlab/enum_table.hpp): names, parsing and its three ways of listing the
// names, help texts, and the JSON of a table enum (io/config_json.hpp); then every table of the
// library and the app: each value once, each name once, and name -> value -> name round trips.
#include <doctest/doctest.h>

#include <set>
#include <stdexcept>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "attnlab/app/context.hpp"
#include "attnlab/app/layer_check.hpp"
#include "attnlab/app/proxy_checks.hpp"
#include "attnlab/app/run_config.hpp"
#include "attnlab/app/study.hpp"
#include "attnlab/blas.hpp"
#include "attnlab/enum_table.hpp"
#include "attnlab/io/config_json.hpp"
#include "attnlab/io/safetensors.hpp"
#include "attnlab/optim/muon.hpp"
#include "attnlab/optim/schedule.hpp"

namespace attnlab {
// In attnlab itself: argument-dependent lookup finds the JSON conversions there.
enum class Fruit { apple, pear, fig };

template <>
struct EnumTable<Fruit> {
  static constexpr EnumEntry<Fruit> entries[] = {{Fruit::apple, "apple", "red or green"},
                                                 {Fruit::pear, "pear", ""},
                                                 {Fruit::fig, "fig", "soft"}};
  static constexpr EnumParseText parse = {"parse_fruit", "fruit"};
};
}  // namespace attnlab

using namespace attnlab;

namespace {

std::string error_of(auto&& f) {
  try {
    f();
  } catch (const std::exception& e) {
    return e.what();
  }
  return "no error";
}

// Every value of the table once, every name once, and each name parses back to its value.
template <class E>
void check_table() {
  std::set<E> values;
  std::set<std::string_view> names;
  for (const EnumEntry<E>& e : enum_entries<E>()) {
    CAPTURE(e.name);
    CHECK(values.insert(e.value).second);
    CHECK(names.insert(e.name).second);
    CHECK(!e.name.empty());
    CHECK(enum_name(e.value) == e.name);
    CHECK(parse_enum<E>(e.name) == e.value);
    CHECK(e.name.data()[e.name.size()] == '\0');  // a literal: to_string may return data()
  }
  CHECK(enum_name_list<E>().size() == enum_entries<E>().size());
}

}  // namespace

TEST_CASE("enum table: names, lookups and the three ways an error lists the names") {
  static_assert(TableEnum<Fruit>);
  static_assert(!TableEnum<NameList>);  // no table
  static_assert(enum_name(Fruit::pear) == "pear");
  static_assert(find_enum<Fruit>("fig") == Fruit::fig);
  static_assert(!find_enum<Fruit>("kiwi"));
  check_table<Fruit>();
  CHECK(enum_name(static_cast<Fruit>(7)) == "?");
  CHECK(enum_help(Fruit::apple) == "red or green");
  CHECK(enum_names<Fruit>() == "apple|pear|fig");
  CHECK(enum_names<Fruit>(NameList::or_words) == "apple, pear or fig");
  CHECK(enum_names<Fruit>(NameList::quoted_or) == "'apple', 'pear' or 'fig'");
  CHECK(enum_name_list<Fruit>() == std::vector<std::string>{"apple", "pear", "fig"});
  CHECK(enum_help_text<Fruit>() == "apple: red or green; pear; fig: soft");
  CHECK(parse_enum<Fruit>("pear") == Fruit::pear);
  CHECK(error_of([] { parse_enum<Fruit>("kiwi"); }) ==
        "parse_fruit: fruit expected apple|pear|fig, got 'kiwi'");
  CHECK(error_of([] { parse_enum<Fruit>("kiwi", "shop", "basket"); }) ==
        "shop: basket expected apple|pear|fig, got 'kiwi'");
  CHECK(error_of([] {
          parse_enum<Fruit>("kiwi", {"shop", "", NameList::or_words, false});
        }) == "shop: expected apple, pear or fig, got kiwi");
  CHECK(error_of([] {
          parse_enum<Fruit>("", {"shop", "fruit", NameList::quoted_or});
        }) == "shop: fruit expected 'apple', 'pear' or 'fig', got ''");
  // A long text is cut, as check_arg cuts it.
  const std::string message = error_of([] { parse_enum<Fruit>(std::string(100000, 'k')); });
  CHECK(message.size() < 400);
  CHECK(message.find("(100002 characters)") != std::string::npos);
}

TEST_CASE("enum table: JSON writes the name and reads it back, refusing others by the parser") {
  nlohmann::json j = Fruit::fig;
  CHECK(j == "fig");
  CHECK(j.get<Fruit>() == Fruit::fig);
  CHECK(nlohmann::json(Norm::rmsnorm).dump() == "\"rmsnorm\"");
  CHECK(nlohmann::json(app::TaskKind::mqar).dump() == "\"mqar\"");
  CHECK(error_of([] { (void)nlohmann::json("kiwi").get<Fruit>(); }) ==
        "parse_fruit: fruit expected apple|pear|fig, got 'kiwi'");
  CHECK(error_of([] { (void)nlohmann::json(3).get<Fruit>(); }) ==
        "config: expected a string, got 3");
}

TEST_CASE("enum table: every table of the library and the app is whole and round-trips") {
  check_table<Scaling>();
  check_table<SdpaPath>();
  check_table<PositionEncoding>();
  check_table<Norm>();
  check_table<MlpActivation>();
  check_table<DecayParams>();
  check_table<WeightDecayMode>();
  check_table<OptimizerKind>();
  check_table<LrScheduleKind>();
  check_table<MuonScale>();
  check_table<ParameterKind>();
  check_table<GemmEngine>();
  check_table<GemmPrecision>();
  check_table<Bf16Engine>();
  check_table<app::Backend>();
  check_table<Dtype>();
  check_table<app::TaskKind>();
  check_table<app::VocabKind>();
  check_table<app::ThreadSplit>();
  check_table<app::StudyPreset>();
  check_table<app::Verdict>();
  check_table<app::CheckableLayer>();
}
