// The BPE tokenizer of text tasks: a SentencePiece model (model_type bpe, byte fallback, identity
// normalisation, no dummy prefix), so that decoding the ids of any UTF-8 text gives the text back
// byte for byte. SentencePiece is optional at build time (ATTNLAB_SENTENCEPIECE, like MPI): without
// it every function here that needs it throws std::invalid_argument with sentencepiece_missing().
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

namespace attnlab::app {

// Whether this build has SentencePiece, and the one line that says what to do when it has not.
bool sentencepiece_built();
std::string sentencepiece_missing(std::string_view what);

// FNV-1a (64 bit) of bytes, as 16 lowercase hex digits: the tokenizer's identity in tokens.json and
// in a run's config (a stable hash, not a cryptographic one).
std::string fnv1a64_hex(std::string_view bytes);

// A loaded BPE model. Copies share the model (it is immutable once loaded).
class Tokenizer {
 public:
  // Reads a model file: DataFileError "PATH: ..." when it cannot be read or is not a SentencePiece
  // BPE model with byte fallback; std::invalid_argument without SentencePiece.
  static Tokenizer load(const std::string& path);
  // The same from the file's bytes; `source` names them in errors.
  static Tokenizer from_bytes(std::string_view model, const std::string& source);

  std::size_t size() const;
  const std::string& hash() const { return hash_; }    // fnv1a64_hex of the model's bytes
  const std::string& bytes() const { return model_; }  // the model file's bytes
  // The ids of UTF-8 `text` (SentencePiece's encoding, exactly).
  std::vector<int> encode(std::string_view text) const;
  // The original text one id stands for: "▁" as a space, a byte piece <0xNN> as its byte, control
  // and unknown pieces as nothing. Concatenated over a sequence it is the decoded text.
  const std::string& text(int id) const;
  // text(id).size(): the UTF-8 bytes of original text the token stands for.
  std::size_t token_bytes(int id) const { return text(id).size(); }

 private:
  struct Impl;
  std::shared_ptr<const Impl> impl_;
  std::string hash_, model_;
};

// `attnlab tokenize train`: a BPE model of `vocab_size` pieces learned from the lines of `files`,
// written atomically to `out`. Deterministic: one thread, a fixed seed, every line used in file
// order. DataFileError for an unreadable or non-UTF-8 file; std::invalid_argument for a vocabulary
// SentencePiece cannot reach (it names the smallest and largest it can).
struct TokenizerTrainOptions {
  std::vector<std::string> files;
  int vocab_size = 1024;
  std::string out;
};
void train_tokenizer(const TokenizerTrainOptions& options);

}  // namespace attnlab::app
