// The CPU backend (attnlab/backends/cpu.hpp) at sizes where its kernels split work over threads
// (the one-model device tests use models too small for that): a Transformer moved to its own CPU
// backend instance (Module::to) gives the same bits as one left on the default cpu_ops (one model
// code: only the instance differs), 1 and 2 threads agree to float tolerance, and a fixed thread
// count gives the same bits. Causal attention at T = 260 runs the fused path, the rest the
// reference one.
#include <doctest/doctest.h>

#include <cstring>
#include <vector>

#include "attnlab/backends/cpu.hpp"
#include "attnlab/nn/cross_entropy.hpp"
#include "attnlab/nn/transformer.hpp"
#include "attnlab/ops/cross_entropy.hpp"
#include "attnlab/optim/adamw.hpp"
#include "attnlab/random.hpp"
#include "attnlab/threads.hpp"
#include "helpers.hpp"

using namespace attnlab;

namespace {

struct ThreadCountGuard {
  ~ThreadCountGuard() { set_num_threads(1); }
};

struct Curves {
  std::vector<float> module, device;
};

// Losses of `steps` AdamW steps of a 1-layer, 2-head float Transformer (LayerNorm, MLP) on fixed
// random tokens, on the default CPU backend and on a second instance, from the same weights. B·T =
// 520 rows: the linear layers' gemms and the norms' column sums split over threads.
Curves loss_curves(int threads, bool causal, int steps = 3) {
  set_num_threads(threads);
  Rng rng(17);
  Transformer<float> model(test::threads_test_config(causal), rng);
  const auto params = model.parameters();
  const AdamWOptions options{1e-2, 0.9, 0.95, 1e-8, 0.01};
  AdamW<float> opt(params, options);
  const auto ops = make_cpu_device_ops<float>();
  Rng rng2(17);
  Transformer<float> dev(test::threads_test_config(causal), rng2);
  dev.to(*ops);
  AdamW<float> dopt(dev.parameters(), options);
  CrossEntropyLoss<float> loss;
  const std::size_t B = 2, T = 260;
  const TokenIds tokens = test::random_ids(B, T, 11, rng);
  const TokenIds targets = test::random_ids(B, T, 11, rng);
  Curves curves;
  for (int step = 0; step < steps; ++step) {
    const auto ce = softmax_cross_entropy<float, 3>(model.forward({tokens}), targets);
    curves.module.push_back(ce.loss);
    model.zero_grad();
    model.backward(ce.dlogits);
    opt.step();
    const Buffer<float> logits = dev.forward(dev.upload_fields({tokens}));
    curves.device.push_back(static_cast<float>(loss.forward(*ops, logits, targets)));
    dev.zero_grad();
    dev.backward(loss.dlogits());
    dopt.step();
  }
  return curves;
}

}  // namespace

TEST_CASE(
    "cpu backend: a second instance gives the same bits, 1 and 2 threads agree, a count repeats") {
  ThreadCountGuard guard;
  for (bool causal : {false, true}) {
    CAPTURE(causal);
    const Curves one = loss_curves(1, causal);
    const Curves two = loss_curves(2, causal);
    const Curves two_again = loss_curves(2, causal);
    REQUIRE(one.device.size() == two.device.size());
    CHECK(two.device.back() < two.device.front());  // a real training curve
    for (std::size_t i = 0; i < one.device.size(); ++i) {
      CAPTURE(i);
      CHECK(two.device[i] == two.module[i]);
      CHECK(one.device[i] == one.module[i]);
      CHECK(two.device[i] == doctest::Approx(one.device[i]).epsilon(1e-5));
    }
    CHECK(std::memcmp(two.device.data(), two_again.device.data(),
                      two.device.size() * sizeof(float)) == 0);
  }
}
