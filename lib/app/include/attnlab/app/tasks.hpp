// Toy sequence tasks, generated on the fly from a seed, each with a fixed eval set.
//
// A batch is a set of token fields that are embedded and summed per position (like token +
// position), plus one target per position:
//   fields[f]: (B, T) ids in [0, field_vocab[f]), or kAbsent (-1) where the field is absent
//   targets:   (B, T) ids in [0, output_vocab), or kIgnoreIndex (-100) where unlabelled
//
// Tasks:
//   recall   paired-token associative recall (the study's task). N positions each carry a key and
//            a value (two fields, keys distinct), then one query position carries a key alone.
//            The query position's target is the value paired with that key; one attention layer
//            solves it exactly when the query attends to the matching pair.
//   mqar     multi-query associative recall in plain token form: k1 v1 ... kN vN q1 ... qM; each
//            query's target is the value that followed that key (keys are ids [0, K), values
//            [K, K+V)). Needs two layers (an induction head).
//   reverse  x1 ... xL; the target at position i is x_{L-1-i}.
//   sort     x1 ... xL; the target at position i is the i-th smallest x.
//   text     causal language modelling on a text file (attnlab/app/text.hpp): blocks of `block`
//            tokens, each position's target the next token. Its batches come from the text, not
//            from generate_batch.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "attnlab/enum_table.hpp"
#include "attnlab/ops/cross_entropy.hpp"
#include "attnlab/ops/embedding.hpp"
#include "attnlab/random.hpp"
#include "attnlab/tensor.hpp"

namespace attnlab::app {

inline constexpr int kAbsent = kNoToken;  // -1: a field not present at a position
// kIgnoreIndex (-100, ops/cross_entropy.hpp): an unlabelled position (PyTorch's ignore_index)

enum class TaskKind { recall, mqar, reverse, sort, text };

// A text task's vocabulary: the characters of the text, the 256 byte values (any file), or the
// pieces of a BPE tokenizer (a token directory of attnlab tokenize encode).
enum class VocabKind { chars, bytes, bpe };

}  // namespace attnlab::app

namespace attnlab {

template <>
struct EnumTable<app::TaskKind> {
  static constexpr EnumEntry<app::TaskKind> entries[] = {
      {app::TaskKind::recall, "recall", "paired-token associative recall"},
      {app::TaskKind::mqar, "mqar", "multi-query associative recall"},
      {app::TaskKind::reverse, "reverse", "the sequence reversed"},
      {app::TaskKind::sort, "sort", "the sequence sorted"},
      {app::TaskKind::text, "text", "next-token prediction on a text file"},
  };
  static constexpr EnumParseText parse = {"task"};
};

template <>
struct EnumTable<app::VocabKind> {
  static constexpr EnumEntry<app::VocabKind> entries[] = {
      {app::VocabKind::chars, "char",
       "the characters of the text (of --data, stored in the checkpoint)"},
      {app::VocabKind::bytes, "byte", "the 256 byte values, for any file"},
      {app::VocabKind::bpe, "bpe",
       "the BPE pieces of a token directory (--data DIR from attnlab tokenize encode)"},
  };
  static constexpr EnumParseText parse = {"task", "vocab"};
};

}  // namespace attnlab

namespace attnlab::app {

// The names of EnumTable<TaskKind>; parse throws std::invalid_argument naming the text for an
// unknown task.
inline std::string_view to_string(TaskKind kind) {
  return enum_name(kind);
}
inline TaskKind parse_task(std::string_view text) {
  return parse_enum<TaskKind>(text);
}

struct TaskConfig {
  TaskKind kind = TaskKind::recall;
  int keys = 64;     // recall, mqar: key symbols
  int values = 64;   // recall, mqar: value symbols
  int pairs = 32;    // recall, mqar: N key-value pairs
  int queries = 8;   // mqar: queries per sequence
  int symbols = 16;  // reverse, sort: alphabet
  int length = 12;   // reverse, sort: sequence length
  int block = 64;    // text: tokens per example (the context length)
  // text: the vocabulary, and for VocabKind::chars its characters in code point order (UTF-8)
  VocabKind vocab = VocabKind::chars;
  std::string chars;
  // text, VocabKind::bpe: the tokenizer model's hash (fnv1a64_hex, attnlab/app/tokenizer.hpp), kept
  // in the run config; and where the model is read from, set when a run starts or is loaded (the
  // token directory's or the run directory's tokenizer.model), never saved.
  std::string tokenizer_hash;
  std::string tokenizer;
};

// What a model needs to know about a task's data.
struct TaskShape {
  std::vector<int> field_vocab;  // one vocabulary size per field
  int output_vocab = 0;
  int seq_len = 0;
};

// Throws std::invalid_argument naming the field for an inconsistent config (e.g. more pairs than
// keys, non-positive sizes).
TaskShape task_shape(const TaskConfig& config);

struct Batch {
  std::vector<TokenIds> fields;  // F x (B, T)
  TokenIds targets;              // (B, T)
  // Packed documents (the text task's pack_documents): each token's document id (B, T), ids
  // compared within a row; empty otherwise. The model attends within documents, causally
  // (document_layout), and with restart_positions RoPE positions restart at each document.
  TokenIds documents;
  bool restart_positions = false;
  std::size_t size() const { return targets.shape()[0]; }
  std::size_t length() const { return targets.shape()[1]; }
};

// B fresh examples drawn from rng (not for text: std::invalid_argument).
Batch generate_batch(const TaskConfig& config, std::size_t batch, Rng& rng);

// The task's fixed eval set: n examples from a seed that does not depend on the training seed.
inline constexpr std::uint64_t kEvalSeed = 0x5eedeba1;
Batch eval_batch(const TaskConfig& config, std::size_t n);

// Rows [begin, end) of a batch, copied.
Batch slice_batch(const Batch& batch, std::size_t begin, std::size_t end);
// Rows picked by index, copied (used to draw training batches from a data file).
Batch gather_batch(const Batch& batch, const std::vector<std::size_t>& rows);

// For recall: the position of the pair whose key matches the query (last) position, per example;
// -1 if none. Used by the "attention mass on the correct key" metric.
std::vector<int> recall_key_positions(const Batch& batch);

}  // namespace attnlab::app
