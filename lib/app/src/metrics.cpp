#include "attnlab/app/metrics.hpp"

#include <algorithm>
#include <cmath>
#include <limits>

namespace attnlab::app {

template <class T>
double softmax_jacobian_norm(const T* p, std::size_t n) {
  double s2 = 0, s3 = 0;
  for (std::size_t j = 0; j < n; ++j) {
    const double x = static_cast<double>(p[j]);
    s2 += x * x;
    s3 += x * x * x;
  }
  return std::sqrt(std::max(0.0, s2 - 2 * s3 + s2 * s2));
}

template <class T>
std::vector<HeadHealth> attention_health(const Tensor4<T>& weights, const Tensor4<T>& scores) {
  const auto& s = weights.shape();
  const std::size_t B = s[0], H = s[1], Tq = s[2], Tk = s[3];
  const bool has_scores = scores.size() > 0;
  if (has_scores)
    check_shape("attention_health", "scores", scores,
                {static_cast<std::ptrdiff_t>(B), static_cast<std::ptrdiff_t>(H),
                 static_cast<std::ptrdiff_t>(Tq), static_cast<std::ptrdiff_t>(Tk)});
  std::vector<HeadHealth> out(H);
  for (std::size_t h = 0; h < H; ++h) {
    HeadHealth& r = out[h];
    std::size_t rows = 0;
    double max_logit = has_scores ? 0.0 : std::numeric_limits<double>::quiet_NaN();
    for (std::size_t b = 0; b < B; ++b)
      for (std::size_t i = 0; i < Tq; ++i) {
        const std::size_t offset = ((b * H + h) * Tq + i) * Tk;
        const T* p = weights.data() + offset;
        if (has_scores)
          for (std::size_t j = 0; j < Tk; ++j) {
            const double x = static_cast<double>(scores.data()[offset + j]);
            if (std::isfinite(x)) max_logit = std::max(max_logit, std::abs(x));
          }
        double sum = 0, entropy = 0, top = 0;
        for (std::size_t j = 0; j < Tk; ++j) {
          const double x = static_cast<double>(p[j]);
          sum += x;
          if (x > 0) entropy -= x * std::log(x);
          top = std::max(top, x);
        }
        if (sum <= 0) continue;  // a row that sees no key
        ++rows;
        r.entropy += entropy;
        r.max_weight += top;
        r.saturated_fraction += top > kSaturatedWeight ? 1.0 : 0.0;
        r.jacobian_norm += softmax_jacobian_norm(p, Tk);
      }
    if (rows > 0) {
      const auto n = static_cast<double>(rows);
      r.entropy /= n;
      r.max_weight /= n;
      r.saturated_fraction /= n;
      r.jacobian_norm /= n;
    }
    r.max_abs_logit = max_logit;
  }
  return out;
}

template <class T>
std::vector<double> correct_key_mass(const Tensor4<T>& weights, std::size_t query_row,
                                     const std::vector<int>& key_pos) {
  const auto& s = weights.shape();
  const std::size_t B = s[0], H = s[1], Tq = s[2], Tk = s[3];
  check_arg(query_row < Tq, "correct_key_mass", "query_row", "< Tq = " + std::to_string(Tq),
            std::to_string(query_row));
  check_arg(key_pos.size() == B, "correct_key_mass", "key_pos",
            "B = " + std::to_string(B) + " entries", std::to_string(key_pos.size()));
  std::vector<double> out(H, 0.0);
  std::size_t count = 0;
  for (std::size_t b = 0; b < B; ++b) {
    if (key_pos[b] < 0 || static_cast<std::size_t>(key_pos[b]) >= Tk) continue;
    ++count;
    for (std::size_t h = 0; h < H; ++h)
      out[h] += static_cast<double>(weights(b, h, query_row, static_cast<std::size_t>(key_pos[b])));
  }
  for (double& x : out)
    x = count ? x / static_cast<double>(count) : std::numeric_limits<double>::quiet_NaN();
  return out;
}

template double softmax_jacobian_norm<float>(const float*, std::size_t);
template double softmax_jacobian_norm<double>(const double*, std::size_t);
template std::vector<HeadHealth> attention_health<float>(const Tensor4<float>&,
                                                         const Tensor4<float>&);
template std::vector<HeadHealth> attention_health<double>(const Tensor4<double>&,
                                                          const Tensor4<double>&);
template std::vector<double> correct_key_mass<float>(const Tensor4<float>&, std::size_t,
                                                     const std::vector<int>&);
template std::vector<double> correct_key_mass<double>(const Tensor4<double>&, std::size_t,
                                                      const std::vector<int>&);

}  // namespace attnlab::app
