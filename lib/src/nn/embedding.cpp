#include "attnlab/nn/embedding.hpp"

#include <stdexcept>
#include <string>

namespace attnlab {

template <class T>
Embedding<T>::Embedding(std::size_t vocab, std::size_t dim, Rng& rng) : vocab_(vocab), dim_(dim) {
  check_arg(vocab > 0, "Embedding", "vocab", "> 0", std::to_string(vocab));
  check_arg(dim > 0, "Embedding", "dim", "> 0", std::to_string(dim));
  table = make_parameter<T>(randn<T, 2>({vocab, dim}, rng, 1.0));
}

template <class T>
Tensor3<T> Embedding<T>::forward(const TokenIds& ids) {
  return embedding_forward<T>(cache_, ids, tensor_of<T, 2>(table.value));
}

template <class T>
void Embedding<T>::backward(const Tensor3<T>& dy) {
  if (cache_.V == 0) throw std::logic_error("Embedding::backward: called before forward");
  add_into(table.grad, embedding_backward<T>(dy, cache_));
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
  fields_.reserve(vocab_sizes.size());
  for (std::size_t v : vocab_sizes) fields_.emplace_back(v, dim, rng);
}

template <class T>
Tensor3<T> MultiFieldEmbedding<T>::forward(const std::vector<TokenIds>& fields) {
  check_arg(fields.size() == fields_.size(), "MultiFieldEmbedding::forward", "fields",
            std::to_string(fields_.size()) + " id tensors", std::to_string(fields.size()));
  const auto B = static_cast<std::ptrdiff_t>(fields[0].shape()[0]);
  const auto Tn = static_cast<std::ptrdiff_t>(fields[0].shape()[1]);
  Tensor3<T> y = fields_[0].forward(fields[0]);  // (B,T,C)
  for (std::size_t i = 1; i < fields.size(); ++i) {
    check_shape("MultiFieldEmbedding::forward", "fields[" + std::to_string(i) + "]", fields[i],
                {B, Tn});
    const Tensor3<T> e = fields_[i].forward(fields[i]);
    for (std::size_t j = 0; j < y.size(); ++j) y.data()[j] += e.data()[j];
  }
  has_forward_ = true;
  return y;
}

template <class T>
void MultiFieldEmbedding<T>::backward(const Tensor3<T>& dy) {
  if (!has_forward_) throw std::logic_error("MultiFieldEmbedding::backward: called before forward");
  for (auto& f : fields_) f.backward(dy);  // a sum: every field receives dy
}

template <class T>
void MultiFieldEmbedding<T>::collect_parameters(const std::string& prefix, ParameterList<T>& out) {
  for (std::size_t i = 0; i < fields_.size(); ++i) {
    fields_[i].collect_parameters(prefix + "fields." + std::to_string(i) + ".", out);
  }
}

template class Embedding<float>;
template class Embedding<double>;
template class MultiFieldEmbedding<float>;
template class MultiFieldEmbedding<double>;

}  // namespace attnlab
