// tokens.json, the header of a token directory (attnlab/app/token_file.hpp).
#include <algorithm>
#include <filesystem>
#include <fstream>
#include <limits>
#include <sstream>

#include <nlohmann/json.hpp>

#include "attnlab/app/data_file.hpp"
#include "attnlab/app/token_file.hpp"

namespace attnlab::app {

namespace {

using json = nlohmann::json;

[[noreturn]] void fail(const std::string& source, const std::string& what) {
  throw DataFileError(source + ": " + what);
}

// A non-negative JSON integer (of at most `max`) at j[key], named in the error.
std::uint64_t count_at(const json& j, const char* key, const std::string& where,
                       const std::string& source,
                       std::uint64_t max = std::numeric_limits<std::uint64_t>::max()) {
  const auto it = j.find(key);
  if (it == j.end() || !it->is_number_integer() || (it->is_number_integer() && *it < 0) ||
      it->get<std::uint64_t>() > max) {
    fail(source, where + key + ": expected an integer in [0, " + std::to_string(max) + "], got " +
                     (it == j.end() ? std::string("nothing") : it->dump()));
  }
  return it->get<std::uint64_t>();
}

std::string string_at(const json& j, const char* key, const std::string& source) {
  const auto it = j.find(key);
  if (it == j.end() || !it->is_string())
    fail(source, std::string(key) + ": expected a string, got " +
                     (it == j.end() ? std::string("nothing") : it->dump()));
  return it->get<std::string>();
}

void check_keys(const json& j, std::initializer_list<const char*> keys, const std::string& where,
                const std::string& source) {
  for (auto it = j.begin(); it != j.end(); ++it) {
    const std::string& key = it.key();
    if (std::none_of(keys.begin(), keys.end(), [&](const char* k) { return key == k; }))
      fail(source, where + "unknown key '" + key + "'");
  }
}

TokenPart read_part(const json& j, const char* file, const std::string& source) {
  const std::string where = std::string("files.") + file;
  const auto it = j.at("files").find(file);
  if (it == j.at("files").end() || !it->is_object()) fail(source, where + ": expected an object");
  check_keys(*it, {"tokens", "bytes"}, where + ": ", source);
  TokenPart p;
  p.tokens = count_at(*it, "tokens", where + ".", source, std::uint64_t{1} << 48);
  p.bytes = count_at(*it, "bytes", where + ".", source);
  const auto docs = j.at("documents").find(file);
  const std::string dwhere = std::string("documents.") + file;
  if (docs == j.at("documents").end() || !docs->is_array())
    fail(source, dwhere + ": expected an array of document start offsets");
  if (docs->size() > std::max<std::uint64_t>(p.tokens, 1))
    fail(source, dwhere + ": " + std::to_string(docs->size()) + " documents in " +
                     std::to_string(p.tokens) + " tokens");
  p.documents.reserve(docs->size());
  for (const json& d : *docs) {
    if (!d.is_number_integer() || d < 0)
      fail(source, dwhere + ": expected non-negative integers, got " + d.dump());
    const auto at = d.get<std::uint64_t>();
    if (p.documents.empty() ? at != 0 : at <= p.documents.back())
      fail(source, dwhere + ": offsets must start at 0 and ascend, got " + d.dump() + " at entry " +
                       std::to_string(p.documents.size()));
    if (at >= p.tokens)
      fail(source, dwhere + ": offset " + d.dump() + " is past the file's " +
                       std::to_string(p.tokens) + " tokens");
    p.documents.push_back(at);
  }
  return p;
}

}  // namespace

TokenHeader parse_token_header(std::string_view text, const std::string& source) {
  json j;
  try {
    j = json::parse(text, nullptr, true, false);
  } catch (const json::exception& e) {
    fail(source, std::string("is not JSON (") + e.what() + ")");
  }
  if (!j.is_object()) fail(source, "expected a JSON object, got " + std::string(j.type_name()));
  check_keys(j,
             {"format", "version", "dtype", "vocab_size", "tokenizer", "tokenizer_fnv1a64",
              "tokenizer_model", "files", "documents"},
             "", source);
  if (string_at(j, "format", source) != "attnlab-tokens")
    fail(source, "format: expected \"attnlab-tokens\", got " + j["format"].dump());
  if (count_at(j, "version", "", source) != 1)
    fail(source, "version: expected 1, got " + j["version"].dump());
  TokenHeader h;
  const std::string dtype = string_at(j, "dtype", source);
  if (dtype != "uint16" && dtype != "uint32")
    fail(source, "dtype: expected \"uint16\" or \"uint32\", got \"" + dtype + "\"");
  h.dtype_bytes = dtype == "uint16" ? 2 : 4;
  h.vocab_size = count_at(j, "vocab_size", "", source, std::uint64_t{1} << 31);
  if (h.vocab_size == 0) fail(source, "vocab_size: expected at least 1, got 0");
  if (h.dtype_bytes == 2 && h.vocab_size > 65536)
    fail(source, "dtype: uint16 cannot hold the ids of a vocabulary of " +
                     std::to_string(h.vocab_size) + " (uint32 can)");
  if (string_at(j, "tokenizer", source) != "bpe")
    fail(source, "tokenizer: expected \"bpe\", got " + j["tokenizer"].dump());
  h.tokenizer_hash = string_at(j, "tokenizer_fnv1a64", source);
  if (h.tokenizer_hash.size() != 16 ||
      h.tokenizer_hash.find_first_not_of("0123456789abcdef") != std::string::npos)
    fail(source, "tokenizer_fnv1a64: expected 16 lowercase hex digits, got " +
                     j["tokenizer_fnv1a64"].dump());
  h.tokenizer_model = string_at(j, "tokenizer_model", source);
  if (h.tokenizer_model.empty() || h.tokenizer_model == "." || h.tokenizer_model == ".." ||
      h.tokenizer_model.find('/') != std::string::npos ||
      h.tokenizer_model.find('\0') != std::string::npos)
    fail(source, "tokenizer_model: expected a file name in the directory, got " +
                     j["tokenizer_model"].dump());
  for (const char* key : {"files", "documents"}) {
    if (!j.contains(key) || !j[key].is_object())
      fail(source, std::string(key) + ": expected an object");
    check_keys(j[key], {kTrainBin, kValBin}, std::string(key) + ": ", source);
  }
  h.train = read_part(j, kTrainBin, source);
  h.val = read_part(j, kValBin, source);
  return h;
}

std::string token_header_json(const TokenHeader& h) {
  json j;
  j["format"] = "attnlab-tokens";
  j["version"] = 1;
  j["dtype"] = h.dtype_bytes == 2 ? "uint16" : "uint32";
  j["vocab_size"] = h.vocab_size;
  j["tokenizer"] = "bpe";
  j["tokenizer_fnv1a64"] = h.tokenizer_hash;
  j["tokenizer_model"] = h.tokenizer_model;
  for (const char* file : {kTrainBin, kValBin}) {
    const TokenPart& p = h.part(file);
    j["files"][file] = {{"tokens", p.tokens}, {"bytes", p.bytes}};
    j["documents"][file] = p.documents;
  }
  return j.dump(1) + "\n";
}

TokenHeader read_token_header(const std::string& dir) {
  const std::string path = (std::filesystem::path(dir) / kTokensJson).string();
  std::ifstream in(path, std::ios::binary);
  if (!in)
    fail(path, "cannot be read (a token directory holds tokens.json: attnlab tokenize encode)");
  std::ostringstream ss;
  ss << in.rdbuf();
  return parse_token_header(ss.str(), path);
}

}  // namespace attnlab::app
