#include "attnlab/app/tokenizer.hpp"

#include <cstdio>
#include <fstream>
#include <sstream>
#include <stdexcept>

#include "attnlab/app/data_file.hpp"
#include "attnlab/app/text.hpp"
#include "attnlab/io/safetensors.hpp"
#include "attnlab/tensor.hpp"

#ifdef ATTNLAB_WITH_SENTENCEPIECE
#include <sentencepiece_processor.h>
#include <sentencepiece_trainer.h>
#endif

namespace attnlab::app {

namespace {

[[noreturn]] void fail(const std::string& source, const std::string& what) {
  throw DataFileError(source + ": " + what);
}

std::string read_bytes(const std::string& path, const char* what) {
  std::ifstream in(path, std::ios::binary);
  if (!in) fail(path, std::string("cannot be read (") + what + ")");
  std::ostringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

}  // namespace

std::string sentencepiece_missing(std::string_view what) {
  return std::string(what) +
         " needs SentencePiece, and this attnlab was built without it: install Debian's "
         "libsentencepiece-dev (bash .ci/deps.sh) and configure again with "
         "-DATTNLAB_SENTENCEPIECE=ON";
}

std::string fnv1a64_hex(std::string_view bytes) {
  std::uint64_t h = 0xcbf29ce484222325ULL;
  for (char c : bytes) {
    h ^= static_cast<unsigned char>(c);
    h *= 0x100000001b3ULL;
  }
  char buf[17];
  std::snprintf(buf, sizeof buf, "%016llx", static_cast<unsigned long long>(h));
  return buf;
}

Tokenizer Tokenizer::load(const std::string& path) {
  if (!sentencepiece_built())
    throw std::invalid_argument(sentencepiece_missing(path + ": a BPE tokenizer"));
  return from_bytes(read_bytes(path, "a tokenizer model"), path);
}

#ifdef ATTNLAB_WITH_SENTENCEPIECE

bool sentencepiece_built() {
  return true;
}

namespace {

// The text a piece stands for (see Tokenizer::text).
std::string piece_text(const std::string& piece, bool is_byte, bool is_text) {
  if (is_byte) {
    unsigned value = 0;
    std::sscanf(piece.c_str(), "<0x%02X>", &value);
    return std::string(1, static_cast<char>(value));
  }
  if (!is_text) return {};
  static const std::string kSpace = "\xE2\x96\x81";  // U+2581, SentencePiece's space
  std::string out;
  for (std::size_t i = 0; i < piece.size();) {
    if (piece.compare(i, kSpace.size(), kSpace) == 0) {
      out += ' ';
      i += kSpace.size();
    } else {
      out += piece[i++];
    }
  }
  return out;
}

}  // namespace

struct Tokenizer::Impl {
  sentencepiece::SentencePieceProcessor sp;
  std::vector<std::string> texts;  // per id
};

Tokenizer Tokenizer::from_bytes(std::string_view model, const std::string& source) {
  auto impl = std::make_shared<Impl>();
  std::string problem;
  bool loaded = false;
  try {  // SentencePiece throws too, on some malformed models (a zero-length piece)
    const auto status = impl->sp.LoadFromSerializedProto(model);
    loaded = status.ok();
    problem = status.message();
  } catch (const std::exception& e) {
    problem = e.what();
  }
  if (!loaded)
    fail(source,
         "is not a SentencePiece model (" + problem + "; make one with attnlab tokenize train)");
  const int n = impl->sp.GetPieceSize();
  int byte_pieces = 0;
  impl->texts.reserve(static_cast<std::size_t>(n));
  for (int id = 0; id < n; ++id) {
    const bool is_byte = impl->sp.IsByte(id);
    byte_pieces += is_byte;
    const bool is_text = !is_byte && !impl->sp.IsControl(id) && !impl->sp.IsUnknown(id);
    impl->texts.push_back(piece_text(impl->sp.IdToPiece(id), is_byte, is_text));
  }
  if (byte_pieces != 256) {
    fail(source, "is a SentencePiece model without byte fallback (" + std::to_string(byte_pieces) +
                     " byte pieces, expected 256), which cannot encode every UTF-8 text: make one "
                     "with attnlab tokenize train");
  }
  Tokenizer t;
  t.impl_ = std::move(impl);
  t.model_ = std::string(model);
  t.hash_ = fnv1a64_hex(model);
  return t;
}

std::size_t Tokenizer::size() const {
  return impl_->texts.size();
}

std::vector<int> Tokenizer::encode(std::string_view text) const {
  std::vector<int> ids;
  const auto status = impl_->sp.Encode(text, &ids);
  if (!status.ok()) throw std::runtime_error("SentencePiece encode: " + status.ToString());
  return ids;
}

const std::string& Tokenizer::text(int id) const {
  if (id < 0 || static_cast<std::size_t>(id) >= size()) {  // the message only when it is needed
    check_arg(false, "Tokenizer::text", "id", "in [0, " + std::to_string(size()) + ")",
              std::to_string(id));
  }
  return impl_->texts[static_cast<std::size_t>(id)];
}

namespace {

// The non-empty lines of the files, in order, each checked as UTF-8.
class FileLines : public sentencepiece::SentenceIterator {
 public:
  explicit FileLines(const std::vector<std::string>& files) : files_(files) { Next(); }
  bool done() const override { return done_; }
  const std::string& value() const override { return line_; }
  sentencepiece::util::Status status() const override { return {}; }
  void Next() override {
    while (true) {
      if (in_.is_open() && std::getline(in_, line_)) {
        const std::size_t at = offset_;
        offset_ += line_.size() + 1;
        if (!line_.empty() && line_.back() == '\r') line_.pop_back();
        if (line_.empty()) continue;
        try {
          decode_utf8(line_, files_[file_ - 1]);
        } catch (const DataFileError&) {
          fail(files_[file_ - 1], "invalid UTF-8 in the line at byte offset " + std::to_string(at));
        }
        return;
      }
      if (file_ == files_.size()) {
        done_ = true;
        return;
      }
      in_ = std::ifstream(files_[file_], std::ios::binary);
      if (!in_) fail(files_[file_], "cannot be read");
      ++file_;
      offset_ = 0;
    }
  }

 private:
  const std::vector<std::string>& files_;
  std::size_t file_ = 0, offset_ = 0;
  std::ifstream in_;
  std::string line_;
  bool done_ = false;
};

}  // namespace

void train_tokenizer(const TokenizerTrainOptions& o) {
  const char* op = "tokenize train";
  check_arg(!o.files.empty(), op, "--data", "at least one text file", "none");
  check_arg(!o.out.empty(), op, "--out", "the model file to write", "none");
  FileLines lines(o.files);
  sentencepiece::SetRandomGeneratorSeed(1);
  std::string model;
  const auto status =
      sentencepiece::SentencePieceTrainer::Train({{"model_type", "bpe"},
                                                  {"vocab_size", std::to_string(o.vocab_size)},
                                                  {"byte_fallback", "true"},
                                                  {"character_coverage", "1.0"},
                                                  {"normalization_rule_name", "identity"},
                                                  {"remove_extra_whitespaces", "false"},
                                                  {"add_dummy_prefix", "false"},
                                                  {"split_by_whitespace", "true"},
                                                  {"bos_id", "-1"},
                                                  {"eos_id", "-1"},
                                                  {"num_threads", "1"},
                                                  {"input_sentence_size", "0"},
                                                  {"shuffle_input_sentence", "false"},
                                                  {"max_sentence_length", "1048576"},
                                                  {"minloglevel", "2"}},
                                                 &lines, &model);
  if (!status.ok()) {
    check_arg(false, op, "--vocab-size",
              "a vocabulary SentencePiece can learn from this text (its message: " +
                  std::string(status.message()) + ")",
              std::to_string(o.vocab_size));
  }
  (void)Tokenizer::from_bytes(model, o.out);  // what we write must load
  write_file_atomic(o.out, model);
}

#else  // without SentencePiece

bool sentencepiece_built() {
  return false;
}

struct Tokenizer::Impl {};

Tokenizer Tokenizer::from_bytes(std::string_view, const std::string& source) {
  throw std::invalid_argument(sentencepiece_missing(source + ": a BPE tokenizer"));
}

std::size_t Tokenizer::size() const {
  return 0;
}

std::vector<int> Tokenizer::encode(std::string_view) const {
  throw std::invalid_argument(sentencepiece_missing("BPE encoding"));
}

const std::string& Tokenizer::text(int) const {
  throw std::invalid_argument(sentencepiece_missing("BPE decoding"));
}

void train_tokenizer(const TokenizerTrainOptions&) {
  throw std::invalid_argument(sentencepiece_missing("tokenize train"));
}

#endif

}  // namespace attnlab::app
