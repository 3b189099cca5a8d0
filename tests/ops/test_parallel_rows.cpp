// The row-parallel ops (norms, activations, cross-entropy, embedding, positional encoding, head
// split/merge) on tensors large enough to be cut into 2 chunks: 2 threads give the numbers of 1
// thread (row-local results bit for bit; sums over rows to rounding), and a fixed thread count
// gives the same bits on every run.
#include <doctest/doctest.h>

#include <utility>

#include "attnlab/nn/multi_head_attention.hpp"
#include "attnlab/nn/positional.hpp"
#include "attnlab/ops/cross_entropy.hpp"
#include "attnlab/ops/embedding.hpp"
#include "attnlab/ops/gelu.hpp"
#include "attnlab/ops/layernorm.hpp"
#include "attnlab/ops/relu.hpp"
#include "attnlab/ops/rmsnorm.hpp"
#include "attnlab/random.hpp"
#include "attnlab/threads.hpp"
#include "helpers.hpp"

using namespace attnlab;

namespace {

// Runs f at 1 thread, then twice at 2 threads; restores 1 thread (the test default).
template <class F>
auto at_1_2_2(F f) {
  set_num_threads(1);
  auto one = f();
  set_num_threads(2);
  auto two = f();
  auto again = f();
  set_num_threads(1);
  return std::tuple{one, two, again};
}

constexpr std::size_t kRows = 700, kWidth = 64;  // 44800 elements: 2 chunks at 2 threads

}  // namespace

TEST_CASE("layernorm and rmsnorm with 2 threads: same numbers as 1 thread, and deterministic") {
  Rng rng(51);
  const auto x = randn<double, 3>({7, kRows / 7, kWidth}, rng);
  const auto dy = randn<double, 3>({7, kRows / 7, kWidth}, rng);
  const auto gamma = randn<double, 1>({kWidth}, rng);
  const auto beta = randn<double, 1>({kWidth}, rng);
  const auto [l1, l2, l3] = at_1_2_2([&] {
    LayerNormCache<double, 3> cache;
    auto y = layernorm_forward<double, 3>(cache, x, gamma, beta);
    return std::pair{y, layernorm_backward<double, 3>(dy, cache, gamma)};
  });
  CHECK(l1.first == l2.first);  // row-local: bit-identical
  CHECK(l1.second.dx == l2.second.dx);
  CHECK(test::rel_error(l1.second.dgamma, l2.second.dgamma) < 1e-14);  // 2 partial row sums
  CHECK(test::rel_error(l1.second.dbeta, l2.second.dbeta) < 1e-14);
  CHECK(l2.second.dgamma == l3.second.dgamma);
  CHECK(l2.second.dbeta == l3.second.dbeta);

  const auto [r1, r2, r3] = at_1_2_2([&] {
    RmsNormCache<double, 3> cache;
    auto y = rmsnorm_forward<double, 3>(cache, x, gamma);
    return std::pair{y, rmsnorm_backward<double, 3>(dy, cache, gamma)};
  });
  CHECK(r1.first == r2.first);
  CHECK(r1.second.dx == r2.second.dx);
  CHECK(test::rel_error(r1.second.dgamma, r2.second.dgamma) < 1e-14);
  CHECK(r2.second.dgamma == r3.second.dgamma);
}

TEST_CASE("gelu and relu with 2 threads: bit-identical to 1 thread, odd sizes included") {
  Rng rng(52);
  for (std::size_t extra : {0, 1, 13}) {  // SIMD tails at the end only
    CAPTURE(extra);
    const auto x = randn<float, 2>({kRows, kWidth + extra}, rng, 2.0);
    const auto dy = randn<float, 2>({kRows, kWidth + extra}, rng);
    for (auto a : {GeluApproximation::tanh, GeluApproximation::exact}) {
      const auto [g1, g2, g3] = at_1_2_2([&] {
        GeluCache<float, 2> cache;
        auto y = gelu_forward<float, 2>(cache, x, a);
        return std::pair{y, gelu_backward<float, 2>(dy, cache)};
      });
      CHECK(g1.first == g2.first);
      CHECK(g1.second == g2.second);
      CHECK(g2.second == g3.second);
    }
    const auto [r1, r2, r3] = at_1_2_2([&] {
      ReluCache<float, 2> cache;
      auto y = relu_forward<float, 2>(cache, x);
      return std::pair{y, relu_backward<float, 2>(dy, cache)};
    });
    CHECK(r1.first == r2.first);
    CHECK(r1.second == r2.second);
  }
}

TEST_CASE("cross-entropy and embedding with 2 threads: bit-identical to 1 thread") {
  Rng rng(53);
  constexpr std::size_t V = 40;
  const auto logits = randn<float, 3>({10, 100, V}, rng, 3.0);  // 40000 logits
  xt::xtensor<int, 2> targets({10, 100});
  for (std::size_t i = 0; i < targets.size(); ++i) {
    targets.data()[i] = i % 7 == 3 ? kIgnoreIndex : static_cast<int>(rng.below(V));  // some ignored
  }
  const auto [c1, c2, c3] =
      at_1_2_2([&] { return softmax_cross_entropy<float, 3>(logits, targets); });
  CHECK(c1.loss == c2.loss);  // row losses summed in row order whatever the cut
  CHECK(c1.labelled == c2.labelled);
  CHECK(c1.dlogits == c2.dlogits);
  CHECK(c2.loss == c3.loss);

  const auto table = randn<double, 2>({V, kWidth}, rng);
  TokenIds ids({7, kRows / 7});
  for (std::size_t i = 0; i < ids.size(); ++i) {
    ids.data()[i] = i % 11 == 5 ? kNoToken : static_cast<int>(rng.below(V));
  }
  const auto [e1, e2, e3] = at_1_2_2([&] {
    EmbeddingCache cache;
    return embedding_forward<double>(cache, ids, table);
  });
  CHECK(e1 == e2);
  TokenIds bad = ids;
  bad(6, 99) = static_cast<int>(V);  // the last position: still caught before the parallel copy
  set_num_threads(2);
  EmbeddingCache cache;
  CHECK_THROWS_AS(embedding_forward<double>(cache, bad, table), std::invalid_argument);
  set_num_threads(1);
}

TEST_CASE("split_heads and merge_heads with 2 threads: exact inverses, equal to 1 thread") {
  Rng rng(54);
  for (std::size_t heads : {1, 4}) {
    CAPTURE(heads);
    const auto x = randn<double, 3>({6, 50, 32 * heads}, rng);
    const auto [s1, s2, s3] = at_1_2_2([&] {
      auto split = split_heads<double>(x, heads);  // (B,T,H·D) -> (B,H,T,D)
      return std::pair{split, merge_heads<double>(split)};
    });
    CHECK(s1.first == s2.first);
    CHECK(s2.second == x);
    for (std::size_t h = 0; h < heads; ++h) {  // spot check the layout: x[b, t, h·D + d]
      CHECK(s2.first(5, h, 49, 31) == x(5, 49, h * 32 + 31));
    }
  }
}

TEST_CASE("MHA and positional encoding with 2 threads: same numbers as 1 thread, deterministic") {
  for (std::size_t heads : {1, 2}) {
    CAPTURE(heads);
    AttentionConfig config;
    config.d_model = 32;
    config.heads = heads;
    config.d_k = 48;
    config.sdpa.causal = true;
    Rng data_rng(55);
    const auto x = randn<double, 3>({16, 64, 32}, data_rng);
    const auto dy = randn<double, 3>({16, 64, 32}, data_rng);
    const auto [m1, m2, m3] = at_1_2_2([&] {
      Rng rng(56);
      MultiHeadAttention<double> mha(config, rng);
      PositionalEncoding<double> pos(PositionEncoding::learned, 64, 32, rng);
      auto y = mha.forward(pos.forward(x));
      auto dx = pos.backward(mha.backward(dy));
      return std::tuple{y, dx, mha.w_q.grad, pos.table.grad};
    });
    CHECK(test::rel_error(std::get<0>(m1), std::get<0>(m2)) < 1e-14);
    CHECK(test::rel_error(std::get<1>(m1), std::get<1>(m2)) < 1e-14);
    CHECK(test::rel_error(std::get<2>(m1), std::get<2>(m2)) < 1e-14);
    CHECK(std::get<3>(m1) == std::get<3>(m2));  // sums over b in batch order at any cut
    CHECK(std::get<0>(m2) == std::get<0>(m3));
    CHECK(std::get<1>(m2) == std::get<1>(m3));
    CHECK(std::get<2>(m2) == std::get<2>(m3));
  }
}
