// The committed fuzz seeds (tests/fuzz/corpus) run through the readers in every normal test run,
// without clang: each file is accepted or refused with the reader's error (naming the file), as
// listed here, never a crash. An input that once crashed a fuzz target belongs in
// tests/data/fuzz-regressions/ with a test case below that replays it (none so far: see the README
// there).
#include <doctest/doctest.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <map>
#include <string>
#include <vector>

#include <xtensor/xbuilder.hpp>

#include "attnlab/app/data_file.hpp"
#include "attnlab/app/run_config.hpp"
#include "attnlab/app/study.hpp"
#include "attnlab/app/token_file.hpp"
#include "attnlab/io/checkpoint.hpp"
#include "helpers.hpp"
#include "tokenizer_helpers.hpp"

using namespace attnlab;

namespace {

std::vector<std::filesystem::path> files_in(const std::string& dir) {
  std::vector<std::filesystem::path> out;
  for (const auto& e : std::filesystem::directory_iterator(dir)) {
    if (e.is_regular_file() && e.path().extension() != ".md") out.push_back(e.path());
  }
  std::sort(out.begin(), out.end());
  return out;
}

// The fuzz target's model (tests/fuzz/fuzz_checkpoint.cpp): true if the file loads.
bool loads_into_fuzz_model(const std::string& path) {
  Parameter<float> w{xt::zeros<float>({3, 4}), xt::zeros<float>({3, 4})};
  Parameter<float> b{xt::zeros<float>({4}), xt::zeros<float>({4})};
  TensorList<float> optim;
  try {
    load_checkpoint<float>(path, {{"layer.w", &w}, {"layer.b", &b}}, &optim);
    return true;
  } catch (const CheckpointError& e) {
    CHECK(std::string(e.what()).rfind(path + ": ", 0) == 0);
    return false;
  }
}

bool reads_as_data_file(const std::string& path) {
  try {
    app::read_data_file(path);
    return true;
  } catch (const app::DataFileError& e) {
    CHECK(std::string(e.what()).rfind(path + ":", 0) == 0);
    return false;
  }
}

bool parses(const std::string& path) {
  try {
    load_safetensors(path);
    return true;
  } catch (const CheckpointError& e) {
    CHECK(std::string(e.what()).rfind(path + ": ", 0) == 0);
    return false;
  }
}

}  // namespace

TEST_CASE("fuzz seeds: the safetensors seeds load or are refused as expected") {
  const std::map<std::string, bool> expected = {
      {"all_dtypes", true},  {"metadata_only", true},   {"one_tensor", true}, {"overlap", false},
      {"huge_shape", false}, {"length_too_big", false}, {"truncated", false}};
  const auto files = files_in(test::data_path("../fuzz/corpus/safetensors"));
  CHECK(files.size() == expected.size());
  for (const auto& f : files) {
    CAPTURE(f.string());
    REQUIRE(expected.count(f.filename().string()) == 1);
    CHECK(parses(f.string()) == expected.at(f.filename().string()));
  }
}

TEST_CASE("fuzz seeds: the checkpoint seeds load or are refused as expected") {
  const std::map<std::string, bool> expected = {
      {"valid", true}, {"valid_optim", true},  {"wrong_shape", false}, {"double", false},
      {"nan", false},  {"bad_version", false}, {"extra", false}};
  const auto files = files_in(test::data_path("../fuzz/corpus/checkpoint"));
  CHECK(files.size() == expected.size());
  for (const auto& f : files) {
    CAPTURE(f.string());
    REQUIRE(expected.count(f.filename().string()) == 1);
    CHECK(loads_into_fuzz_model(f.string()) == expected.at(f.filename().string()));
  }
}

TEST_CASE("fuzz seeds: the data-file seeds are read or refused as expected") {
  const std::map<std::string, bool> expected = {
      {"recall", true},          {"sort_crlf", true},       {"comments", true},
      {"count_mismatch", false}, {"field_mismatch", false}, {"not_a_number", false},
      {"no_bar", false},         {"overflow", false},       {"bad_utf8", false},
      {"empty", false}};
  const auto files = files_in(test::data_path("../fuzz/corpus/data_file"));
  CHECK(files.size() == expected.size());
  for (const auto& f : files) {
    CAPTURE(f.string());
    REQUIRE(expected.count(f.filename().string()) == 1);
    CHECK(reads_as_data_file(f.string()) == expected.at(f.filename().string()));
  }
}

TEST_CASE("fuzz seeds: the token header seeds are read or refused as expected") {
  const std::map<std::string, bool> expected = {{"valid", true},
                                                {"dtype_too_small", false},
                                                {"documents_unsorted", false},
                                                {"document_past_end", false},
                                                {"model_outside", false},
                                                {"truncated", false},
                                                {"negative_count", false}};
  const auto files = files_in(test::data_path("../fuzz/corpus/token_header"));
  CHECK(files.size() == expected.size());
  for (const auto& f : files) {
    CAPTURE(f.string());
    REQUIRE(expected.count(f.filename().string()) == 1);
    std::ifstream in(f, std::ios::binary);
    const std::string text{std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
    bool read = true;
    try {
      app::parse_token_header(text, f.string());
    } catch (const app::DataFileError& e) {
      CHECK(std::string(e.what()).rfind(f.string() + ": ", 0) == 0);
      read = false;
    }
    CHECK(read == expected.at(f.filename().string()));
  }
}

TEST_CASE("fuzz regressions: a tokenizer model with a zero-length piece is refused by name") {
  // fuzz_tokenizer_model's first find: SentencePiece's loader threw its own exception (from its
  // double-array trie) instead of returning a status.
  if (!test::sentencepiece_or_skip()) return;
  const std::string path = test::data_path("fuzz-regressions/tokenizer_model-zero-length-piece");
  const std::string want = path + ": is not a SentencePiece model";
  CHECK_THROWS_WITH_AS(app::Tokenizer::load(path), doctest::Contains(want.c_str()),
                       app::DataFileError);
}

namespace {

std::string text_of(const std::filesystem::path& p) {
  std::ifstream in(p, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

}  // namespace

TEST_CASE("fuzz seeds: the config readers' seeds are accepted, validated and estimated") {
  // tests/fuzz/fuzz_run_config.cpp's checks on its seeds: read, read back from what was written,
  // validated, a finite memory estimate.
  const auto runs = files_in(test::data_path("../fuzz/corpus/run_config"));
  CHECK(runs.size() == 5);
  for (const auto& f : runs) {
    CAPTURE(f.string());
    app::TrainConfig c, back;
    REQUIRE_NOTHROW(app::read_json_text(text_of(f), c));
    const std::string written = app::to_json_text(c);
    app::read_json_text(written, back);
    CHECK(app::to_json_text(back) == written);
    CHECK_NOTHROW(app::validate(c));
    CHECK(app::estimate_memory(c).total() > 0);
  }
  const auto plans = files_in(test::data_path("../fuzz/corpus/study_config"));
  CHECK(plans.size() == 1);
  for (const auto& f : plans) {
    app::StudyPlan plan;
    REQUIRE_NOTHROW(app::read_study_text(text_of(f), plan));
    CHECK(plan.groups.size() >= 1);
  }
  // fuzz_checkpoint_meta's seed describes the tensors that target holds; one layer more does not.
  const auto metas = files_in(test::data_path("../fuzz/corpus/checkpoint_meta"));
  REQUIRE(metas.size() == 1);
  app::TrainConfig seed;
  app::read_json_text(text_of(metas[0]), seed);
  app::RunMeta meta;
  meta.config_json = text_of(metas[0]);
  for (const ParameterShape& p :
       transformer_parameter_shapes(app::resolve_model(seed.model, app::task_shape(seed.task))))
    meta.model_tensors.emplace_back(p.name, p.shape);
  app::TrainConfig c;
  CHECK_NOTHROW(app::read_saved_config(meta, "seed.safetensors", c));
  meta.model_tensors.pop_back();
  app::TrainConfig d;
  CHECK_THROWS_WITH_AS(app::read_saved_config(meta, "seed.safetensors", d),
                       doctest::Contains("disagrees with the file's tensors"),
                       std::invalid_argument);
}
