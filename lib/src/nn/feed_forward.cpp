#include "attnlab/nn/feed_forward.hpp"

namespace attnlab {

template <class T>
FeedForward<T>::FeedForward(std::size_t dim, std::size_t hidden, Rng& rng,
                            GeluApproximation approximation)
    : fc1(dim, hidden, rng, true), act(hidden, approximation), fc2(hidden, dim, rng, true) {}

template <class T>
void FeedForward<T>::collect_parameters(const std::string& prefix, ParameterList<T>& out) {
  fc1.collect_parameters(prefix + "fc1.", out);
  fc2.collect_parameters(prefix + "fc2.", out);
}

template <class T>
Buffer<T> FeedForward<T>::forward_impl(const Buffer<T>& x) {
  return fc2.forward(act.forward(fc1.forward(x)));  // (B,T,C) -> (B,T,F) -> (B,T,F) -> (B,T,C)
}

template <class T>
Buffer<T> FeedForward<T>::backward_impl(const Buffer<T>& dy) {
  return fc1.backward(act.backward(fc2.backward(dy)));
}

template class FeedForward<float>;
template class FeedForward<double>;

}  // namespace attnlab
