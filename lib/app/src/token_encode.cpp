// attnlab tokenize encode: text files -> a token directory (attnlab/app/token_file.hpp).
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <tuple>
#include <unordered_map>

#include "attnlab/app/data_file.hpp"
#include "attnlab/app/text.hpp"
#include "attnlab/app/token_file.hpp"
#include "attnlab/app/tokenizer.hpp"
#include "attnlab/io/safetensors.hpp"

namespace attnlab::app {

namespace {

[[noreturn]] void fail(const std::string& source, const std::string& what) {
  throw DataFileError(source + ": " + what);
}

// SentencePiece's encoding of a text, word by word with a cache. Exact: the models of attnlab
// tokenize train split pieces at spaces (split_by_whitespace) and never hold a newline, so no
// merge crosses the start of a word (a space) or a newline, and each word encodes alone as it
// does in its line (tested against Tokenizer::encode).
class CachedEncoder {
 public:
  explicit CachedEncoder(const Tokenizer& tokenizer) : tokenizer_(tokenizer) {}
  void encode(std::string_view text, std::vector<std::uint32_t>& out) {
    std::size_t begin = 0;
    while (begin < text.size()) {
      std::size_t end = begin + 1;
      if (text[begin] != '\n') {
        while (end < text.size() && text[end] != ' ' && text[end] != '\n') ++end;
      }
      word(text.substr(begin, end - begin), out);
      begin = end;
    }
  }

 private:
  struct Hash {
    using is_transparent = void;
    std::size_t operator()(std::string_view s) const { return std::hash<std::string_view>{}(s); }
  };
  void word(std::string_view w, std::vector<std::uint32_t>& out) {
    auto it = cache_.find(w);
    if (it == cache_.end()) {
      if (cache_.size() >= kMaxWords) cache_.clear();  // bounded memory on any corpus
      std::vector<std::uint32_t> ids;
      for (int id : tokenizer_.encode(w)) ids.push_back(static_cast<std::uint32_t>(id));
      it = cache_.emplace(std::string(w), std::move(ids)).first;
    }
    out.insert(out.end(), it->second.begin(), it->second.end());
  }
  static constexpr std::size_t kMaxWords = std::size_t{1} << 20;
  const Tokenizer& tokenizer_;
  std::unordered_map<std::string, std::vector<std::uint32_t>, Hash, std::equal_to<>> cache_;
};

// A file written in pieces to a temporary beside `path`, renamed over it by commit().
class StreamingFile {
 public:
  explicit StreamingFile(std::string path) : path_(std::move(path)) {
    const auto p = std::filesystem::path(path_);
    tmp_ = (p.parent_path() / ("." + p.filename().string() + ".tmp")).string();
    file_ = std::fopen(tmp_.c_str(), "wb");
    if (!file_) fail(path_, "cannot be written");
  }
  ~StreamingFile() {
    if (file_) std::fclose(file_);
    if (!committed_) std::remove(tmp_.c_str());
  }
  void write(const void* data, std::size_t bytes) {
    if (bytes && std::fwrite(data, 1, bytes, file_) != bytes) fail(path_, "cannot be written");
  }
  void commit() {
    const bool ok = std::fflush(file_) == 0 && ::fsync(::fileno(file_)) == 0;
    std::fclose(file_);
    file_ = nullptr;
    if (!ok || std::rename(tmp_.c_str(), path_.c_str()) != 0) fail(path_, "cannot be written");
    committed_ = true;
  }
  const std::string& tmp() const { return tmp_; }

 private:
  std::string path_, tmp_;
  std::FILE* file_ = nullptr;
  bool committed_ = false;
};

// Reads text files in blocks and hands the encoder whole lines (or, in a line longer than a block,
// text up to a space), cut at the document delimiter.
class DocumentReader {
 public:
  static constexpr std::size_t kBlock = std::size_t{1} << 20;
  explicit DocumentReader(std::string delimiter) : delimiter_(std::move(delimiter)) {}
  // Calls text(piece) for each piece and new_document() at each document start.
  template <class Text, class NewDocument>
  void read(const std::string& path, Text&& text, NewDocument&& new_document) {
    std::ifstream in(path, std::ios::binary);
    if (!in) fail(path, "cannot be read");
    std::string buf;
    std::size_t pos = 0, consumed = 0;
    bool eof = false;
    const auto emit = [&](std::size_t n) {
      const std::string_view piece(buf.data() + pos, n);
      if (const std::size_t bad = first_invalid_utf8(piece); bad != std::string_view::npos)
        fail(path, "invalid UTF-8 at byte offset " + std::to_string(consumed + pos + bad));
      if (n) text(piece);
    };
    new_document();
    const std::size_t dl = delimiter_.size();
    while (true) {
      const std::string_view rest(buf.data() + pos, buf.size() - pos);
      const std::size_t nl = rest.find('\n');
      const std::size_t d = dl ? rest.find(delimiter_) : std::string_view::npos;
      if (d != std::string_view::npos && (nl == std::string_view::npos || d <= nl)) {
        emit(d);
        pos += d + dl;
        new_document();
      } else if (nl != std::string_view::npos && (eof || nl + dl <= rest.size())) {
        emit(nl + 1);
        pos += nl + 1;
      } else if (eof) {
        emit(rest.size());
        return;
      } else if (rest.size() > kBlock) {  // a long line: up to its last space
        const std::size_t cut = rest.rfind(' ', rest.size() - dl - 1);
        const std::size_t n = cut == std::string_view::npos || cut == 0 ? rest.size() - dl : cut;
        emit(n);
        pos += n;
      } else {
        consumed += pos;
        buf.erase(0, pos);
        pos = 0;
        const std::size_t old = buf.size();
        buf.resize(old + kBlock);
        in.read(buf.data() + old, static_cast<std::streamsize>(kBlock));
        buf.resize(old + static_cast<std::size_t>(in.gcount()));
        eof = in.gcount() == 0;
      }
    }
  }

 private:
  std::string delimiter_;
};

}  // namespace

EncodeReport encode_token_files(const EncodeOptions& o) {
  const char* op = "tokenize encode";
  check_arg(!o.files.empty(), op, "--data", "at least one text file", "none");
  check_arg(!o.out.empty(), op, "--out", "the token directory to write", "none");
  const auto t0 = std::chrono::steady_clock::now();
  const Tokenizer tokenizer = Tokenizer::load(o.model);
  std::filesystem::create_directories(o.out);
  const auto path = [&](const char* name) {
    return (std::filesystem::path(o.out) / name).string();
  };

  // Pass 1: every token, as uint32, into a temporary; the document starts in memory.
  EncodeReport r;
  std::vector<std::uint64_t> starts;
  std::uint64_t n = 0;
  bool document_pending = false;
  {
    StreamingFile all(path(".all-tokens"));
    CachedEncoder encoder(tokenizer);
    std::vector<std::uint32_t> ids;
    const auto flush = [&] {
      all.write(ids.data(), ids.size() * sizeof(std::uint32_t));
      n += ids.size();
      ids.clear();
    };
    DocumentReader reader(o.doc_delimiter);
    for (const std::string& file : o.files) {
      reader.read(
          file,
          [&](std::string_view text) {
            r.text_bytes += text.size();
            const std::size_t before = ids.size();
            encoder.encode(text, ids);
            if (document_pending && ids.size() > before) {
              starts.push_back(n + before);
              document_pending = false;
            }
            if (ids.size() >= (std::size_t{1} << 20)) flush();
          },
          [&] { document_pending = true; });
    }
    flush();
    all.commit();
  }
  const std::string all_path = path(".all-tokens");
  struct Remove {
    std::string p;
    ~Remove() { std::remove(p.c_str()); }
  } remove_all{all_path};
  if (n == 0) fail(o.files.front(), "no text to encode");

  // Pass 2: the split, in the header's dtype.
  TokenHeader& h = r.header;
  h.dtype_bytes = tokenizer.size() <= 65536 ? 2 : 4;
  h.vocab_size = tokenizer.size();
  h.tokenizer_hash = tokenizer.hash();
  h.tokenizer_model = kTokenizerModel;
  const std::uint64_t n_train = n - n / 10;
  h.train.tokens = n_train;
  h.val.tokens = n - n_train;
  h.val.documents.push_back(0);
  for (std::uint64_t s : starts) {
    if (s < n_train)
      h.train.documents.push_back(s);
    else if (s > n_train)
      h.val.documents.push_back(s - n_train);
  }
  if (h.val.tokens == 0) h.val.documents.clear();
  {
    std::ifstream in(all_path, std::ios::binary);
    StreamingFile train(path(kTrainBin)), val(path(kValBin));
    std::vector<std::uint32_t> ids(std::size_t{1} << 20);
    std::vector<unsigned char> out;
    std::uint64_t at = 0;
    while (in.read(reinterpret_cast<char*>(ids.data()),
                   static_cast<std::streamsize>(ids.size() * sizeof(std::uint32_t))) ||
           in.gcount() > 0) {
      const auto got = static_cast<std::size_t>(in.gcount()) / sizeof(std::uint32_t);
      // The ids before n_train go to train.bin, the rest to val.bin.
      const auto to_train =
          static_cast<std::size_t>(std::min<std::uint64_t>(got, n_train > at ? n_train - at : 0));
      for (const auto& [begin, end, part, file] :
           {std::tuple{std::size_t{0}, to_train, &h.train, &train},
            std::tuple{to_train, got, &h.val, &val}}) {
        out.clear();
        for (std::size_t i = begin; i < end; ++i) {
          const std::uint32_t id = ids[i];
          part->bytes += tokenizer.token_bytes(static_cast<int>(id));
          for (int k = 0; k < h.dtype_bytes; ++k)
            out.push_back(static_cast<unsigned char>(id >> (8 * k)));
        }
        file->write(out.data(), out.size());
      }
      at += got;
    }
    train.commit();
    val.commit();
  }
  write_file_atomic(path(kTokenizerModel), tokenizer.bytes());
  write_file_atomic(path(kTokensJson), token_header_json(h));  // last: the directory is complete
  r.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return r;
}

}  // namespace attnlab::app
