// Every file attnlab reads is input: run configs, study grids and checkpoint metadata are checked
// with the key's path in the message, and a run that would not fit in memory is refused.
#include <doctest/doctest.h>
#include <unistd.h>

#ifdef ATTNLAB_CLI_PATH

#include <sys/wait.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <limits>
#include <map>
#include <optional>
#include <sstream>
#include <string>
#include <type_traits>
#include <variant>
#include <vector>

#include <nlohmann/json.hpp>

#include "attnlab/app/config_bounds.hpp"
#include "attnlab/app/run_config.hpp"
#include "attnlab/blas.hpp"
#include "attnlab/cuda.hpp"
#include "attnlab/distributed.hpp"
#include "attnlab/io/safetensors.hpp"
#include "attnlab/threads.hpp"
#include "cli_runner.hpp"

namespace fs = std::filesystem;
using namespace attnlab::test;

// ---- every file attnlab reads is input: configs, study grids, checkpoint metadata ----

namespace {

// Writes `text` to dir/name and returns the path, quoted for the shell.
std::string quoted_file(const fs::path& dir, const std::string& name, const std::string& text) {
  std::ofstream(dir / name, std::ios::binary) << text;
  return "'" + (dir / name).string() + "'";
}

// {"a": {"b": value}} for the key path "a.b".
std::string json_at(const std::string& key, const std::string& value) {
  std::string open, close;
  std::size_t start = 0;
  for (;;) {
    const std::size_t dot = key.find('.', start);
    open += "{\"" + key.substr(start, dot - start) + "\": ";
    close += "}";
    if (dot == std::string::npos) break;
    start = dot + 1;
  }
  return open + value + close;
}

std::string number_text(long double v, bool integer) {
  char buf[64];
  std::snprintf(buf, sizeof buf, integer ? "%.0Lf" : "%.9Lg", v);
  return buf;
}

}  // namespace

TEST_CASE("config input: negative counts, huge sizes and out-of-range numbers name the key") {
  const auto dir = scratch("config_table");
  // Each of these once reached std::bad_alloc (a negative count wrapped to a huge size) or
  // converted 1e30 to int; now one line naming the key path and the value as written.
  const std::pair<std::string, std::string> cases[] = {
      {R"({"model": {"layers": -3}})",
       "config key 'model.layers': expected an integer in [1, 64], "
       "got -3"},
      {R"({"model": {"block": {"d_ff": -1}}})",
       "config key 'model.block.d_ff': expected an "
       "integer in [1, 65536] or 0 (4 * d_model; swiglu: 8/3 * d_model), got -1"},
      {R"({"steps": 1e30})",
       "config key 'steps': expected an integer in [1, 100000000], got 1e+30"},
      {R"({"steps": 2.5})", "config key 'steps': expected an integer in [1, 100000000], got 2.5"},
      {R"({"model": {"block": {"attention": {"heads": 1000000, "d_model": 1000000}}}})",
       "got 1000000"},
      {R"({"model": {"vocab_sizes": [3, -1]}})",
       "config key 'model.vocab_sizes[1]': expected an "
       "integer in [0, 18446744073709551615], got -1"},
      {R"({"lr": "0.1"})", "config key 'lr': expected a number, got \"0.1\""},
      {R"({"model": {"block": {"attention": {"causal": 1}}}})", "causal"},
      {R"({"model": {"block": {"attention": {"sdpa": {"causal": 1}}}}})",
       "config key 'model.block.attention.sdpa.causal': expected true or false, got 1"},
  };
  int i = 0;
  for (const auto& [text, needle] : cases)
    check_bad_input("train --config " + quoted_file(dir, "c" + std::to_string(i++) + ".json", text),
                    dir, needle);
}

TEST_CASE("config input: hostile files are one line, status 2") {
  const auto dir = scratch("config_hostile");
  const std::string nested(100000, '[');
  const std::string deep_objects = [] {
    std::string s;
    for (int i = 0; i < 100000; ++i) s += "{\"model\": ";
    return s + "1" + std::string(100000, '}');
  }();
  const std::pair<std::string, std::string> cases[] = {
      {"", "not valid JSON"},
      {"[1, 2]", "config: expected a JSON object (TrainConfig), got array"},
      {nested + std::string(100000, ']'), "nested deeper than 64 levels"},
      {deep_objects, "nested deeper than 64 levels in model.model"},
      {"{\"out\": \"\xff\xfe\"}", "not valid JSON"},
      {R"({"steps": 5, "model": {"layers": 1, "layers": 2}})",
       "the key 'layers' is given twice in model"},
      {"{\"optimizer\": \"" + std::string(10'000'000, 'a') + "\"}",
       "optimizer expected adamw|sgd|muon, got aaaa"},
      {"{\"task\": {\"kind\": \"" + std::string(10'000'000, 'b') + "\"}}", "task.kind"},
  };
  int i = 0;
  for (const auto& [text, needle] : cases) {
    const std::string file = quoted_file(dir, "h" + std::to_string(i++) + ".json", text);
    check_bad_input("train --config " + file, dir, needle);
    const Run r = cli("train --config " + file, dir);
    CHECK(r.err.size() < 2200);  // a 10 MB value is cut, not echoed
    for (const char c : r.err) CHECK(static_cast<unsigned char>(c) != 0xff);  // no raw bad UTF-8
  }
}

TEST_CASE("config input: every bounded flag refuses its out-of-range values as a file does") {
  const auto dir = scratch("config_bounds");
  int files = 0;
  for (const attnlab::app::FieldBound& b : attnlab::app::train_config_bounds()) {
    CAPTURE(b.key);
    const bool zero_allowed_in_file = !b.zero_means.empty();
    std::vector<long double> bad;
    if (b.integer)
      bad = {zero_allowed_in_file ? -1.0L : b.lo - 1, b.hi + 1};
    else
      bad = {b.lo_open && !zero_allowed_in_file ? b.lo : -1.0L,
             b.hi == std::numeric_limits<double>::max() ? 1e309L : b.hi * 2};
    const std::string expected = "expected " + attnlab::app::bound_expectation(b, false);
    for (const long double v : bad) {
      const std::string text = number_text(v, b.integer && v == std::floor(v));
      CAPTURE(text);
      if (!b.flag.empty())
        check_bad_input("train " + std::string(b.flag) + " " + text, dir,
                        std::string(b.flag) + ": " + expected + ", got " + text);
      const std::string file = quoted_file(dir, "b" + std::to_string(files++) + ".json",
                                           json_at(std::string(b.key), text));
      // Past double's range the JSON parser itself refuses the number.
      check_bad_input("train --config " + file, dir,
                      v > std::numeric_limits<double>::max()
                          ? "number overflow parsing '" + text + "'"
                          : "config key '" + std::string(b.key) + "': " + expected);
    }
  }
  // A value inside every bound is accepted both ways (the table is not stricter than the flags).
  const Run ok = cli(std::string("train ") + kTinySort + " --steps 2 --out '" +
                         (dir / "ok").string() + "' --seed 18446744073709551615",
                     dir);
  CHECK(ok.status == 0);
  const Run again = cli("train --quiet --config '" + (dir / "ok" / "config.json").string() +
                            "' --out '" + (dir / "ok2").string() + "'",
                        dir);
  CHECK(again.status == 0);
}

TEST_CASE("config input: every knob's field is the one its JSON key names, and a flag has help") {
  // Each knob's field gets a value of its own; the config's JSON must hold each at the knob's key,
  // so no two rows share a field and no key names another field than the row's pointer.
  attnlab::app::TrainConfig config;
  std::map<std::string, double> given;
  double next = 3;
  for (const attnlab::app::FieldBound& b : attnlab::app::train_config_bounds()) {
    CAPTURE(b.key);
    CHECK(b.flag.empty() == b.help.empty());
    CHECK(given.count(std::string(b.key)) == 0);
    const double v = next++;
    given[std::string(b.key)] = v;
    std::visit(
        [&](auto* field) {
          using Field = std::remove_cvref_t<decltype(*field)>;
          if constexpr (std::is_same_v<Field, std::optional<double>>)
            *field = v;
          else {
            CHECK(std::is_integral_v<Field> == b.integer);
            *field = static_cast<Field>(v);
          }
        },
        attnlab::app::knob_field(b, config));
  }
  const nlohmann::json j = config;
  for (const auto& [key, v] : given) {
    CAPTURE(key);
    const nlohmann::json* at = &j;
    for (std::size_t from = 0; at != nullptr;) {
      const std::size_t dot = key.find('.', from);
      const std::string name = key.substr(from, dot == std::string::npos ? dot : dot - from);
      at = at->contains(name) ? &(*at)[name] : nullptr;
      if (dot == std::string::npos) break;
      from = dot + 1;
    }
    REQUIRE(at != nullptr);
    CHECK(at->get<double>() == v);
  }
}

TEST_CASE("config input: a study group's base is checked with its path") {
  const auto dir = scratch("study_bounds");
  auto plan = nlohmann::json::parse(slurp(fs::path(ATTNLAB_TEST_DATA_DIR) / ".." / ".." / "data" /
                                          "configs" / "study_micro.json"));
  plan["groups"][0]["base"]["model"]["block"]["attention"]["heads"] = -2;
  const std::string file = quoted_file(dir, "study.json", plan.dump());
  check_bad_input("study --config " + file + " --out '" + (dir / "out").string() + "'", dir,
                  "config key 'groups[0].base.model.block.attention.heads': expected an integer in "
                  "[1, 256], got -2");
  const Run r = cli("study --config " + file + " --out '" + (dir / "out").string() + "'", dir);
  CHECK(r.out.empty());  // refused before the plan is printed
  plan = nlohmann::json::parse(slurp(fs::path(ATTNLAB_TEST_DATA_DIR) / ".." / ".." / "data" /
                                     "configs" / "study_micro.json"));
  plan["groups"][0]["lrs"][1] = "fast";
  check_bad_input("study --config " + quoted_file(dir, "study2.json", plan.dump()), dir,
                  "config key 'groups[0].lrs[1]': expected a number, got \"fast\"");
}

TEST_CASE("config input: a checkpoint's metadata is checked before the model is built") {
  const auto dir = scratch("meta_bounds");
  // The table's case: "layers": -1 in the metadata, the tensors untouched.
  const fs::path bad =
      run_with_edited_meta(dir, "neg", [](nlohmann::json& c) { c["model"]["layers"] = -1; });
  check_bad_input(
      "eval --checkpoint '" + bad.string() + "'", dir,
      "model_config: config key 'model.layers': expected an integer in [1, 64], got -1");
  check_bad_input("train --resume '" + bad.string() + "' --steps 4", dir, "'model.layers'");
  // Valid metadata that describes another model than the tensors: refused, naming the tensor.
  const fs::path more =
      run_with_edited_meta(dir, "more", [](nlohmann::json& c) { c["model"]["layers"] = 64; });
  check_bad_input("eval --checkpoint '" + more.string() + "'", dir,
                  "model_config disagrees with the file's tensors: the config's model has "
                  "'blocks.1.ln1.gamma' (8,), which the file does not hold");
  const fs::path wide = run_with_edited_meta(dir, "wide", [](nlohmann::json& c) {
    c["model"]["block"]["attention"]["d_model"] = 16;
    c["model"]["block"]["d_ff"] = 64;
  });
  check_bad_input("eval --checkpoint '" + wide.string() + "'", dir, "in the config's model and (");
  check_bad_input("generate --prompt a --checkpoint '" + wide.string() + "'", dir,
                  "model_config disagrees");
  const fs::path fewer = run_with_edited_meta(
      dir, "fewer", [](nlohmann::json& c) { c["model"]["block"]["attn_only"] = true; });
  check_bad_input("eval --checkpoint '" + fewer.string() + "'", dir,
                  "which the config's model does not have");
}

TEST_CASE("config input: a run that would not fit in memory is refused before it allocates") {
  const auto dir = scratch("memory_limit");
  const std::string big = "train --task text --data '" + std::string(ATTNLAB_TEST_DATA_DIR) +
                          "/text/hamlet_excerpt.txt' --causal --block 1024 --d-model 4096 "
                          "--heads 32 --layers 64 --d-ff 65536 --batch 64 --quiet --out '" +
                          (dir / "big").string() + "'";
  // On this machine's memory (or the ulimit): about 150 GiB of parameters alone.
  check_bad_input(big, dir, "train: the run would need about");
  check_bad_input(big, dir, "more than the");
  CHECK_FALSE(fs::exists(dir / "big"));
  // The limit can be set: 1 KiB refuses even the tiny run, naming the setting; "none" lifts it.
  const std::string tiny =
      std::string("train ") + kTinySort + " --steps 2 --out '" + (dir / "tiny").string() + "'";
  const Run limited = cli(tiny, dir, "ATTNLAB_MEMORY_LIMIT=1K");
  CHECK(limited.status == 2);
  CHECK(limited.err.find("available (ATTNLAB_MEMORY_LIMIT=1K)") != std::string::npos);
  CHECK(cli(tiny, dir, "ATTNLAB_MEMORY_LIMIT=none").status == 0);
  CHECK(cli(tiny, dir, "ATTNLAB_MEMORY_LIMIT=2G").status == 0);
  const Run nonsense = cli(tiny, dir, "ATTNLAB_MEMORY_LIMIT=lots");
  CHECK(nonsense.status == 2);
  CHECK(nonsense.err.find("ATTNLAB_MEMORY_LIMIT expected a size in bytes") != std::string::npos);
#if !defined(__SANITIZE_ADDRESS__) && !defined(__SANITIZE_THREAD__)  // they need the address space
  // Under ulimit -v the limit is what the address space leaves (the issue's 4 GB).
  const std::string cmd =
      "bash -c \"ulimit -v 4000000; '" + std::string(ATTNLAB_CLI_PATH) + "' " + big + "\"";
  const Run under = cli_command(cmd, dir);
  CHECK(under.status == 2);
  CHECK(under.err.find("ulimit -v") != std::string::npos);
  // Past the check (no limit), an allocation that fails says what and how much, exit 1.
  const Run oom = cli_command("bash -c \"ulimit -v 3000000; ATTNLAB_MEMORY_LIMIT=none '" +
                                  std::string(ATTNLAB_CLI_PATH) + "' " + big + "\"",
                              dir);
  CHECK(oom.status == 1);
  CHECK(oom.err.rfind("attnlab: error: train: out of memory: ", 0) == 0);
  CHECK(std::count(oom.err.begin(), oom.err.end(), '\n') == 1);
#endif
}

#endif  // ATTNLAB_CLI_PATH
