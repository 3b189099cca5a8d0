#include "attnlab/nn/cross_entropy.hpp"

#include <cmath>
#include <limits>
#include <stdexcept>
#include <string>

#include "attnlab/ops/cross_entropy.hpp"
#include "kernels/cross_entropy.hpp"

namespace attnlab {

template <class T>
CrossEntropyLoss<T>::CrossEntropyLoss(double z_loss) : z_loss_(z_loss) {
  check_arg(std::isfinite(z_loss) && z_loss >= 0, "CrossEntropyLoss", "z_loss",
            "a finite number >= 0", detail::shown_number(z_loss));
}

template <class T>
double CrossEntropyLoss<T>::forward(DeviceOps<T>& ops, const Buffer<T>& logits,
                                    const TokenIds& targets, double weight) {
  const char* op = "cross_entropy_forward";
  check_extents(op, "logits", logits.shape(), {kAnyExtent, kAnyExtent, kAnyExtent});
  const std::size_t B = logits.dim(0), Tn = logits.dim(1), V = logits.dim(2), rows = B * Tn;
  check_shape(op, "targets", targets,
              {static_cast<std::ptrdiff_t>(B), static_cast<std::ptrdiff_t>(Tn)});
  check_arg(std::isfinite(weight), op, "weight", "a finite number", detail::shown_number(weight));
  for (std::size_t r = 0; r < rows; ++r) {
    const int t = targets.data()[r];
    if (t != kIgnoreIndex && (t < 0 || static_cast<std::size_t>(t) >= V)) {
      check_arg(false, op,
                "targets[" + std::to_string(r / Tn) + ", " + std::to_string(r % Tn) + "]",
                "a class in [0, " + std::to_string(V) + ") or ignore_index " +
                    std::to_string(kIgnoreIndex),
                std::to_string(t));
    }
  }
  has_forward_ = false;
  targets_ = Buffer<int>::from_host(ops, targets.data(), {B, Tn});
  Buffer<T>& loss = Buffer<T>::reuse(loss_, ops, {2});
  Buffer<T>& dlogits = Buffer<T>::reuse(dlogits_, ops, logits.shape());
  ops.softmax_cross_entropy(loss.data(), dlogits.data(),
                            Buffer<T>::reuse(row_loss_, ops, {2, rows}).data(), logits.data(),
                            targets_.data(), rows, V, kIgnoreIndex, static_cast<T>(z_loss_));
  // A weighted piece of a larger mean: one more pass over dlogits (none for the whole batch).
  if (weight != 1 && dlogits.size() > 0)
    ops.scale(dlogits.data(), static_cast<T>(weight), dlogits.size());
  T host[2] = {0, 0};
  loss.copy_to_host(host);
  has_forward_ = true;
  const auto finite_or_nan = [](T v) {
    const double d = static_cast<double>(v);
    return std::isfinite(d) ? d : std::numeric_limits<double>::quiet_NaN();
  };
  cross_entropy_ = finite_or_nan(host[0]);
  z_term_ = finite_or_nan(host[1]);
  return cross_entropy_ + z_term_;
}

template <class T>
const Buffer<T>& CrossEntropyLoss<T>::dlogits() const {
  if (!has_forward_) throw std::logic_error("CrossEntropyLoss::dlogits: called before forward");
  return dlogits_;
}

template class CrossEntropyLoss<float>;
template class CrossEntropyLoss<double>;

}  // namespace attnlab
