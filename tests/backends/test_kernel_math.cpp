// The CUDA kernels' shared arithmetic (attnlab/kernel_math.hpp) and the attention score rule of
// every path (attnlab/attention/score_rule.hpp), run on the CPU: the online-softmax merge, the
// softmax-backward element, the causal bounds with a query offset, score_row against score, the
// parameter checks and the index math. These run on every
// machine, with or without CUDA. The last two tests replay the fused kernels' per-row algorithm
// (tiles of keys, running max and sum, P recomputed from the log-sum-exp) with these helpers and
// compare it with the CPU op.
#include <doctest/doctest.h>

#include <cmath>
#include <limits>
#include <vector>

#include <xtensor/xbuilder.hpp>

#include "attnlab/attention/score_rule.hpp"
#include "attnlab/kernel_math.hpp"
#include "attnlab/ops/attention.hpp"
#include "attnlab/ops/softmax.hpp"
#include "attnlab/random.hpp"
#include "helpers.hpp"

using namespace attnlab;
namespace cm = attnlab::kernel_math;

namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();

// log Σ exp(x) over the finite entries, computed directly in long double.
double direct_log_sum_exp(const std::vector<double>& x) {
  long double m = -kInf;
  for (double v : x) m = std::max<long double>(m, v);
  if (m == -kInf) return -kInf;
  long double s = 0;
  for (double v : x) s += v == -kInf ? 0.0L : std::exp(static_cast<long double>(v) - m);
  return static_cast<double>(m + std::log(s));
}

std::vector<double> random_scores(std::size_t n, Rng& rng, double hidden_fraction) {
  std::vector<double> x(n);
  for (auto& v : x) v = rng.uniform() < hidden_fraction ? -kInf : 8.0 * (rng.uniform() - 0.5);
  return x;
}

}  // namespace

TEST_CASE("kernel_math: the online softmax equals the two-pass log-sum-exp for any block split") {
  Rng rng(3);
  for (int trial = 0; trial < 50; ++trial) {
    const std::size_t n = 1 + static_cast<std::size_t>(rng.uniform() * 90);
    const auto x = random_scores(n, rng, trial % 3 == 0 ? 0.5 : 0.1);
    // Element by element.
    cm::OnlineSoftmax<double> one;
    for (double v : x) one.add(v);
    // Blocks of random size, each reduced on its own, then merged (as the kernels' tiles and warps
    // do).
    cm::OnlineSoftmax<double> blocks;
    for (std::size_t start = 0; start < n;) {
      const std::size_t len = 1 + static_cast<std::size_t>(rng.uniform() * 16);
      cm::OnlineSoftmax<double> block;
      for (std::size_t j = start; j < std::min(n, start + len); ++j) block.add(x[j]);
      blocks.merge(block.max, block.sum);
      start += len;
    }
    const double expected = direct_log_sum_exp(x);
    CAPTURE(n);
    if (expected == -kInf) {
      CHECK(one.log_sum_exp() == -kInf);
      CHECK(blocks.log_sum_exp() == -kInf);
    } else {
      CHECK(one.log_sum_exp() == doctest::Approx(expected).epsilon(1e-13));
      CHECK(blocks.log_sum_exp() == doctest::Approx(expected).epsilon(1e-13));
      CHECK(one.max == blocks.max);
    }
  }
}

TEST_CASE("kernel_math: the empty state is the identity of merge, and empty rows give 0 not NaN") {
  cm::OnlineSoftmax<float> empty;
  CHECK(empty.max == -std::numeric_limits<float>::infinity());
  CHECK(empty.sum == 0.0f);
  CHECK(empty.log_sum_exp() == -std::numeric_limits<float>::infinity());
  CHECK(empty.inverse_sum() == 0.0f);
  CHECK(empty.rescale_factor(-std::numeric_limits<float>::infinity()) == 0.0f);
  cm::OnlineSoftmax<float> row;
  row.add(1.5f);
  row.add(-0.5f);
  const cm::OnlineSoftmax<float> before = row;
  row.merge(empty.max, empty.sum);
  CHECK(row.max == before.max);
  CHECK(row.sum == before.sum);
  empty.merge(before.max, before.sum);
  CHECK(empty.max == before.max);
  CHECK(empty.sum == before.sum);
  // All hidden: every helper stays finite or -inf, never NaN.
  cm::OnlineSoftmax<double> hidden;
  for (int j = 0; j < 5; ++j) hidden.add(-kInf);
  CHECK(hidden.sum == 0.0);
  CHECK(!std::isnan(hidden.log_sum_exp()));
  CHECK(cm::exp_shifted(-kInf, -kInf) == 0.0);
  CHECK(cm::weight_from_lse(0.3, -kInf) == 0.0);
  CHECK(cm::weight_from_lse(-kInf, 0.7) == 0.0);
}

TEST_CASE("kernel_math: rescale_factor carries earlier sums to a new max") {
  cm::OnlineSoftmax<double> state;
  state.add(1.0);
  state.add(2.0);
  const double m_new = 5.0;
  // Σ exp(x − m_new) over the old scores = old sum · rescale_factor(m_new)
  CHECK(state.sum * state.rescale_factor(m_new) ==
        doctest::Approx(std::exp(1.0 - m_new) + std::exp(2.0 - m_new)).epsilon(1e-15));
  CHECK(state.rescale_factor(state.max) == 1.0);
}

TEST_CASE("kernel_math: the softmax-backward element equals the Jacobian product") {
  Rng rng(5);
  const auto s = randn<double, 1>({7}, rng);
  const auto dp = randn<double, 1>({7}, rng);
  Tensor1<double> p = softmax_forward<double, 1>(s);
  const auto jac = softmax_jacobian(p);
  double dot = 0;
  for (std::size_t j = 0; j < 7; ++j) dot += dp(j) * p(j);
  for (std::size_t i = 0; i < 7; ++i) {
    double expected = 0;  // (J dp)_i, J symmetric
    for (std::size_t j = 0; j < 7; ++j) expected += jac(i, j) * dp(j);
    CHECK(cm::softmax_backward_element(p(i), dp(i), dot) ==
          doctest::Approx(expected).epsilon(1e-13));
  }
  // A hidden position (p = 0) gives exactly 0 whatever dp is.
  CHECK(cm::softmax_backward_element(0.0, std::numeric_limits<double>::quiet_NaN(), 0.2) == 0.0);
  CHECK(cm::softmax_backward_element(0.0f, std::numeric_limits<float>::infinity(), 0.2f) == 0.0f);
}

namespace {

// The parameters of a (1, 1, Tq, Tk) call with a key mask (B = 1) or none.
AttentionParams<double> rule_params(std::size_t Tq, std::size_t Tk, bool causal, std::size_t offset,
                                    const std::vector<unsigned char>* mask = nullptr) {
  AttentionParams<double> p;
  p.B = p.H = p.Hkv = 1, p.Tq = Tq, p.Tk = Tk, p.D = p.Dv = 1;
  p.causal = causal;
  p.query_offset = offset;
  p.key_mask = mask ? mask->data() : nullptr;
  return p;
}

}  // namespace

TEST_CASE("attention score rule: causal bounds agree with key_visible, for any query offset") {
  for (std::size_t Tq : {1, 3, 7}) {
    for (std::size_t Tk : {1, 4, 7, 9}) {
      for (bool causal : {false, true}) {
        for (std::size_t offset : {0, 1, 3, 12}) {
          if (!causal && offset != 0) continue;
          CAPTURE(Tq);
          CAPTURE(Tk);
          CAPTURE(causal);
          CAPTURE(offset);
          const auto p = rule_params(Tq, Tk, causal, offset);
          for (std::size_t i = 0; i < Tq; ++i) {
            std::size_t visible = 0, last = 0;
            for (std::size_t j = 0; j < Tk; ++j) {
              if (attention::key_visible(p, 0, i, j)) {
                ++visible;
                last = j;
              }
              CHECK(attention::key_visible(p, 0, i, j) == (!causal || j <= i + offset));
            }
            CHECK(attention::key_end(p, i) == visible);  // keys [0, end) are visible
            if (visible > 0) CHECK(last + 1 == visible);
          }
          for (std::size_t j = 0; j < Tk; ++j) {
            std::size_t first = Tq;
            for (std::size_t i = Tq; i-- > 0;) {
              if (attention::key_visible(p, 0, i, j)) first = i;
            }
            // No query before query_begin sees key j.
            if (first < Tq) CHECK(attention::query_begin(p, j) == first);
            if (first == Tq) CHECK(attention::query_begin(p, j) >= Tq);
          }
        }
      }
    }
  }
  const std::vector<unsigned char> mask = {1, 1, 0, 1, 1};
  const auto masked = rule_params(6, 5, false, 0, &mask);
  CHECK_FALSE(attention::key_visible(masked, 0, 4, 2));  // the mask hides regardless of causality
  CHECK(attention::key_visible(rule_params(6, 5, true, 0), 0, 4, 2));
  CHECK_FALSE(attention::key_visible(rule_params(6, 5, true, 0), 0, 2, 4));
  CHECK(attention::key_visible(rule_params(6, 5, true, 2), 0, 2, 4));  // j <= i + o
}

TEST_CASE(
    "attention score rule: score_row equals score element by element, with window, ALiBi, bias "
    "and softcap") {
  Rng rng(5);
  const std::size_t Tq = 6, Tk = 23;
  std::vector<unsigned char> mask(2 * Tk);
  for (auto& m : mask) m = rng.uniform() < 0.7 ? 1 : 0;
  const double slope = 0.3;
  std::vector<double> bias(2 * Tq * Tk);  // (B, 1, Tq, Tk): broadcast over the heads
  for (auto& x : bias) x = rng.uniform() - 0.5;
  for (bool causal : {false, true}) {
    for (std::size_t offset : {0, 4, 30}) {
      for (bool masked : {false, true}) {
        // plain, window 3, ALiBi, ALiBi and bias, ALiBi and bias and softcap 0.9
        for (std::size_t variant = 0; variant < 5; ++variant) {
          if (!causal && offset != 0) continue;
          if (!causal && variant == 1) continue;
          AttentionParams<double> p = rule_params(Tq, Tk, causal, offset);
          p.B = 2;
          p.key_mask = masked ? mask.data() : nullptr;
          if (variant == 1) p.window = 3;
          if (variant >= 2) p.alibi_slopes = &slope;
          if (variant >= 3) p.bias = bias.data(), p.bias_batch_stride = Tq * Tk;
          if (variant == 4) p.softcap = 0.9;
          CAPTURE(variant);
          for (std::size_t b = 0; b < 2; ++b) {
            for (std::size_t i = 0; i < Tq; ++i) {
              for (std::size_t j0 : {0, 3, 9}) {
                for (std::size_t n : {std::size_t{1}, std::size_t{5}, Tk - j0}) {
                  CAPTURE(causal);
                  CAPTURE(offset);
                  CAPTURE(masked);
                  CAPTURE(i);
                  CAPTURE(j0);
                  std::vector<double> dots(n), row(n), expected(n);
                  for (auto& x : dots) x = 4.0 * (rng.uniform() - 0.5);
                  for (std::size_t c = 0; c < n; ++c) {
                    expected[c] = attention::score(p, b, 0, i, j0 + c, 0.37, dots[c]);
                    row[c] = 0.37 * dots[c];  // what a GEMM with alpha = s_h gives
                  }
                  attention::score_row(p, b, 0, i, j0, n, row.data());
                  CHECK(row == expected);  // bit for bit: the same products
                }
              }
            }
          }
        }
      }
    }
  }
  // A NaN dot stays NaN at a visible key and is hidden at a hidden one.
  const auto p = rule_params(2, 3, true, 0);
  const double nan = std::numeric_limits<double>::quiet_NaN();
  CHECK(std::isnan(attention::score(p, 0, 0, 1, 0, 0.5, nan)));
  CHECK(attention::score(p, 0, 0, 0, 1, 0.5, nan) == -kInf);
}

TEST_CASE("attention params: kv_head_of, Hkv divides H, a window needs causal, dropout p < 1") {
  AttentionParams<float> p;
  p.B = 1, p.H = 8, p.Hkv = 8, p.Tq = p.Tk = 4, p.D = p.Dv = 2;
  for (std::size_t h = 0; h < 8; ++h) CHECK(p.kv_head_of(h) == h);
  CHECK(p.kv_slice_of(8 + 3) == 8 + 3);
  CHECK_NOTHROW(check_attention_params(p, "op"));
  AttentionSpec grouped = p;
  grouped.Hkv = 2;  // the mapping is in place for grouped-query attention: 4 query heads per K/V
  CHECK(grouped.kv_head_of(5) == 1);
  CHECK(grouped.kv_slice_of(8 + 5) == 2 + 1);
  CHECK_NOTHROW(check_attention_spec(grouped, "op"));  // grouped-query attention runs
  grouped.Hkv = 3;
  CHECK_THROWS_WITH_AS(check_attention_spec(grouped, "op"),
                       "op: Hkv (key/value heads) expected a divisor of H = 8, got 3",
                       std::invalid_argument);
  grouped.Hkv = 0;
  CHECK_THROWS_AS(check_attention_spec(grouped, "op"), std::invalid_argument);
  const auto refused = [&](auto change, const char* message) {
    AttentionParams<float> bad = p;
    change(bad);
    CHECK_THROWS_WITH_AS(check_attention_params(bad, "op"), doctest::Contains(message),
                         std::invalid_argument);
  };
  refused([](auto& a) { a.window = 3; }, "op: window expected 0 without causal");
  refused([](auto& a) { a.dropout_p = 1.0; }, "op: dropout_p expected a probability in [0, 1)");
  const float bias = 0, slopes = 0;
  AttentionParams<float> with_alibi = p;  // ALiBi and the bias run on every path
  with_alibi.alibi_slopes = &slopes;
  with_alibi.bias = &bias;
  CHECK_NOTHROW(check_attention_params(with_alibi, "op"));
  refused([](auto& a) { a.query_offset = 1; }, "op: query_offset expected 0 without causal");
}

TEST_CASE("kernel_math: index math matches the xtensor layouts") {
  Tensor4<double> t = xt::zeros<double>({2, 3, 5, 4});
  for (std::size_t b = 0; b < 2; ++b) {
    for (std::size_t h = 0; h < 3; ++h) {
      const std::size_t bh = b * 3 + h;
      CHECK(cm::batch_of(bh, 3) == b);
      CHECK(cm::head_of(bh, 3) == h);
      for (std::size_t i = 0; i < 5; ++i) {
        for (std::size_t j = 0; j < 4; ++j) {
          CHECK(cm::bhrc_offset(bh, i, j, 5, 4) ==
                static_cast<std::size_t>(&t(b, h, i, j) - t.data()));
        }
      }
    }
  }
  KeyMask mask = xt::ones<bool>({3, 6});
  for (std::size_t b = 0; b < 3; ++b) {
    for (std::size_t j = 0; j < 6; ++j) {
      CHECK(cm::key_mask_offset(b, j, 6) == static_cast<std::size_t>(&mask(b, j) - mask.data()));
    }
  }
  CHECK(cm::tile_count(64, 64) == 1);
  CHECK(cm::tile_count(65, 64) == 2);
  CHECK(cm::tile_count(1, 16) == 1);
  CHECK(cm::round_up(1, 64) == 64);
  CHECK(cm::round_up(64, 64) == 64);
  CHECK(cm::round_up(257, 64) == 320);
}

namespace {

struct FusedReplay {
  Tensor4<double> out;  // (B,H,Tq,Dv)
  Tensor3<double> lse;  // (B,H,Tq)
};

// The fused forward kernel's algorithm for every row, in scalar C++: key tiles of `tile`, tile max,
// P = exp_shifted(S, new max), O ← rescale · O + P V, then O · inverse_sum and the log-sum-exp.
FusedReplay replay_fused_forward(const Tensor4<double>& q, const Tensor4<double>& k,
                                 const Tensor4<double>& v, double s, bool causal,
                                 const KeyMask* mask, std::size_t tile) {
  const std::size_t B = q.shape()[0], H = q.shape()[1], Tq = q.shape()[2], D = q.shape()[3];
  const std::size_t Tk = k.shape()[2], Dv = v.shape()[3];
  FusedReplay r{Tensor4<double>({B, H, Tq, Dv}), Tensor3<double>({B, H, Tq})};
  const std::vector<unsigned char> mask_bytes =
      mask ? std::vector<unsigned char>(mask->begin(), mask->end()) : std::vector<unsigned char>();
  AttentionParams<double> p;
  p.B = B, p.H = p.Hkv = H, p.Tq = Tq, p.Tk = Tk, p.D = D, p.Dv = Dv;
  p.causal = causal;
  p.key_mask = mask ? mask_bytes.data() : nullptr;
  for (std::size_t b = 0; b < B; ++b) {
    for (std::size_t h = 0; h < H; ++h) {
      for (std::size_t i = 0; i < Tq; ++i) {
        cm::OnlineSoftmax<double> state;
        std::vector<double> o(Dv, 0.0);
        const std::size_t key_end = attention::key_end(p, i);
        for (std::size_t j0 = 0; j0 < key_end; j0 += tile) {
          std::vector<double> sc(tile, -kInf);
          double tile_max = -kInf;
          for (std::size_t c = 0; c < tile && j0 + c < Tk; ++c) {
            const std::size_t j = j0 + c;
            double dot = 0;
            for (std::size_t d = 0; d < D; ++d) dot += q(b, h, i, d) * k(b, h, j, d);
            sc[c] = attention::score(p, b, h, i, j, s, dot);
            tile_max = std::max(tile_max, sc[c]);
          }
          const double new_max = cm::max_of(state.max, tile_max);
          const double rescale = state.rescale_factor(new_max);
          double tile_sum = 0;
          for (double& x : o) x *= rescale;
          for (std::size_t c = 0; c < tile && j0 + c < Tk; ++c) {
            const double p = cm::exp_shifted(sc[c], new_max);
            tile_sum += p;
            for (std::size_t e = 0; e < Dv; ++e) o[e] += p * v(b, h, j0 + c, e);
          }
          state.sum = state.sum * rescale + tile_sum;
          state.max = new_max;
        }
        for (std::size_t e = 0; e < Dv; ++e) r.out(b, h, i, e) = o[e] * state.inverse_sum();
        r.lse(b, h, i) = state.log_sum_exp();
      }
    }
  }
  return r;
}

}  // namespace

TEST_CASE("kernel_math: replaying the fused forward with these helpers matches the CPU op") {
  Rng rng(17);
  const std::size_t B = 2, H = 2, Tq = 9, Tk = 11, D = 5, Dv = 3;
  const auto q = randn<double, 4>({B, H, Tq, D}, rng);
  const auto k = randn<double, 4>({B, H, Tk, D}, rng);
  const auto v = randn<double, 4>({B, H, Tk, Dv}, rng);
  KeyMask mask = xt::ones<bool>({B, Tk});
  for (std::size_t j = 0; j < Tk; ++j) mask(1, j) = j % 3 == 1;  // batch 1: keys 1, 4, 7, 10
  for (bool causal : {false, true}) {
    for (std::size_t tile : {1, 4, 16}) {
      CAPTURE(causal);
      CAPTURE(tile);
      SdpaOptions options;
      options.causal = causal;
      SdpaCache<double> cache;
      const auto expected = sdpa_forward(cache, q, k, v, options, &mask);
      const double s = resolve_scale(options, D);
      const auto replay = replay_fused_forward(q, k, v, s, causal, &mask, tile);
      CHECK(test::rel_error(replay.out, expected) < 1e-14);
      // lse against the CPU op's scores; with causal, query 0 of batch 1 sees no key (key 0
      // hidden).
      const auto scores = sdpa_scores(q, k, options, &mask);
      for (std::size_t b = 0; b < B; ++b) {
        for (std::size_t h = 0; h < H; ++h) {
          for (std::size_t i = 0; i < Tq; ++i) {
            std::vector<double> row(Tk);
            for (std::size_t j = 0; j < Tk; ++j) row[j] = scores(b, h, i, j);
            const double lse = direct_log_sum_exp(row);
            if (lse == -kInf) {
              CHECK(replay.lse(b, h, i) == -kInf);
              for (std::size_t e = 0; e < Dv; ++e) CHECK(replay.out(b, h, i, e) == 0.0);
            } else {
              CHECK(replay.lse(b, h, i) == doctest::Approx(lse).epsilon(1e-13));
            }
          }
        }
      }
      if (causal) CHECK(replay.lse(1, 0, 0) == -kInf);
    }
  }
}

TEST_CASE(
    "kernel_math: P from the log-sum-exp and D = rowsum(dO * O) give the CPU op's gradients") {
  Rng rng(19);
  const std::size_t B = 1, H = 2, Tq = 6, Tk = 7, D = 4, Dv = 3;
  const auto q = randn<double, 4>({B, H, Tq, D}, rng);
  const auto k = randn<double, 4>({B, H, Tk, D}, rng);
  const auto v = randn<double, 4>({B, H, Tk, Dv}, rng);
  const auto dout = randn<double, 4>({B, H, Tq, Dv}, rng);
  KeyMask mask = xt::ones<bool>({B, Tk});
  mask(0, 0) = false;  // with causal, query 0 sees nothing
  SdpaOptions options;
  options.causal = true;
  SdpaCache<double> cache;
  const auto out = sdpa_forward(cache, q, k, v, options, &mask);
  const auto g = sdpa_backward(dout, cache, q, k, v);
  const double s = resolve_scale(options, D);
  const auto replay = replay_fused_forward(q, k, v, s, true, &mask, 4);
  const AttentionParams<double> params = cache.params(q.data(), k.data(), v.data());
  // The flash backward's dQ, from the helpers: dQ_i = s Σ_j dS_ij k_j, dS_ij = P_ij (dP_ij − D_i).
  Tensor4<double> dq = xt::zeros<double>({B, H, Tq, D});
  for (std::size_t h = 0; h < H; ++h) {
    for (std::size_t i = 0; i < Tq; ++i) {
      double row_dot = 0;  // D_i = rowsum(dO ⊙ O)
      for (std::size_t e = 0; e < Dv; ++e) row_dot += dout(0, h, i, e) * out(0, h, i, e);
      for (std::size_t j = 0; j < Tk; ++j) {
        double score = 0, dp = 0;
        for (std::size_t d = 0; d < D; ++d) score += q(0, h, i, d) * k(0, h, j, d);
        for (std::size_t e = 0; e < Dv; ++e) dp += dout(0, h, i, e) * v(0, h, j, e);
        const double p = cm::weight_from_lse(attention::score(params, 0, h, i, j, s, score),
                                             replay.lse(0, h, i));
        CHECK(p == doctest::Approx(cache.p(0, h, i, j)).epsilon(1e-13));
        const double ds = s * cm::softmax_backward_element(p, dp, row_dot);
        for (std::size_t d = 0; d < D; ++d) dq(0, h, i, d) += ds * k(0, h, j, d);
      }
    }
  }
  CHECK(test::rel_error(dq, g.dq) < 1e-13);
  for (std::size_t d = 0; d < D; ++d) CHECK(dq(0, 0, 0, d) == 0.0);  // the empty row
}
