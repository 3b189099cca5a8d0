// Attention written out element by element, with no library code: the definition the variant tests
// compare every path against. softmax over the visible keys of s · q·k + ALiBi's term, times v:
//   visible(b, i, j) = mask(b, j) && (!causal || (j <= i + o && (!w || j + w > i + o)))
//   score(i, j) = cap(s_h · q_i·k_j) - m_h · (i + o - j) + bias(b, h, i, j)
// (the second term with ALiBi slopes m, the third with a bias of shape (1|B, 1|H, Tq, Tk); cap(u)
// = c · tanh(u / c) with options.softcap = c > 0, u without).
// With options.dropout_p > 0 and a keep mask (B,H,Tq,Tk), each weight is multiplied by
// keep / (1 − p) after the softmax.
// Query head h reads K/V head h / (H / Hkv). A row with no visible key gives 0.
#pragma once

#include <cmath>
#include <limits>
#include <vector>

#include <xtensor/xbuilder.hpp>

#include "attnlab/ops/attention.hpp"

namespace attnlab::test {

inline Tensor4<double> dense_attention(const Tensor4<double>& q, const Tensor4<double>& k,
                                       const Tensor4<double>& v, const SdpaOptions& options,
                                       const KeyMask* mask, const Tensor4<double>* bias = nullptr,
                                       const xt::xtensor<bool, 4>* keep = nullptr) {
  const std::size_t B = q.shape()[0], H = q.shape()[1], Tq = q.shape()[2], D = q.shape()[3];
  const std::size_t Hkv = k.shape()[1], Tk = k.shape()[2], Dv = v.shape()[3];
  const std::size_t o = options.query_offset;
  const std::size_t w = options.window;
  const double s = resolve_scale(options, D);
  constexpr double hidden = -std::numeric_limits<double>::infinity();
  Tensor4<double> out = xt::zeros<double>({B, H, Tq, Dv});
  for (std::size_t b = 0; b < B; ++b) {
    for (std::size_t h = 0; h < H; ++h) {
      const std::size_t kv = h / (H / Hkv);
      for (std::size_t i = 0; i < Tq; ++i) {
        std::vector<double> score(Tk, hidden);
        double top = hidden;
        for (std::size_t j = 0; j < Tk; ++j) {
          bool seen = !mask || (*mask)(b, j);
          if (options.causal) seen = seen && j <= i + o && (w == 0 || j + w > i + o);
          if (!seen) continue;
          double dot = 0;
          for (std::size_t c = 0; c < D; ++c) dot += q(b, h, i, c) * k(b, kv, j, c);
          score[j] = s * dot;
          if (options.softcap > 0)
            score[j] = options.softcap * std::tanh(score[j] / options.softcap);
          if (!options.alibi_slopes.empty()) {
            score[j] -= options.alibi_slopes[h] * (double(i + o) - double(j));
          }
          if (bias) {
            score[j] += (*bias)(bias->shape()[0] == 1 ? 0 : b, bias->shape()[1] == 1 ? 0 : h, i, j);
          }
          top = std::max(top, score[j]);
        }
        if (top == hidden) continue;
        double sum = 0;
        for (double& x : score) sum += (x = std::exp(x - top));
        for (std::size_t j = 0; j < Tk; ++j) {
          double weight = score[j] / sum;
          if (options.dropout_p > 0)
            weight *= (*keep)(b, h, i, j) ? 1 / (1 - options.dropout_p) : 0;
          for (std::size_t c = 0; c < Dv; ++c) out(b, h, i, c) += weight * v(b, kv, j, c);
        }
      }
    }
  }
  return out;
}

}  // namespace attnlab::test
