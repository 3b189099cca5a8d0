#include "attnlab/nn/positional.hpp"

#include <cmath>
#include <string>

namespace attnlab {

template <class T>
Tensor2<T> sinusoidal_table(std::size_t max_len, std::size_t dim) {
  constexpr double kBase = 10000.0;  // Vaswani et al. 2017, §3.5
  Tensor2<T> table({max_len, dim});
  for (std::size_t t = 0; t < max_len; ++t) {
    for (std::size_t c = 0; c < dim; ++c) {
      const double freq = std::pow(kBase, -static_cast<double>(c - c % 2) / double(dim));
      const double angle = double(t) * freq;
      table(t, c) = static_cast<T>(c % 2 == 0 ? std::sin(angle) : std::cos(angle));
    }
  }
  return table;
}

template <class T>
PositionalEncoding<T>::PositionalEncoding(PositionEncoding kind, std::size_t max_len,
                                          std::size_t dim, Rng& rng)
    : kind_(kind), max_len_(max_len), dim_(dim) {
  check_arg(max_len > 0, "PositionalEncoding", "max_len", "> 0", std::to_string(max_len));
  check_arg(dim > 0, "PositionalEncoding", "dim", "> 0", std::to_string(dim));
  if (kind == PositionEncoding::learned) {
    table = make_parameter<T>(randn<T, 2>({max_len, dim}, rng, 1.0));
  } else if (kind == PositionEncoding::sinusoidal) {
    table = make_parameter<T>(sinusoidal_table<T>(max_len, dim));
  }
}

template <class T>
void PositionalEncoding<T>::collect_parameters(const std::string& prefix, ParameterList<T>& out) {
  if (kind_ == PositionEncoding::learned) out.push_back({prefix + "table", &table});
}

template <class T>
Buffer<T> PositionalEncoding<T>::forward_impl(const Buffer<T>& x) {
  return forward_at(x, 0);
}

template <class T>
Buffer<T> PositionalEncoding<T>::forward_at(const Buffer<T>& x, std::size_t offset) {
  const std::size_t B = x.dim(0), Tn = x.dim(1), C = dim_;
  if (offset == 0) {
    check_arg(Tn <= max_len_, "PositionalEncoding", "x (B, T, C)",
              "T <= max_len = " + std::to_string(max_len_), "T = " + std::to_string(Tn));
  } else {
    check_arg(offset + Tn <= max_len_, "PositionalEncoding", "positions offset + T",
              "<= max_len = " + std::to_string(max_len_),
              std::to_string(offset) + " + " + std::to_string(Tn));
  }
  if (kind_ == PositionEncoding::none || kind_ == PositionEncoding::rope) return x;
  DeviceOps<T>& ops = this->ops();
  const T* pos = table.value_data();
  if (kind_ == PositionEncoding::sinusoidal) {
    if (fixed_.empty()) fixed_ = to_buffer<T>(ops, table.value);
    pos = fixed_.data();
  }
  Buffer<T>& y = Buffer<T>::reuse(y_, ops, x.shape());
  ops.copy(y.data(), x.data(), x.size() * sizeof(T));
  pos += offset * C;
  ops.add_bias(y.data(), pos, B, Tn * C);  // y[b] = x[b] + pos[offset:offset+T] as one row
  return y;
}

template <class T>
Buffer<T> PositionalEncoding<T>::backward_impl(const Buffer<T>& dy) {
  if (kind_ == PositionEncoding::learned) {
    DeviceOps<T>& ops = this->ops();
    const std::size_t B = dy.dim(0), n = dy.dim(1) * dim_;
    // dpos[t] = Σ_b dy[b, t], b in order; the rows t >= T get nothing.
    Buffer<T>& dpos = Buffer<T>::reuse(dpos_, ops, {n});
    ops.column_sum(dpos.data(), dy.data(), B, n);
    ops.add(table.grad_data(), table.grad_data(), dpos.data(), n);
  }
  return dy;
}

template Tensor2<float> sinusoidal_table<float>(std::size_t, std::size_t);
template Tensor2<double> sinusoidal_table<double>(std::size_t, std::size_t);
template class PositionalEncoding<float>;
template class PositionalEncoding<double>;

}  // namespace attnlab
