#include "attnlab/nn/embedding.hpp"

#include <stdexcept>
#include <string>

namespace attnlab {

void check_token_ids(std::string_view op, const std::string& arg, const TokenIds& ids,
                     std::size_t vocab) {
  const std::size_t Tn = ids.shape()[1];
  for (std::size_t i = 0; i < ids.size(); ++i) {
    const int id = ids.data()[i];
    if (id != kNoToken && (id < 0 || static_cast<std::size_t>(id) >= vocab)) {
      check_arg(false, op, arg + "[" + std::to_string(i / Tn) + ", " + std::to_string(i % Tn) + "]",
                "an id in [0, " + std::to_string(vocab) + ") or -1 (no token)", std::to_string(id));
    }
  }
}

template <class T>
Embedding<T>::Embedding(std::size_t vocab, std::size_t dim, Rng& rng) : vocab_(vocab), dim_(dim) {
  check_arg(vocab > 0, "Embedding", "vocab", "> 0", std::to_string(vocab));
  check_arg(dim > 0, "Embedding", "dim", "> 0", std::to_string(dim));
  table = make_parameter<T>(randn<T, 2>({vocab, dim}, rng, 1.0));
}

template <class T>
Tensor3<T> Embedding<T>::forward(const TokenIds& ids) {
  check_token_ids("embedding_forward", "ids", ids, vocab_);
  return to_tensor<T, 3>(forward(to_buffer<int>(this->ops(), ids)), "Embedding");
}

template <class T>
Buffer<T> Embedding<T>::forward(const Buffer<int>& ids) {
  DeviceOps<T>& ops = this->ops();
  check_buffer("Embedding::forward", "ids", ids, ops, {kAnyExtent, kAnyExtent});
  ids_ = ids;
  Buffer<T>& y = Buffer<T>::reuse(y_, ops, {ids.dim(0), ids.dim(1), dim_});
  ops.embedding_forward(y.data(), ids.data(), table.value_data(), ids.size(), dim_);
  return y;
}

template <class T>
void Embedding<T>::backward(const Tensor3<T>& dy) {
  if (ids_.empty()) throw std::logic_error("Embedding::backward: called before forward");
  check_shape("embedding_backward", "dy", dy,
              {std::ptrdiff_t(ids_.dim(0)), std::ptrdiff_t(ids_.dim(1)), kAnyExtent});
  backward(to_buffer<T>(this->ops(), dy));
}

template <class T>
void Embedding<T>::backward(const Buffer<T>& dy) {
  if (ids_.empty()) throw std::logic_error("Embedding::backward: called before forward");
  DeviceOps<T>& ops = this->ops();
  check_buffer("embedding_backward", "dy", dy, ops,
               {std::ptrdiff_t(ids_.dim(0)), std::ptrdiff_t(ids_.dim(1)),
                static_cast<std::ptrdiff_t>(dim_)});
  Buffer<T>& dtable = Buffer<T>::reuse(dtable_, ops, {vocab_, dim_});
  ops.embedding_backward(dtable.data(), dy.data(), ids_.data(), ids_.size(), vocab_, dim_);
  add_into(ops, table, dtable);
}

template <class T>
void Embedding<T>::collect_parameters(const std::string& prefix, ParameterList<T>& out) {
  out.push_back({prefix + "table", &table});
}

template <class T>
MultiFieldEmbedding<T>::MultiFieldEmbedding(const std::vector<std::size_t>& vocab_sizes,
                                            std::size_t dim, Rng& rng)
    : dim_(dim) {
  check_arg(!vocab_sizes.empty(), "MultiFieldEmbedding", "vocab_sizes", "at least one field",
            "none");
  for (std::size_t v : vocab_sizes) fields_.push_back(std::make_unique<Embedding<T>>(v, dim, rng));
}

template <class T>
Tensor3<T> MultiFieldEmbedding<T>::forward(const std::vector<TokenIds>& fields) {
  return to_tensor<T, 3>(forward(upload(fields, "MultiFieldEmbedding::forward")),
                         "MultiFieldEmbedding");
}

template <class T>
std::vector<Buffer<int>> MultiFieldEmbedding<T>::upload(const std::vector<TokenIds>& fields,
                                                        const char* op,
                                                        const std::string& count_note) const {
  check_arg(fields.size() == fields_.size(), op, "fields",
            std::to_string(fields_.size()) + " id tensors" + count_note,
            std::to_string(fields.size()));
  const auto B = static_cast<std::ptrdiff_t>(fields[0].shape()[0]);
  const auto Tn = static_cast<std::ptrdiff_t>(fields[0].shape()[1]);
  std::vector<Buffer<int>> ids;
  for (std::size_t i = 0; i < fields.size(); ++i) {
    if (i > 0) {
      check_shape("MultiFieldEmbedding::forward", "fields[" + std::to_string(i) + "]", fields[i],
                  {B, Tn});
    }
    check_token_ids("embedding_forward", "ids", fields[i], fields_[i]->vocab());
    ids.push_back(to_buffer<int>(this->ops(), fields[i]));
  }
  return ids;
}

template <class T>
Buffer<T> MultiFieldEmbedding<T>::forward(const std::vector<Buffer<int>>& ids) {
  check_arg(ids.size() == fields_.size(), "MultiFieldEmbedding::forward", "fields",
            std::to_string(fields_.size()) + " id tensors", std::to_string(ids.size()));
  DeviceOps<T>& ops = this->ops();
  Buffer<T> y = fields_[0]->forward(ids[0]);  // (B,T,C)
  for (std::size_t i = 1; i < ids.size(); ++i) {
    const Buffer<T> e = fields_[i]->forward(ids[i]);
    ops.add(y.data(), y.data(), e.data(), y.size());
  }
  has_forward_ = true;
  return y;
}

template <class T>
void MultiFieldEmbedding<T>::backward(const Tensor3<T>& dy) {
  if (!has_forward_) throw std::logic_error("MultiFieldEmbedding::backward: called before forward");
  backward(to_buffer<T>(this->ops(), dy));
}

template <class T>
void MultiFieldEmbedding<T>::backward(const Buffer<T>& dy) {
  if (!has_forward_) throw std::logic_error("MultiFieldEmbedding::backward: called before forward");
  for (auto& f : fields_) f->backward(dy);  // a sum: every field receives dy
}

template <class T>
void MultiFieldEmbedding<T>::collect_parameters(const std::string& prefix, ParameterList<T>& out) {
  for (std::size_t i = 0; i < fields_.size(); ++i) {
    fields_[i]->collect_parameters(prefix + "fields." + std::to_string(i) + ".", out);
  }
}

template class Embedding<float>;
template class Embedding<double>;
template class MultiFieldEmbedding<float>;
template class MultiFieldEmbedding<double>;

}  // namespace attnlab
