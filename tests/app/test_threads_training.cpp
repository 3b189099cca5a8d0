// Training with 1 and with 2 threads: the same loss curve to float tolerance, and bit-identical
// curves for the same thread count. The sizes make every parallel code path run: attention on both
// paths (reference, and fused via causal auto), and linear layers large enough for the gemm split.
#include <doctest/doctest.h>

#include <cstring>
#include <vector>

#include "attnlab/nn/transformer.hpp"
#include "attnlab/ops/cross_entropy.hpp"
#include "attnlab/random.hpp"
#include "attnlab/threads.hpp"
#include "helpers.hpp"

using namespace attnlab;

namespace {

struct ThreadCountGuard {
  ~ThreadCountGuard() { set_num_threads(1); }
};

// Losses of `steps` SGD steps of a 1-layer, 2-head float Transformer on fixed random tokens.
std::vector<float> loss_curve(int threads, bool causal, int steps = 4) {
  set_num_threads(threads);
  Rng rng(17);
  Transformer<float> model(test::threads_test_config(causal), rng);
  auto params = model.parameters();
  const std::size_t B = 2, T = 260;  // B·T = 520 rows: the projections' gemms split over threads
  const TokenIds tokens = test::random_ids(B, T, 11, rng);
  const TokenIds targets = test::random_ids(B, T, 11, rng);
  std::vector<float> losses;
  for (int step = 0; step < steps; ++step) {
    const auto ce = softmax_cross_entropy<float, 3>(model.forward({tokens}), targets);
    losses.push_back(ce.loss);
    model.zero_grad();
    model.backward(ce.dlogits);
    test::sgd_step(params, 0.5f);
  }
  return losses;
}

}  // namespace

TEST_CASE("training: 1 and 2 threads give the same loss curve, a fixed count the same bits") {
  ThreadCountGuard guard;
  for (bool causal : {false, true}) {
    CAPTURE(causal);
    const auto one = loss_curve(1, causal);
    const auto two = loss_curve(2, causal);
    const auto two_again = loss_curve(2, causal);
    REQUIRE(one.size() == two.size());
    CHECK(one.back() < one.front());  // the curve is a real training curve
    for (std::size_t i = 0; i < one.size(); ++i) {
      CHECK(two[i] == doctest::Approx(one[i]).epsilon(1e-5));
    }
    CHECK(std::memcmp(two.data(), two_again.data(), two.size() * sizeof(float)) == 0);
  }
}
