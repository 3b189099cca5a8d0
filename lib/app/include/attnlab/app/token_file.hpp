// Token directories: a text corpus encoded once by a BPE tokenizer (attnlab tokenize encode) and
// read through memory maps, so a corpus larger than memory trains with constant resident memory.
// A directory holds
//   train.bin, val.bin   the token ids, little-endian uint16 (a vocabulary of at most 65536) or
//                        uint32: the first 90% of the corpus's tokens and the last 10%, the split
//                        of the character-level text task (attnlab/app/text.hpp)
//   tokenizer.model      a copy of the tokenizer, so that the directory is self-contained
//   tokens.json          {"format": "attnlab-tokens", "version": 1, "dtype": "uint16"|"uint32",
//                         "vocab_size": N, "tokenizer": "bpe", "tokenizer_fnv1a64": "<16 hex>",
//                         "tokenizer_model": "tokenizer.model",
//                         "files": {"train.bin": {"tokens": n, "bytes": b}, "val.bin": {...}},
//                         "documents": {"train.bin": [0, ...], "val.bin": [0, ...]}}
// where "bytes" counts the UTF-8 text bytes a file's tokens stand for, and "documents" lists the
// offset (in tokens) at which each document starts: one document per input file, or per part of
// a file between --doc-delimiter strings. Each list starts at 0: val.bin's first entry is where it
// starts, which may be inside a document. Errors are DataFileError ("FILE: what").
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "attnlab/app/run_config.hpp"
#include "attnlab/app/tasks.hpp"
#include "attnlab/app/text.hpp"
#include "attnlab/random.hpp"

namespace attnlab::app {

inline constexpr const char* kTokensJson = "tokens.json";
inline constexpr const char* kTrainBin = "train.bin";
inline constexpr const char* kValBin = "val.bin";
inline constexpr const char* kTokenizerModel = "tokenizer.model";

struct TokenPart {
  std::uint64_t tokens = 0, bytes = 0;
  std::vector<std::uint64_t> documents;  // ascending start offsets, the first 0
};

struct TokenHeader {
  int dtype_bytes = 2;  // 2: uint16, 4: uint32
  std::uint64_t vocab_size = 0;
  std::string tokenizer_hash;   // fnv1a64_hex of the model file
  std::string tokenizer_model;  // the model's file name in the directory
  TokenPart train, val;
  const TokenPart& part(std::string_view file) const { return file == kTrainBin ? train : val; }
};

// tokens.json's text, checked field by field (DataFileError "SOURCE: ..." naming the field).
TokenHeader parse_token_header(std::string_view text, const std::string& source);
std::string token_header_json(const TokenHeader& header);
// DIR/tokens.json. A directory without one is not a token directory.
TokenHeader read_token_header(const std::string& dir);

// One .bin of a token directory, memory-mapped read-only. Opening checks its size against the
// header's dtype and count, and every id against vocab_size (read in chunks, not through the map,
// so that the check leaves no pages resident).
class TokenFile {
 public:
  TokenFile(const std::string& dir, const TokenHeader& header, std::string_view file);
  ~TokenFile();
  TokenFile(const TokenFile&) = delete;
  TokenFile& operator=(const TokenFile&) = delete;

  std::size_t size() const { return tokens_; }
  int operator[](std::size_t i) const {
    return dtype_bytes_ == 2 ? static_cast<const std::uint16_t*>(data_)[i]
                             : static_cast<int>(static_cast<const std::uint32_t*>(data_)[i]);
  }
  // Where each document starts, in tokens (tokens.json's "documents" of this file).
  const std::vector<std::uint64_t>& documents() const { return documents_; }
  const std::string& path() const { return path_; }
  // Lets go of the pages of ids [first, first + count) once they are read, so that sampling windows
  // all over a large file keeps the process's resident memory constant (the kernel keeps them in
  // its page cache while memory allows).
  void release(std::size_t first, std::size_t count) const;

 private:
  std::string path_;
  const void* data_ = nullptr;
  std::size_t tokens_ = 0, mapped_ = 0;
  int dtype_bytes_ = 2;
  std::vector<std::uint64_t> documents_;
};

// text_batch and text_eval_batch (attnlab/app/text.hpp) over a token file: the same offsets for
// the same rng and sizes; packed when docs is given.
Batch token_batch(const TokenFile& tokens, std::size_t block, std::size_t batch, Rng& rng,
                  const DocumentBounds* docs = nullptr);
Batch token_eval_batch(const TokenFile& tokens, std::size_t block, std::size_t n,
                       const DocumentBounds* docs = nullptr);
// A token file's documents for packing: its recorded starts (tokenize encode cut them; no
// delimiter tokens are in the stream).
DocumentBounds token_documents(const TokenFile& tokens, bool restart_positions);

// For a text task whose data_file is a token directory: sets vocab bpe, the tokenizer's path (the
// directory's model) and hash. Refused (DataFileError naming both files) when the config already
// holds another tokenizer's hash (a resumed run), or when the vocabulary asked for is not bpe.
// Does nothing for other tasks and data.
void prepare_token_task(TrainConfig& config);
// The header of a prepared BPE config's token directory, checked against the config's tokenizer
// (hash and size): DataFileError naming tokens.json and both models when the hash differs.
TokenHeader check_token_dir(const TrainConfig& config);
// A BPE run's eval set: eval_size blocks of DIR/val.bin, as text_eval_batch (packed with
// pack_documents).
Batch token_eval_set(const TrainConfig& config);
// Writes the config's tokenizer model to RUN/tokenizer.model (atomically).
void copy_tokenizer(const TrainConfig& config, const std::string& run_dir);

// `attnlab tokenize encode`.
struct EncodeOptions {
  std::vector<std::string> files;
  std::string model, out, doc_delimiter;
};
struct EncodeReport {
  TokenHeader header;
  std::uint64_t text_bytes = 0;
  double seconds = 0;
};
EncodeReport encode_token_files(const EncodeOptions& options);

}  // namespace attnlab::app
