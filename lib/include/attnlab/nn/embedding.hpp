// Token embeddings. Reference: torch.nn.Embedding.
//   Embedding: ids (B, T) -> (B, T, C), parameter "table" (V, C) drawn from N(0, 1).
//   MultiFieldEmbedding: several token fields per position whose embeddings add (like token +
//   position; the associative-recall task puts a key and a value at one position). Field i has
//   its own vocabulary and table "fields.i.table". An id of kNoToken (-1) means "this field is
//   absent here" and contributes nothing.
#pragma once

#include <vector>

#include "attnlab/nn/module.hpp"
#include "attnlab/ops/embedding.hpp"
#include "attnlab/random.hpp"

namespace attnlab {

template <class T>
class Embedding : public Module<T> {
 public:
  Embedding(std::size_t vocab, std::size_t dim, Rng& rng);

  // ids: (B, T) in [0, vocab) or kNoToken. Returns (B, T, dim).
  Tensor3<T> forward(const TokenIds& ids);
  // dy: (B, T, dim). ADDS into table.grad (scatter-add). Throws std::logic_error before forward.
  void backward(const Tensor3<T>& dy);

  void collect_parameters(const std::string& prefix, ParameterList<T>& out) override;
  std::size_t vocab() const { return vocab_; }
  std::size_t dim() const { return dim_; }

  Parameter<T> table;  // (V, C)

 private:
  std::size_t vocab_, dim_;
  EmbeddingCache cache_;
};

template <class T>
class MultiFieldEmbedding : public Module<T> {
 public:
  // One field per entry of vocab_sizes (at least one, each > 0). Tables are drawn in field order.
  MultiFieldEmbedding(const std::vector<std::size_t>& vocab_sizes, std::size_t dim, Rng& rng);

  // fields: one (B, T) id tensor per field, all of one shape. Returns Σ_i table_i[fields[i]]
  // (B, T, dim). Throws std::invalid_argument on a wrong field count, ShapeError on mismatch.
  Tensor3<T> forward(const std::vector<TokenIds>& fields);
  // dy: (B, T, dim). ADDS into every field's table grad. std::logic_error before forward.
  void backward(const Tensor3<T>& dy);

  void collect_parameters(const std::string& prefix, ParameterList<T>& out) override;
  std::size_t num_fields() const { return fields_.size(); }
  std::size_t dim() const { return dim_; }
  Embedding<T>& field(std::size_t i) { return fields_.at(i); }

 private:
  std::size_t dim_;
  std::vector<Embedding<T>> fields_;
  bool has_forward_ = false;
};

}  // namespace attnlab
