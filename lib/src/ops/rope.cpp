#include "attnlab/ops/rope.hpp"

#include <cmath>
#include <string>

#include "../parallel_rows.hpp"
#include "attnlab/kernel_math.hpp"
#include "kernels/rope.hpp"

namespace attnlab {

namespace detail {

template <class T>
void rope_rows(T* x, const T* cos, const T* sin, const kernel_math::RopeShape& shape) {
  const std::size_t half = shape.rot / 2;
  if (half == 0) return;
  for_row_chunks(shape.slices * shape.Tn, shape.rot,
                 [&](std::size_t r0, std::size_t r1, std::size_t) {
                   for (std::size_t pair = r0 * half; pair < r1 * half; ++pair) {
                     kernel_math::rope_element(x, cos, sin, shape, pair);
                   }
                 });
}

}  // namespace detail

std::size_t rope_dims(std::string_view op, const RopeOptions& options, std::size_t D,
                      const std::string& prefix) {
  check_arg(std::isfinite(options.theta) && options.theta > 0, op, prefix + "rope_theta",
            "a finite base > 0", std::to_string(options.theta));
  check_arg(std::isfinite(options.fraction) && options.fraction > 0 && options.fraction <= 1, op,
            prefix + "rope_fraction", "a fraction of the head dim in (0, 1]",
            std::to_string(options.fraction));
  const auto rot = static_cast<std::size_t>(std::floor(options.fraction * double(D) + 1e-9));
  check_arg(rot >= 2 && rot % 2 == 0, op, prefix + "rope_fraction",
            "floor(fraction * d_k) even and >= 2 (d_k = " + std::to_string(D) + ")",
            std::to_string(options.fraction) + " (" + std::to_string(rot) + " dims)");
  return rot;
}

RopeTable rope_table(const RopeOptions& options, std::size_t D, std::size_t positions) {
  const std::size_t rot = rope_dims("rope_table", options, D);
  RopeTable table;
  table.positions = positions;
  table.half = rot / 2;
  table.cos.resize(positions * table.half);
  table.sin.resize(positions * table.half);
  for (std::size_t i = 0; i < table.half; ++i) {
    const double frequency = std::pow(options.theta, -2.0 * double(i) / double(rot));
    for (std::size_t p = 0; p < positions; ++p) {
      const double angle = double(p) * frequency;
      table.cos[p * table.half + i] = std::cos(angle);
      table.sin[p * table.half + i] = std::sin(angle);
    }
  }
  return table;
}

namespace {
template <class T>
Tensor4<T> rotate(const char* op, const Tensor4<T>& x, const RopeOptions& options,
                  std::size_t offset, bool inverse) {
  const std::size_t B = x.shape()[0], H = x.shape()[1], Tn = x.shape()[2], D = x.shape()[3];
  const std::size_t rot = rope_dims(op, options, D);
  const RopeTable table = rope_table(options, D, offset + Tn);
  const std::vector<T> cos(table.cos.begin(), table.cos.end());
  const std::vector<T> sin(table.sin.begin(), table.sin.end());
  Tensor4<T> y = x;
  detail::rope_rows(y.data(), cos.data(), sin.data(),
                    kernel_math::RopeShape{.slices = B * H,
                                           .Tn = Tn,
                                           .D = D,
                                           .rot = rot,
                                           .offset = offset,
                                           .interleaved = options.interleaved,
                                           .inverse = inverse});
  return y;
}
}  // namespace

template <class T>
Tensor4<T> rope_forward(const Tensor4<T>& x, const RopeOptions& options, std::size_t offset) {
  return rotate("rope_forward", x, options, offset, false);
}

template <class T>
Tensor4<T> rope_backward(const Tensor4<T>& dy, const RopeOptions& options, std::size_t offset) {
  return rotate("rope_backward", dy, options, offset, true);
}

template Tensor4<float> rope_forward<float>(const Tensor4<float>&, const RopeOptions&, std::size_t);
template Tensor4<double> rope_forward<double>(const Tensor4<double>&, const RopeOptions&,
                                              std::size_t);
template Tensor4<float> rope_backward<float>(const Tensor4<float>&, const RopeOptions&,
                                             std::size_t);
template Tensor4<double> rope_backward<double>(const Tensor4<double>&, const RopeOptions&,
                                               std::size_t);
template void detail::rope_rows<float>(float*, const float*, const float*,
                                       const kernel_math::RopeShape&);
template void detail::rope_rows<double>(double*, const double*, const double*,
                                        const kernel_math::RopeShape&);

}  // namespace attnlab
