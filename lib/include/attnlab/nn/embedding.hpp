// Token embeddings. Reference: torch.nn.Embedding.
//   Embedding: ids (B, T) -> (B, T, C), parameter "table" (V, C) drawn from N(0, 1).
//   MultiFieldEmbedding: several token fields per position whose embeddings add (like token +
//   position; the associative-recall task puts a key and a value at one position). Field i has
//   its own vocabulary and table "fields.i.table". An id of kNoToken (-1) means "this field is
//   absent here" and contributes nothing.
#pragma once

#include <memory>
#include <vector>

#include "attnlab/nn/module.hpp"
#include "attnlab/ops/embedding.hpp"
#include "attnlab/random.hpp"

namespace attnlab {

template <class T>
class Embedding : public Module<T> {
 public:
  Embedding(std::size_t vocab, std::size_t dim, Rng& rng);

  // ids: (B, T) in [0, vocab) or kNoToken (std::invalid_argument naming the first id out of
  // range). Returns (B, T, dim).
  Tensor3<T> forward(const TokenIds& ids);
  // The same on the backend: ids (B, T) already there (and checked by the caller).
  Buffer<T> forward(const Buffer<int>& ids);
  // dy: (B, T, dim). ADDS into table.grad (scatter-add). Throws std::logic_error before forward.
  void backward(const Tensor3<T>& dy);
  void backward(const Buffer<T>& dy);

  void collect_parameters(const std::string& prefix, ParameterList<T>& out) override;
  std::size_t vocab() const { return vocab_; }
  std::size_t dim() const { return dim_; }

  Parameter<T> table;  // (V, C)

 private:
  void reset_cache() override { ids_ = Buffer<int>(); }

  std::size_t vocab_, dim_;
  Buffer<int> ids_;       // the ids of the last forward
  Buffer<T> y_, dtable_;  // reused output and gradient buffers
};

// Throws std::invalid_argument "<op>: <arg>[b, t] expected an id in [0, vocab) or -1 (no token),
// got <id>" for the first id out of range.
void check_token_ids(std::string_view op, const std::string& arg, const TokenIds& ids,
                     std::size_t vocab);

template <class T>
class MultiFieldEmbedding : public Module<T> {
 public:
  // One field per entry of vocab_sizes (at least one, each > 0). Tables are drawn in field order.
  MultiFieldEmbedding(const std::vector<std::size_t>& vocab_sizes, std::size_t dim, Rng& rng);

  // fields: one (B, T) id tensor per field, all of one shape. Returns Σ_i table_i[fields[i]]
  // (B, T, dim). Throws std::invalid_argument on a wrong field count, ShapeError on mismatch.
  Tensor3<T> forward(const std::vector<TokenIds>& fields);
  // The same on the backend: field i's ids are ids[i] (B, T), from upload.
  Buffer<T> forward(const std::vector<Buffer<int>>& ids);
  // fields checked as forward checks them and copied to the backend. An error names `op`, and a
  // wrong field count says "<n> id tensors" followed by `count_note`.
  std::vector<Buffer<int>> upload(const std::vector<TokenIds>& fields, const char* op,
                                  const std::string& count_note = "") const;
  // dy: (B, T, dim). ADDS into every field's table grad. std::logic_error before forward.
  void backward(const Tensor3<T>& dy);
  void backward(const Buffer<T>& dy);

  void collect_parameters(const std::string& prefix, ParameterList<T>& out) override;
  std::size_t num_fields() const { return fields_.size(); }
  std::size_t dim() const { return dim_; }
  Embedding<T>& field(std::size_t i) { return *fields_.at(i); }

 protected:
  void for_each_child(const std::function<void(Module<T>&)>& visit) override {
    for (auto& f : fields_) visit(*f);
  }
  void reset_cache() override { has_forward_ = false; }

 private:
  std::size_t dim_;
  std::vector<std::unique_ptr<Embedding<T>>> fields_;
  bool has_forward_ = false;
};

}  // namespace attnlab
