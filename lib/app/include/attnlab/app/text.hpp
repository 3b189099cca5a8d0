// The `text` task: causal language modelling on a UTF-8 (or any) file, as nanoGPT's
// character-level Shakespeare run does it.
//
//  - Vocabulary. Character level (VocabKind::chars): the distinct Unicode code points of the
//    training file, sorted, stored in the run config (TaskConfig::chars, UTF-8) and so in the
//    checkpoint: eval and generate need no data file. Byte level (VocabKind::bytes): the 256 byte
//    values, nothing stored, for any file. BPE (VocabKind::bpe): the pieces of a SentencePiece
//    model (attnlab/app/tokenizer.hpp), trained on memory-mapped token files
//    (attnlab/app/token_file.hpp); the run directory keeps a copy of the model.
//  - Split by position: the first 90% of the tokens train, the last 10% validate.
//  - Training batches: B random contiguous blocks of `block` tokens from the training part, the
//    targets the next tokens (every position labelled).
//  - The eval set: `n` blocks at fixed, evenly spaced offsets of the validation part, the same in
//    every run of the same file and block size, so validation losses compare across runs.
//  - Packed documents (TrainConfig::pack_documents): the blocks are drawn as before, and each
//    carries its tokens' document ids (Batch::documents): the model attends within documents,
//    causally, and a target is ignored (kIgnoreIndex) where its input token is the last of its
//    document or part of a delimiter. Char and byte corpora are cut at each occurrence of the
//    delimiter text; the occurrence stays in the stream as the last tokens of the document it
//    ends. A BPE token directory keeps its own document starts (tokens.json's "documents", cut
//    by tokenize encode --doc-delimiter, which encodes no delimiter).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "attnlab/app/tasks.hpp"
#include "attnlab/app/tokenizer.hpp"

namespace attnlab::app {

// A text file's tokens under a vocabulary. Errors are DataFileError ("FILE: what").
class TextVocab {
 public:
  // The vocabulary of a text task's config: bytes, the code points of task.chars, or the BPE model
  // at task.tokenizer. Throws std::invalid_argument naming the field for chars that are empty, not
  // valid UTF-8, unsorted or repeated; DataFileError naming the model when it cannot be loaded or
  // its hash is not task.tokenizer_hash (when that is set).
  explicit TextVocab(const TaskConfig& task);
  bool bytes() const { return bytes_; }
  std::size_t size() const;
  // The ids of `text`. `source` names it in errors: invalid UTF-8 (with the byte offset and a hint
  // to use the byte vocabulary) and characters outside the vocabulary (with the character, its code
  // point and offset).
  std::vector<int> encode(std::string_view text, const std::string& source) const;
  // The UTF-8 text of one token (one byte in byte mode; a BPE piece's text, which may be part of a
  // character or nothing: Tokenizer::text).
  std::string decode(int id) const;
  // The bytes of original UTF-8 text one token stands for: a character's UTF-8 length, 1 for a
  // byte, Tokenizer::token_bytes for a BPE piece. The denominator of bits per byte.
  std::size_t token_bytes(int id) const;

 private:
  bool bytes_ = false;
  std::vector<char32_t> chars_;  // sorted
  std::optional<Tokenizer> bpe_;
};

// token_bytes of every id of a text task's vocabulary (bits per byte); empty for other tasks.
std::vector<std::uint32_t> token_byte_table(const TaskConfig& task);
// The same from a vocabulary already loaded (a BPE model is read once).
std::vector<std::uint32_t> token_byte_table(const TextVocab& vocab);

// The code points of `text`, validated as UTF-8 (DataFileError naming `source` and the byte offset
// of the first invalid sequence otherwise).
std::vector<char32_t> decode_utf8(std::string_view text, const std::string& source);
// The byte offset of the first sequence in `text` that is not UTF-8 (decode_utf8's rules), or
// std::string_view::npos.
std::size_t first_invalid_utf8(std::string_view text);
std::string encode_utf8(char32_t c);

// The sorted distinct characters of a UTF-8 text, as UTF-8: TaskConfig::chars for it.
std::string char_vocabulary(std::string_view text, const std::string& source);

// A text file read and split: train = the first 90% of its tokens, valid = the last 10%.
struct TextData {
  std::vector<int> train, valid;
};

// Reads `path` whole (DataFileError if it cannot be read or is empty) and encodes it.
std::string read_text_file(const std::string& path);
// Encodes and splits; each part must hold at least block + 1 tokens (DataFileError naming the
// file, its token count and the block otherwise).
TextData split_text(const std::vector<int>& tokens, std::size_t block, const std::string& source);

// The documents of a token stream, for packing.
struct DocumentBounds {
  std::vector<std::uint64_t> starts;      // ascending offsets where a document starts, the first 0
  std::vector<std::uint64_t> delimiters;  // ascending offsets of the delimiter's occurrences
  std::size_t delimiter_length = 0;       // its tokens (0: none in the stream)
  bool restart_positions = false;         // Batch::restart_positions of the packed blocks
};

// The documents of `tokens` cut by the token sequence `delimiter` (non-empty): occurrences do not
// overlap (found left to right), and each ends its document, the next one starting after it.
DocumentBounds find_documents(const std::vector<int>& tokens, const std::vector<int>& delimiter);

// Packs rows of a batch whose row b holds the tokens from offsets[b] (of the stream `docs`
// describes): fills batch.documents with each token's document (0 for the row's first) and sets
// the target of an input token that ends a document or lies in a delimiter to kIgnoreIndex.
void pack_documents(Batch& batch, const DocumentBounds& docs,
                    const std::vector<std::size_t>& offsets);

// Where the blocks of block + 1 tokens of a stream of `tokens` start, for text_batch and
// token_batch: `batch` offsets drawn from rng; for the eval batches: n offsets spread evenly from
// the first to the last (fewer when the stream is short). std::invalid_argument naming `op` when
// the stream holds no block + 1 tokens.
std::vector<std::size_t> random_offsets(std::size_t tokens, std::size_t block, std::size_t batch,
                                        Rng& rng, const char* op);
std::vector<std::size_t> spread_offsets(std::size_t tokens, std::size_t block, std::size_t n,
                                        const char* op);

// B random blocks of the tokens (offsets drawn from rng): fields[0] = x[o .. o+block),
// targets = x[o+1 .. o+block]; packed when docs is given.
Batch text_batch(const std::vector<int>& tokens, std::size_t block, std::size_t batch, Rng& rng,
                 const DocumentBounds* docs = nullptr);
// n blocks at evenly spaced offsets o_i = i · (len - block - 1) / max(n - 1, 1) (the whole
// range, deterministic). n is capped at the number of distinct offsets. Packed when docs is
// given.
Batch text_eval_batch(const std::vector<int>& tokens, std::size_t block, std::size_t n,
                      const DocumentBounds* docs = nullptr);

}  // namespace attnlab::app
