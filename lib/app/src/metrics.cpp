#include "attnlab/app/metrics.hpp"

#include <algorithm>
#include <cmath>
#include <limits>
#include <string>
#include <vector>

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

template <class T>
std::vector<MaxLogitPair> max_logit_pairs(const Tensor4<T>& scores, const Tensor4<T>& q,
                                          const Tensor4<T>& k) {
  const std::size_t B = scores.shape()[0], H = scores.shape()[1], Tq = scores.shape()[2],
                    Tk = scores.shape()[3];
  check_shape("max_logit_pairs", "q", q,
              {std::ptrdiff_t(B), std::ptrdiff_t(H), std::ptrdiff_t(Tq), kAnyExtent});
  const std::size_t D = q.shape()[3], Hkv = k.shape()[1];
  check_shape("max_logit_pairs", "k", k,
              {std::ptrdiff_t(B), kAnyExtent, std::ptrdiff_t(Tk), std::ptrdiff_t(D)});
  check_arg(Hkv > 0 && H % Hkv == 0, "max_logit_pairs", "k's heads", "a divisor of q's heads",
            std::to_string(Hkv));
  std::vector<MaxLogitPair> out(H);
  for (std::size_t h = 0; h < H; ++h) {
    MaxLogitPair& p = out[h];
    double best = -1;
    bool nan = false;
    for (std::size_t b = 0; b < B && !nan; ++b)
      for (std::size_t i = 0; i < Tq && !nan; ++i) {
        const T* row = &scores(b, h, i, 0);
        for (std::size_t j = 0; j < Tk; ++j) {
          if (std::isnan(row[j])) {
            nan = true;  // a diverged eval: the pair is unknown, as the max logit is
            break;
          }
          if (!std::isfinite(row[j])) continue;  // a hidden position
          const double x = std::abs(static_cast<double>(row[j]));
          if (x > best) {
            best = x;
            p.b = b;
            p.i = i;
            p.j = j;
          }
        }
      }
    if (nan || best < 0) {
      out[h] = MaxLogitPair{};
      continue;
    }
    const T* qv = &q(p.b, h, p.i, 0);
    const T* kv = &k(p.b, h / (H / Hkv), p.j, 0);
    double qq = 0, kk = 0, qk = 0;
    for (std::size_t d = 0; d < D; ++d) {
      qq += static_cast<double>(qv[d]) * qv[d];
      kk += static_cast<double>(kv[d]) * kv[d];
      qk += static_cast<double>(qv[d]) * kv[d];
    }
    p.abs_logit = best;
    p.q_norm = std::sqrt(qq);
    p.k_norm = std::sqrt(kk);
    p.cos = qq > 0 && kk > 0 ? qk / (p.q_norm * p.k_norm) : 0.0;
  }
  return out;
}

double spectral_norm(const float* a, std::size_t rows, std::size_t cols, std::size_t ld,
                     int iterations) {
  if (rows == 0 || cols == 0) return 0;
  // A fixed start with no special direction (a zero component on σ₁'s vector is measure zero).
  std::vector<double> v(cols), u(rows);
  for (std::size_t c = 0; c < cols; ++c) v[c] = 1.0 + 0.5 * std::sin(1.0 + 2.0 * double(c));
  const auto normalise = [](std::vector<double>& x) {
    double n = 0;
    for (double e : x) n += e * e;
    n = std::sqrt(n);
    if (n > 0)
      for (double& e : x) e /= n;
    return n;
  };
  const auto times_a = [&] {  // u = A v; returns ‖u‖
    for (std::size_t r = 0; r < rows; ++r) {
      double s = 0;
      for (std::size_t c = 0; c < cols; ++c) s += static_cast<double>(a[r * ld + c]) * v[c];
      u[r] = s;
    }
    double n = 0;
    for (double e : u) n += e * e;
    return std::sqrt(n);
  };
  normalise(v);
  for (int it = 0; it < iterations; ++it) {
    times_a();
    std::fill(v.begin(), v.end(), 0.0);  // v = Aᵀ u
    for (std::size_t r = 0; r < rows; ++r)
      for (std::size_t c = 0; c < cols; ++c) v[c] += static_cast<double>(a[r * ld + c]) * u[r];
    if (normalise(v) == 0) return 0;
  }
  return times_a();
}

std::vector<double> head_spectral_norms(const float* w, std::size_t rows, std::size_t heads,
                                        std::size_t head_dim, int iterations) {
  std::vector<double> out;
  for (std::size_t h = 0; h < heads; ++h)
    out.push_back(spectral_norm(w + h * head_dim, rows, head_dim, heads * head_dim, iterations));
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

template std::vector<MaxLogitPair> max_logit_pairs<float>(const Tensor4<float>&,
                                                          const Tensor4<float>&,
                                                          const Tensor4<float>&);
template std::vector<MaxLogitPair> max_logit_pairs<double>(const Tensor4<double>&,
                                                           const Tensor4<double>&,
                                                           const Tensor4<double>&);

}  // namespace attnlab::app
