#include "attnlab/nn/feed_forward.hpp"

#include <stdexcept>
#include <string>

namespace attnlab {

std::size_t default_mlp_width(std::size_t C, MlpActivation activation) {
  if (activation != MlpActivation::swiglu) return 4 * C;
  const std::size_t F = 8 * C / 3;  // int(2 · 4C / 3), as LLaMA's FeedForward
  return (F + kSwigluWidthMultiple - 1) / kSwigluWidthMultiple * kSwigluWidthMultiple;
}

namespace {

template <class T>
std::unique_ptr<SequenceModule<T>> make_activation(MlpActivation activation, std::size_t hidden,
                                                   GeluApproximation approximation) {
  switch (activation) {
    case MlpActivation::relu2:
      return std::make_unique<ReluSquared<T>>(hidden);
    case MlpActivation::swiglu:
      return std::make_unique<Swiglu<T>>(hidden);
    case MlpActivation::gelu:
      break;
  }
  return std::make_unique<Gelu<T>>(hidden, approximation);
}

}  // namespace

template <class T>
FeedForward<T>::FeedForward(std::size_t dim, std::size_t hidden, Rng& rng,
                            GeluApproximation approximation)
    : FeedForward(dim, hidden, rng, MlpActivation::gelu, approximation) {}

template <class T>
FeedForward<T>::FeedForward(std::size_t dim, std::size_t hidden, Rng& rng, MlpActivation activation,
                            GeluApproximation approximation, bool bias)
    : fc1(dim, activation == MlpActivation::swiglu ? 2 * hidden : hidden, rng, bias),
      act(make_activation<T>(activation, hidden, approximation)),
      fc2(hidden, dim, rng, bias),
      activation_(activation) {}

template <class T>
void FeedForward<T>::collect_parameters(const std::string& prefix, ParameterList<T>& out) {
  fc1.collect_parameters(prefix + "fc1.", out);
  fc2.collect_parameters(prefix + "fc2.", out);
}

template <class T>
Buffer<T> FeedForward<T>::forward_impl(const Buffer<T>& x) {
  return fc2.forward(act->forward(fc1.forward(x)));  // (B,T,C) -> (B,T,F) -> (B,T,F) -> (B,T,C)
}

template <class T>
Buffer<T> FeedForward<T>::backward_impl(const Buffer<T>& dy) {
  return fc1.backward(act->backward(fc2.backward(dy)));
}

template class FeedForward<float>;
template class FeedForward<double>;

}  // namespace attnlab
