// The BPE tokenizer and token directories (attnlab/app/tokenizer.hpp, token_file.hpp): training is
// deterministic and any UTF-8 text round-trips; token_bytes of the three vocabularies; encode's
// 90/10 split, byte counts and document starts, and its word cache against SentencePiece's own
// encoding; the token file's batches against the text task's; and the bad inputs (ids past the
// vocabulary, truncated files, headers that lie, a model that is not one), each refused with the
// file named. Cases that need SentencePiece are skipped in a build without it.
#include <doctest/doctest.h>

#include <filesystem>
#include <fstream>
#include <functional>
#include <sstream>
#include <string>

#include <nlohmann/json.hpp>

#include "attnlab/app/data_file.hpp"
#include "attnlab/app/text.hpp"
#include "attnlab/app/token_file.hpp"
#include "attnlab/app/tokenizer.hpp"
#include "temp_dir.hpp"
#include "tokenizer_helpers.hpp"

using namespace attnlab;
using namespace attnlab::app;
namespace fs = std::filesystem;

namespace {

std::string read_all(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  std::ostringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

void write(const fs::path& p, const std::string& bytes) {
  std::ofstream(p, std::ios::binary) << bytes;
}

// The DataFileError message of f, or "(no DataFileError)".
std::string data_error(const std::function<void()>& f) {
  try {
    f();
  } catch (const DataFileError& e) {
    return e.what();
  }
  return "(no DataFileError)";
}

std::vector<int> ids_of(const TokenFile& f) {
  std::vector<int> out;
  for (std::size_t i = 0; i < f.size(); ++i) out.push_back(f[i]);
  return out;
}

std::string decode_all(const Tokenizer& t, const std::vector<int>& ids) {
  std::string s;
  for (int id : ids) s += t.text(id);
  return s;
}

}  // namespace

TEST_CASE("tokenizer: token_bytes of the char and byte vocabularies") {
  TaskConfig t;
  t.kind = TaskKind::text;
  t.chars = char_vocabulary("a\xC3\xA9\xE2\x82\xAC\xF0\x9D\x84\x9E", "t");  // a é € 𝄞
  const TextVocab chars(t);
  REQUIRE(chars.size() == 4);
  for (int id = 0; id < 4; ++id) CHECK(chars.token_bytes(id) == static_cast<std::size_t>(id + 1));
  t.vocab = VocabKind::bytes;
  const TextVocab bytes(t);
  for (int id : {0, 10, 255}) CHECK(bytes.token_bytes(id) == 1);
  CHECK_THROWS_AS(bytes.token_bytes(256), std::invalid_argument);
}

TEST_CASE("tokenizer: a tiny BPE trains deterministically and round-trips any UTF-8 text") {
  if (!test::sentencepiece_or_skip()) return;
  test::TempDir dir;
  const std::string a = test::tiny_tokenizer(dir.path());
  const std::string first = read_all(a);
  fs::remove(a);
  CHECK(read_all(test::tiny_tokenizer(dir.path())) == first);  // the same bytes again
  const Tokenizer t = Tokenizer::load(a);
  CHECK(t.size() == test::kTinyVocab);
  CHECK(t.hash() == fnv1a64_hex(first));
  CHECK(t.hash().size() == 16);
  const std::string excerpt = read_all(test::kHamletExcerpt);
  const std::vector<int> ids = t.encode(excerpt);
  CHECK(ids.size() < excerpt.size() * 3 / 4);  // the merges shorten the text
  CHECK(decode_all(t, ids) == excerpt);
  // Characters the excerpt never had, tabs, runs of spaces and newlines: byte fallback.
  const std::string odd = "  Zwölf\tBoxkämpfer €5 😀\n\n  jagen  Viktor\r\n";
  CHECK(decode_all(t, t.encode(odd)) == odd);
}

TEST_CASE("tokenizer: token_bytes of BPE pieces sums to the text's bytes") {
  if (!test::sentencepiece_or_skip()) return;
  test::TempDir dir;
  TaskConfig task;
  task.kind = TaskKind::text;
  task.vocab = VocabKind::bpe;
  task.tokenizer = test::tiny_tokenizer(dir.path());
  const TextVocab vocab(task);
  const Tokenizer t = Tokenizer::load(task.tokenizer);
  const std::string text = read_all(test::kHamletExcerpt) + " ünïcödé 😀\n";
  std::size_t sum = 0;
  for (int id : vocab.encode(text, "text")) sum += vocab.token_bytes(id);
  CHECK(sum == text.size());
  CHECK(vocab.token_bytes(0) == 0);  // <unk>
  int spaced = -1;
  for (int id = 0; id < static_cast<int>(t.size()); ++id) {
    if (t.text(id).size() > 1 && t.text(id)[0] == ' ') spaced = id;
    if (t.text(id) == "\n") CHECK(vocab.token_bytes(id) == 1);  // the byte piece <0x0A>
  }
  REQUIRE(spaced >= 0);  // "▁the" and the like: the ▁ counts one byte
  CHECK(vocab.token_bytes(spaced) == t.text(spaced).size());
  CHECK(vocab.decode(spaced) == t.text(spaced));
  // The run config's hash must be the model's.
  task.tokenizer_hash = "0123456789abcdef";
  const std::string m = data_error([&] { TextVocab{task}; });
  CHECK(m.find(task.tokenizer) == 0);
  CHECK(m.find("0123456789abcdef") != std::string::npos);
}

TEST_CASE(
    "token file: encode splits 90/10, counts bytes, records documents, equals SentencePiece") {
  if (!test::sentencepiece_or_skip()) return;
  test::TempDir dir;
  const std::string model = test::tiny_tokenizer(dir.path());
  const Tokenizer t = Tokenizer::load(model);
  const std::string excerpt = read_all(test::kHamletExcerpt);
  const std::string one = excerpt.substr(0, 5000), two = excerpt.substr(5000);
  write(dir.path() / "one.txt", one);
  write(dir.path() / "two.txt", two);
  const std::string out = (dir.path() / "tokens").string();
  const EncodeReport r = encode_token_files(
      {{(dir.path() / "one.txt").string(), (dir.path() / "two.txt").string()}, model, out, ""});
  const TokenHeader h = read_token_header(out);
  CHECK(h.dtype_bytes == 2);
  CHECK(h.vocab_size == test::kTinyVocab);
  CHECK(h.tokenizer_hash == t.hash());
  CHECK(read_all(fs::path(out) / "tokenizer.model") == read_all(model));
  // The word cache gives SentencePiece's own encoding of each whole file.
  std::vector<int> expect = t.encode(one);
  const std::uint64_t second = expect.size();
  for (int id : t.encode(two)) expect.push_back(id);
  const std::uint64_t n = expect.size();
  CHECK(h.train.tokens == n - n / 10);
  CHECK(h.val.tokens == n / 10);
  const TokenFile train(out, h, kTrainBin), val(out, h, kValBin);
  std::vector<int> got = ids_of(train);
  for (int id : ids_of(val)) got.push_back(id);
  CHECK(got == expect);
  CHECK(h.train.bytes + h.val.bytes == excerpt.size());
  CHECK(r.text_bytes == excerpt.size());
  CHECK(h.train.bytes == decode_all(t, ids_of(train)).size());
  // One document per file: the second starts in train.bin (it is 58% of the text).
  CHECK(train.documents() == std::vector<std::uint64_t>{0, second});
  CHECK(val.documents() == std::vector<std::uint64_t>{0});
  CHECK(fs::file_size(fs::path(out) / "train.bin") == 2 * h.train.tokens);
}

TEST_CASE("token file: --doc-delimiter starts a document after each delimiter, not encoded") {
  if (!test::sentencepiece_or_skip()) return;
  test::TempDir dir;
  const std::string model = test::tiny_tokenizer(dir.path());
  const Tokenizer t = Tokenizer::load(model);
  const std::string excerpt = read_all(test::kHamletExcerpt);
  const std::string a = excerpt.substr(0, 3000), b = excerpt.substr(3000, 3000),
                    c = excerpt.substr(6000);
  write(dir.path() / "docs.txt", a + "<|doc|>" + b + "<|doc|>" + c);
  const std::string out = (dir.path() / "tokens").string();
  encode_token_files({{(dir.path() / "docs.txt").string()}, model, out, "<|doc|>"});
  const TokenHeader h = read_token_header(out);
  const std::uint64_t na = t.encode(a).size(), nb = t.encode(b).size();
  CHECK(h.train.documents == std::vector<std::uint64_t>{0, na, na + nb});
  CHECK(h.train.bytes + h.val.bytes == excerpt.size());  // the delimiters are not text
}

TEST_CASE("token file: its batches are the text task's for the same ids and rng") {
  if (!test::sentencepiece_or_skip()) return;
  test::TempDir dir;
  const std::string model = test::tiny_tokenizer(dir.path());
  const std::string out = (dir.path() / "tokens").string();
  encode_token_files({{test::kHamletExcerpt}, model, out, ""});
  const TokenHeader h = read_token_header(out);
  const TokenFile train(out, h, kTrainBin);
  const std::vector<int> ids = ids_of(train);
  Rng r1(7), r2(7);
  for (int i = 0; i < 3; ++i) {
    const Batch x = token_batch(train, 16, 5, r1), y = text_batch(ids, 16, 5, r2);
    CHECK(x.fields[0] == y.fields[0]);
    CHECK(x.targets == y.targets);
  }
  const Batch e = token_eval_batch(train, 16, 9), f = text_eval_batch(ids, 16, 9);
  CHECK(e.fields[0] == f.fields[0]);
  CHECK(e.targets == f.targets);
}

TEST_CASE("token file bad input: ids past the vocabulary, truncated files, lying headers") {
  if (!test::sentencepiece_or_skip()) return;
  test::TempDir dir;
  const std::string model = test::tiny_tokenizer(dir.path());
  const fs::path out = dir.path() / "tokens";
  encode_token_files({{test::kHamletExcerpt}, model, out.string(), ""});
  const std::string header = read_all(out / "tokens.json"), bin = read_all(out / "val.bin");
  const std::string val = (out / "val.bin").string(), json_path = (out / "tokens.json").string();
  const auto open_val = [&] { TokenFile(out.string(), read_token_header(out.string()), kValBin); };
  SUBCASE("an id past vocab_size") {
    std::string bad = bin;
    bad[2] = static_cast<char>(0xFF), bad[3] = static_cast<char>(0xFF);  // id 65535 at token 1
    write(val, bad);
    const std::string m = data_error(open_val);
    CHECK(m.find(val + ": id 65535 at token 1 is outside the vocabulary of 384") == 0);
  }
  SUBCASE("a truncated .bin: an odd size, and fewer ids than the header says") {
    write(val, bin.substr(0, bin.size() - 1));
    CHECK(data_error(open_val).find(val + ": " + std::to_string(bin.size() - 1) +
                                    " bytes is not a whole number of uint16 ids") == 0);
    write(val, bin.substr(0, bin.size() - 2));
    CHECK(data_error(open_val).find("but tokens.json says " + std::to_string(bin.size() / 2)) !=
          std::string::npos);
  }
  SUBCASE("a header that lies about the dtype or the length") {
    nlohmann::json j = nlohmann::json::parse(header);
    j["dtype"] = "uint32";
    write(json_path, j.dump());
    CHECK(data_error(open_val).find(val + ": ") == 0);  // an odd size, or half as many ids
    j = nlohmann::json::parse(header);
    j["files"]["val.bin"]["tokens"] = j["files"]["val.bin"]["tokens"].get<int>() + 7;
    write(json_path, j.dump());
    CHECK(data_error(open_val).find("but tokens.json says") != std::string::npos);
    j = nlohmann::json::parse(header);
    j["dtype"] = "int8";
    write(json_path, j.dump());
    CHECK(data_error(open_val).find(json_path + ": dtype: expected") == 0);
    j = nlohmann::json::parse(header);
    j["documents"]["train.bin"] = {0, 5, 3};
    write(json_path, j.dump());
    CHECK(data_error(open_val).find(json_path + ": documents.train.bin: offsets must") == 0);
    j = nlohmann::json::parse(header);
    j["tokenizer_model"] = "../../etc/passwd";
    write(json_path, j.dump());
    CHECK(data_error(open_val).find(json_path + ": tokenizer_model:") == 0);
  }
  SUBCASE("a tokenizer model that is not one") {
    write(dir.path() / "not.model", header);
    const std::string path = (dir.path() / "not.model").string();
    CHECK(data_error([&] {
            Tokenizer::load(path);
          }).find(path + ": is not a SentencePiece model") == 0);
    CHECK(data_error([&] { Tokenizer::load(path + ".missing"); }).find("cannot be read") !=
          std::string::npos);
    CHECK(data_error([&] {
            encode_token_files({{test::kHamletExcerpt}, path, out.string(), ""});
          }).find(path + ": is not a SentencePiece model") == 0);
  }
  SUBCASE("text that is not UTF-8") {
    write(dir.path() / "bad.txt", "good line\nbad \xC3\x28 line\n");
    const std::string bad = (dir.path() / "bad.txt").string();
    CHECK(data_error([&] {
            encode_token_files({{bad}, model, out.string(), ""});
          }) == bad + ": invalid UTF-8 at byte offset 14");
  }
}

TEST_CASE("token file bad input: random mutations of a header and a model are refused by name") {
  if (!test::sentencepiece_or_skip()) return;
  // The fuzz targets (tests/fuzz/fuzz_token_header.cpp, fuzz_tokenizer_model.cpp) run millions of
  // inputs; here a fixed set of byte flips, cuts and splices, each one accepted or refused with
  // DataFileError naming the source, never a crash or another exception.
  // ATTNLAB_FUZZ_INPUTS sets the count of each.
  test::TempDir dir;
  const std::string model = test::tiny_tokenizer(dir.path());
  const fs::path out = dir.path() / "tokens";
  encode_token_files({{test::kHamletExcerpt}, model, out.string(), ""});
  const std::string header = read_all(out / "tokens.json"), model_bytes = read_all(model);
  const char* env = std::getenv("ATTNLAB_FUZZ_INPUTS");
  const long inputs = env ? std::atol(env) : 4000;
  Rng rng(11);
  const auto mutate = [&](std::string s) {
    const int edits = 1 + static_cast<int>(rng.below(4));
    for (int e = 0; e < edits && !s.empty(); ++e) {
      const auto at = static_cast<std::size_t>(rng.below(s.size()));
      switch (rng.below(4)) {
        case 0:
          s[at] = static_cast<char>(rng.below(256));
          break;
        case 1:
          s.erase(at, static_cast<std::size_t>(rng.below(16)) + 1);
          break;
        case 2:
          s.insert(at, s.substr(static_cast<std::size_t>(rng.below(s.size())), 8));
          break;
        default:
          s[at] = "0123456789-,:[]{}\"e."[rng.below(20)];
          break;
      }
    }
    return s;
  };
  long accepted_headers = 0, accepted_models = 0;
  for (long i = 0; i < inputs; ++i) {
    try {
      parse_token_header(mutate(header), "h");
      ++accepted_headers;
    } catch (const DataFileError& e) {
      REQUIRE(std::string(e.what()).rfind("h: ", 0) == 0);
    }
  }
  for (long i = 0; i < inputs; ++i) {
    try {
      const Tokenizer t = Tokenizer::from_bytes(mutate(model_bytes), "m");
      ++accepted_models;
      const std::vector<int> ids = t.encode("To be, or not to be");
      for (int id : ids) REQUIRE(static_cast<std::size_t>(id) < t.size());
    } catch (const DataFileError& e) {
      REQUIRE(std::string(e.what()).rfind("m: ", 0) == 0);
    }
  }
  MESSAGE(accepted_headers << " of " << inputs << " header mutations and " << accepted_models
                           << " of " << inputs << " model mutations accepted");
  CHECK(accepted_headers < inputs);
}
