#include "attnlab/app/text.hpp"

#include <algorithm>
#include <cstdio>
#include <fstream>
#include <iterator>
#include <sstream>
#include <unordered_set>

#include "attnlab/app/data_file.hpp"

namespace attnlab::app {

namespace {

[[noreturn]] void fail(const std::string& source, const std::string& what) {
  throw DataFileError(source + ": " + what);
}

std::string hex_code_point(char32_t c) {
  char buf[16];
  std::snprintf(buf, sizeof buf, "U+%04X", static_cast<unsigned>(c));
  return buf;
}

}  // namespace

namespace {

// The UTF-8 sequence at text[i] (i < size): its length with its code point in `c`, or 0 when it
// is not UTF-8 (a stray byte, a cut sequence, an overlong form, a UTF-16 surrogate or a code point
// past U+10FFFF). The one UTF-8 rule of the app.
std::size_t utf8_sequence(std::string_view text, std::size_t i, char32_t& c) {
  const auto b0 = static_cast<unsigned char>(text[i]);
  std::size_t n = 0;
  char32_t min = 0;
  if (b0 < 0x80) {
    c = b0;
    return 1;
  } else if ((b0 & 0xE0) == 0xC0) {
    n = 2, c = b0 & 0x1F, min = 0x80;
  } else if ((b0 & 0xF0) == 0xE0) {
    n = 3, c = b0 & 0x0F, min = 0x800;
  } else if ((b0 & 0xF8) == 0xF0) {
    n = 4, c = b0 & 0x07, min = 0x10000;
  } else {
    return 0;
  }
  if (i + n > text.size()) return 0;
  for (std::size_t k = 1; k < n; ++k) {
    const auto b = static_cast<unsigned char>(text[i + k]);
    if ((b & 0xC0) != 0x80) return 0;
    c = (c << 6) | (b & 0x3F);
  }
  if (c < min || (c >= 0xD800 && c <= 0xDFFF) || c > 0x10FFFF) return 0;
  return n;
}

}  // namespace

std::size_t first_invalid_utf8(std::string_view text) {
  char32_t c = 0;
  for (std::size_t i = 0, n = 0; i < text.size(); i += n)
    if ((n = utf8_sequence(text, i, c)) == 0) return i;
  return std::string_view::npos;
}

std::vector<char32_t> decode_utf8(std::string_view text, const std::string& source) {
  std::vector<char32_t> out;
  out.reserve(text.size());
  char32_t c = 0;
  for (std::size_t i = 0, n = 0; i < text.size(); i += n) {
    n = utf8_sequence(text, i, c);
    if (n == 0)
      fail(source, "invalid UTF-8 at byte offset " + std::to_string(i) +
                       " (for arbitrary files use the byte vocabulary: --vocab " +
                       std::string(enum_name(VocabKind::bytes)) + ")");
    out.push_back(c);
  }
  return out;
}

std::string encode_utf8(char32_t c) {
  std::string s;
  if (c < 0x80) {
    s += static_cast<char>(c);
  } else if (c < 0x800) {
    s += static_cast<char>(0xC0 | (c >> 6));
    s += static_cast<char>(0x80 | (c & 0x3F));
  } else if (c < 0x10000) {
    s += static_cast<char>(0xE0 | (c >> 12));
    s += static_cast<char>(0x80 | ((c >> 6) & 0x3F));
    s += static_cast<char>(0x80 | (c & 0x3F));
  } else {
    s += static_cast<char>(0xF0 | (c >> 18));
    s += static_cast<char>(0x80 | ((c >> 12) & 0x3F));
    s += static_cast<char>(0x80 | ((c >> 6) & 0x3F));
    s += static_cast<char>(0x80 | (c & 0x3F));
  }
  return s;
}

std::string char_vocabulary(std::string_view text, const std::string& source) {
  // The distinct code points in code point order: one pass with a seen-set, then a sort of the
  // few distinct ones (sorting every character of a 5 MB corpus took a second per run).
  std::vector<char32_t> chars;
  std::unordered_set<char32_t> seen;
  for (char32_t c : decode_utf8(text, source))
    if (seen.insert(c).second) chars.push_back(c);
  std::sort(chars.begin(), chars.end());
  std::string out;
  for (char32_t c : chars) out += encode_utf8(c);
  return out;
}

TextVocab::TextVocab(const TaskConfig& task) {
  if (task.vocab == VocabKind::bytes) {
    bytes_ = true;
    return;
  }
  if (task.vocab == VocabKind::bpe) {
    check_arg(!task.tokenizer.empty(), "task", "tokenizer",
              "the BPE model (a token directory's, from --data DIR)", "none");
    bpe_ = Tokenizer::load(task.tokenizer);
    if (!task.tokenizer_hash.empty() && bpe_->hash() != task.tokenizer_hash) {
      fail(task.tokenizer, "tokenizer hash " + bpe_->hash() + " differs from the expected " +
                               task.tokenizer_hash +
                               " (tokens.json's or the run's: the ids were made with another)");
    }
    return;
  }
  try {
    chars_ = decode_utf8(task.chars, "task.chars");
  } catch (const DataFileError& e) {
    check_arg(false, "task", "chars", "the vocabulary as UTF-8 text", e.what());
  }
  check_arg(!chars_.empty(), "task", "chars",
            "the characters of the text (built from --data when a run starts)", "none");
  check_arg(std::adjacent_find(chars_.begin(), chars_.end(),
                               [](char32_t a, char32_t b) { return a >= b; }) == chars_.end(),
            "task", "chars", "distinct characters in code point order", "'" + task.chars + "'");
}

std::size_t TextVocab::size() const {
  return bytes_ ? 256 : bpe_ ? bpe_->size() : chars_.size();
}

std::size_t TextVocab::token_bytes(int id) const {
  check_arg(id >= 0 && static_cast<std::size_t>(id) < size(), "TextVocab::token_bytes", "id",
            "in [0, " + std::to_string(size()) + ")", std::to_string(id));
  if (bytes_) return 1;
  if (bpe_) return bpe_->token_bytes(id);
  return encode_utf8(chars_[static_cast<std::size_t>(id)]).size();
}

std::vector<int> TextVocab::encode(std::string_view text, const std::string& source) const {
  std::vector<int> ids;
  if (bpe_) {
    decode_utf8(text, source);  // SentencePiece would replace invalid bytes
    return bpe_->encode(text);
  }
  if (bytes_) {
    ids.reserve(text.size());
    for (char c : text) ids.push_back(static_cast<unsigned char>(c));
    return ids;
  }
  const std::vector<char32_t> chars = decode_utf8(text, source);
  ids.reserve(chars.size());
  for (std::size_t i = 0; i < chars.size(); ++i) {
    const auto it = std::lower_bound(chars_.begin(), chars_.end(), chars[i]);
    if (it == chars_.end() || *it != chars[i]) {
      fail(source, "character '" + encode_utf8(chars[i]) + "' (" + hex_code_point(chars[i]) +
                       ") at character " + std::to_string(i) + " is not in the vocabulary of " +
                       std::to_string(chars_.size()) + " characters");
    }
    ids.push_back(static_cast<int>(it - chars_.begin()));
  }
  return ids;
}

std::string TextVocab::decode(int id) const {
  check_arg(id >= 0 && static_cast<std::size_t>(id) < size(), "TextVocab::decode", "id",
            "in [0, " + std::to_string(size()) + ")", std::to_string(id));
  if (bytes_) return std::string(1, static_cast<char>(id));
  if (bpe_) return bpe_->text(id);
  return encode_utf8(chars_[static_cast<std::size_t>(id)]);
}

std::vector<std::uint32_t> token_byte_table(const TaskConfig& task) {
  if (task.kind != TaskKind::text) return {};
  return token_byte_table(TextVocab(task));
}

std::vector<std::uint32_t> token_byte_table(const TextVocab& vocab) {
  std::vector<std::uint32_t> table;
  for (std::size_t id = 0; id < vocab.size(); ++id)
    table.push_back(static_cast<std::uint32_t>(vocab.token_bytes(static_cast<int>(id))));
  return table;
}

std::string read_text_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) fail(path, "cannot be read");
  std::ostringstream ss;
  ss << in.rdbuf();
  std::string text = ss.str();
  if (text.empty()) fail(path, "is empty (a text task needs text to learn from)");
  return text;
}

TextData split_text(const std::vector<int>& tokens, std::size_t block, const std::string& source) {
  const std::size_t n = tokens.size(), n_train = n - n / 10;
  TextData d;
  d.train.assign(tokens.begin(), tokens.begin() + static_cast<std::ptrdiff_t>(n_train));
  d.valid.assign(tokens.begin() + static_cast<std::ptrdiff_t>(n_train), tokens.end());
  if (d.valid.size() < block + 1) {
    fail(source,
         std::to_string(n) + " tokens is too short for blocks of " + std::to_string(block) +
             ": its last 10% (validation) must hold block + 1 = " + std::to_string(block + 1) +
             " tokens, so at least " + std::to_string(10 * (block + 1)) +
             " tokens in all (or use a smaller --block)");
  }
  return d;
}

namespace {
Batch blocks_at(const std::vector<int>& tokens, std::size_t block,
                const std::vector<std::size_t>& offsets) {
  Batch out;
  out.fields.push_back(TokenIds::from_shape({offsets.size(), block}));
  out.targets = TokenIds::from_shape({offsets.size(), block});
  for (std::size_t b = 0; b < offsets.size(); ++b) {
    const int* x = tokens.data() + offsets[b];
    std::copy(x, x + block, &out.fields[0](b, 0));
    std::copy(x + 1, x + block + 1, &out.targets(b, 0));
  }
  return out;
}
}  // namespace

DocumentBounds find_documents(const std::vector<int>& tokens, const std::vector<int>& delimiter) {
  check_arg(!delimiter.empty(), "find_documents", "delimiter", "at least one token", "none");
  DocumentBounds d;
  d.starts.push_back(0);
  d.delimiter_length = delimiter.size();
  for (auto at = tokens.begin();
       (at = std::search(at, tokens.end(), delimiter.begin(), delimiter.end())) != tokens.end();
       at += static_cast<std::ptrdiff_t>(delimiter.size())) {
    const auto o = static_cast<std::uint64_t>(at - tokens.begin());
    d.delimiters.push_back(o);
    if (o + delimiter.size() < tokens.size()) d.starts.push_back(o + delimiter.size());
  }
  return d;
}

void pack_documents(Batch& batch, const DocumentBounds& docs,
                    const std::vector<std::size_t>& offsets) {
  const std::size_t B = batch.size(), T = batch.length();
  check_arg(offsets.size() == B, "pack_documents", "offsets",
            "one per row (" + std::to_string(B) + ")", std::to_string(offsets.size()));
  batch.documents = TokenIds::from_shape({B, T});
  batch.restart_positions = docs.restart_positions;
  const auto& starts = docs.starts;
  const auto& delims = docs.delimiters;
  for (std::size_t b = 0; b < B; ++b) {
    const std::uint64_t o = offsets[b];
    // The first document start after o, and the last delimiter at or before o.
    auto next = std::upper_bound(starts.begin(), starts.end(), o);
    auto delim = std::upper_bound(delims.begin(), delims.end(), o);
    int id = 0;
    for (std::size_t t = 0; t < T; ++t) {
      const std::uint64_t at = o + t;
      while (next != starts.end() && *next <= at) ++next, ++id;
      while (delim != delims.end() && *delim <= at) ++delim;
      batch.documents(b, t) = id;
      const bool ends = next != starts.end() && *next == at + 1;
      const bool in_delimiter =
          delim != delims.begin() && at < *std::prev(delim) + docs.delimiter_length;
      if (ends || in_delimiter) batch.targets(b, t) = kIgnoreIndex;
    }
  }
}

namespace {

void check_stream(std::size_t tokens, std::size_t block, const char* op) {
  check_arg(tokens > block, op, "tokens", "at least block + 1 = " + std::to_string(block + 1),
            std::to_string(tokens));
}

}  // namespace

std::vector<std::size_t> random_offsets(std::size_t tokens, std::size_t block, std::size_t batch,
                                        Rng& rng, const char* op) {
  check_stream(tokens, block, op);
  std::vector<std::size_t> offsets(batch);
  for (auto& o : offsets) o = static_cast<std::size_t>(rng.below(tokens - block));
  return offsets;
}

std::vector<std::size_t> spread_offsets(std::size_t tokens, std::size_t block, std::size_t n,
                                        const char* op) {
  check_stream(tokens, block, op);
  const std::size_t last = tokens - block - 1;  // the largest offset
  n = std::min(n, last + 1);
  std::vector<std::size_t> offsets(n);
  for (std::size_t i = 0; i < n; ++i) offsets[i] = n == 1 ? 0 : i * last / (n - 1);
  return offsets;
}

Batch text_batch(const std::vector<int>& tokens, std::size_t block, std::size_t batch, Rng& rng,
                 const DocumentBounds* docs) {
  const auto offsets = random_offsets(tokens.size(), block, batch, rng, "text_batch");
  Batch out = blocks_at(tokens, block, offsets);
  if (docs) pack_documents(out, *docs, offsets);
  return out;
}

Batch text_eval_batch(const std::vector<int>& tokens, std::size_t block, std::size_t n,
                      const DocumentBounds* docs) {
  const auto offsets = spread_offsets(tokens.size(), block, n, "text_eval_batch");
  Batch out = blocks_at(tokens, block, offsets);
  if (docs) pack_documents(out, *docs, offsets);
  return out;
}

}  // namespace attnlab::app
