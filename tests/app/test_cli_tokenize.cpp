// attnlab tokenize and BPE runs, as a user runs them: tokenize train and encode, a short training
// run from the token directory that keeps its tokenizer, eval and generate decoding BPE, a saved
// and resumed run equal to the uninterrupted one, and the bad inputs (a truncated .bin, ids past
// the vocabulary, a model that is not one, data encoded with another tokenizer than the run's),
// each one line "attnlab: error: ..." with status 2. Without SentencePiece, the tokenizer cases are
// skipped and tokenize says what is missing.
#include <doctest/doctest.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>

#include <nlohmann/json.hpp>

#include "cli_runner.hpp"
#include "tokenizer_helpers.hpp"

#ifdef ATTNLAB_CLI_PATH

using namespace attnlab::test;

namespace {

std::string q(const fs::path& p) {
  return "'" + p.string() + "'";
}

const char* kTinyBpe =
    "--task text --block 16 --d-model 16 --heads 2 --causal --batch 8 --eval-size 16 "
    "--threads 1 --quiet --lr 0.01";

// tok.model and the token directory DIR/tokens from the excerpt (vocab: pieces).
fs::path tokens_dir(const fs::path& dir, int vocab = kTinyVocab,
                    const std::string& name = "tokens") {
  const fs::path model = dir / (name + ".model");
  REQUIRE(cli("tokenize train --data " + q(kHamletExcerpt) + " --vocab-size " +
                  std::to_string(vocab) + " --out " + q(model),
              dir)
              .status == 0);
  const Run r = cli("tokenize encode --model " + q(model) + " --data " + q(kHamletExcerpt) +
                        " --out " + q(dir / name),
                    dir);
  REQUIRE(r.status == 0);
  CHECK(r.out.find("MB/s") != std::string::npos);
  return dir / name;
}

}  // namespace

TEST_CASE(
    "cli tokenizer: --version names SentencePiece, and without it tokenize says what is missing") {
  const auto dir = scratch("tokenize_version");
  const Run v = cli("--version", dir);
  REQUIRE(v.status == 0);
  const bool built = attnlab::app::sentencepiece_built();
  CHECK(v.out.find(built ? "sentencepiece: built" : "sentencepiece: not built") !=
        std::string::npos);
  if (!built) {
    check_bad_input("tokenize train --data " + q(kHamletExcerpt) + " --out " + q(dir / "m.model"),
                    dir, "libsentencepiece-dev");
  }
}

TEST_CASE("cli tokenizer: tokenize, train from the token directory, eval and generate BPE text") {
  if (!sentencepiece_or_skip()) return;
  const auto dir = scratch("tokenize_run");
  const fs::path tokens = tokens_dir(dir);
  const nlohmann::json header = nlohmann::json::parse(slurp(tokens / "tokens.json"));
  CHECK(header["dtype"] == "uint16");
  CHECK(header["vocab_size"] == kTinyVocab);
  const fs::path run = dir / "run";
  const Run t = cli(std::string("train ") + kTinyBpe + " --data " + q(tokens) +
                        " --steps 30 --eval-every 15 --out " + q(run),
                    dir);
  REQUIRE(t.status == 0);
  CHECK(t.err.empty());
  // The run keeps its tokenizer and the tokenizer's hash.
  CHECK(slurp(run / "tokenizer.model") == slurp(dir / "tokens.model"));
  const nlohmann::json config = nlohmann::json::parse(slurp(run / "config.json"));
  CHECK(config["task"]["vocab"] == "bpe");
  CHECK(config["task"]["tokenizer_hash"] == header["tokenizer_fnv1a64"]);
  const auto rows = csv_rows(slurp(run / "metrics.csv"));
  REQUIRE(rows.size() >= 2);
  CHECK(std::stod(rows.back().at("eval_loss")) < std::stod(rows.front().at("eval_loss")));
  // eval reads val.bin, reports bits per byte (the same as the run's last row, which the eval set
  // equals) and shows decoded next tokens; generate decodes pieces back to text, the prompt first.
  const Run e = cli("eval --checkpoint " + q(run) + " --show 1", dir);
  REQUIRE(e.status == 0);
  char bpb[64];
  std::snprintf(bpb, sizeof bpb, "bits per byte %.4f", std::stod(rows.back().at("eval_bpb")));
  CHECK(e.out.find(bpb) != std::string::npos);
  CHECK(e.out.find("next tokens: ") != std::string::npos);
  CHECK(e.out.find("next chars") == std::string::npos);
  check_bad_input("eval --checkpoint " + q(run) + " --valid " + q(dir / "tokens.model"), dir,
                  "eval: valid_file expected none for a BPE run");
  const Run g = cli("generate --checkpoint " + q(run) + " --prompt 'To be' --tokens 20", dir);
  REQUIRE(g.status == 0);
  CHECK(g.out.rfind("To be", 0) == 0);
  // The run no longer needs the token directory's model: generate reads the run's copy.
  fs::remove(tokens / "tokenizer.model");
  CHECK(cli("generate --checkpoint " + q(run) + " --prompt 'To be' --tokens 5", dir).status == 0);
}

TEST_CASE("cli tokenizer: a BPE run saved and resumed follows the uninterrupted run exactly") {
  if (!sentencepiece_or_skip()) return;
  const auto dir = scratch("tokenize_resume");
  const fs::path tokens = tokens_dir(dir);
  const std::string common = std::string("train ") + kTinyBpe + " --data " + q(tokens) +
                             " --steps 20 --eval-every 5 --warmup 0";
  REQUIRE(cli(common + " --out " + q(dir / "full"), dir).status == 0);
  CHECK(cli(common + " --stop-after 10 --out " + q(dir / "split"), dir).status == 130);
  REQUIRE(cli("train --quiet --resume " + q(dir / "split") + " --threads 1", dir).status == 0);
  const std::string full = slurp(dir / "full" / "metrics.csv");
  CHECK(full.size() > 100);
  CHECK(full == slurp(dir / "split" / "metrics.csv"));
}

TEST_CASE("cli token file bad input: one line naming the file, status 2") {
  if (!sentencepiece_or_skip()) return;
  const auto dir = scratch("tokenize_bad");
  const fs::path tokens = tokens_dir(dir);
  const std::string train = std::string("train ") + kTinyBpe + " --steps 2 --out " + q(dir / "r");
  SUBCASE("a truncated train.bin") {
    const std::string bin = slurp(tokens / "train.bin");
    std::ofstream(tokens / "train.bin", std::ios::binary) << bin.substr(0, bin.size() - 1);
    check_bad_input(train + " --data " + q(tokens), dir,
                    (tokens / "train.bin").string() + ": " + std::to_string(bin.size() - 1) +
                        " bytes is not a whole number of uint16 ids");
  }
  SUBCASE("an id past the vocabulary") {
    std::string bin = slurp(tokens / "val.bin");
    bin[0] = static_cast<char>(0xFF), bin[1] = static_cast<char>(0x7F);
    std::ofstream(tokens / "val.bin", std::ios::binary) << bin;
    check_bad_input(train + " --data " + q(tokens), dir,
                    (tokens / "val.bin").string() + ": id 32767 at token 0 is outside");
  }
  SUBCASE("a model that is not one") {
    std::ofstream(dir / "fake.model") << "not a model";
    check_bad_input("tokenize encode --model " + q(dir / "fake.model") + " --data " +
                        q(kHamletExcerpt) + " --out " + q(dir / "t2"),
                    dir, (dir / "fake.model").string() + ": is not a SentencePiece model");
  }
  SUBCASE("--vocab byte on a token directory, --vocab bpe on a text file") {
    check_bad_input(train + " --data " + q(tokens) + " --vocab byte", dir,
                    "is a token directory of BPE ids");
    check_bad_input(train + " --data " + q(kHamletExcerpt) + " --vocab bpe", dir,
                    "--vocab bpe trains on a token directory");
  }
  SUBCASE("data encoded with another tokenizer than the run's") {
    const fs::path run = dir / "run";
    REQUIRE(cli(std::string("train ") + kTinyBpe + " --data " + q(tokens) + " --steps 2 --out " +
                    q(run),
                dir)
                .status == 0);
    // The run's token directory, encoded again with another tokenizer.
    const fs::path other = tokens_dir(dir, kTinyVocab + 16, "other");
    fs::remove_all(tokens);
    fs::rename(other, tokens);
    const Run r = cli("train --resume " + q(run) + " --steps 4", dir);
    CHECK(r.status == 2);
    CHECK(r.err.rfind("attnlab: error: " + (tokens / "tokens.json").string(), 0) == 0);
    CHECK(r.err.find((run / "tokenizer.model").string()) != std::string::npos);
    CHECK(std::count(r.err.begin(), r.err.end(), '\n') == 1);
    check_bad_input("eval --checkpoint " + q(run), dir, (run / "tokenizer.model").string());
  }
}

#endif
