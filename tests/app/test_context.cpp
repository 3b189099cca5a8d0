// The explicit context (attnlab/app/context.hpp) and the per-thread thread count
// (attnlab/threads.hpp): a count set on one thread is invisible to the others, ThreadScope restores
// what it replaced, and two std::threads running ops at the same time, at different counts, each
// get exactly the bits of a serial run at their own count. Under the tsan preset the concurrent
// cases are the race check.
#include <doctest/doctest.h>

#include <atomic>
#include <cstring>
#include <latch>
#include <stdexcept>
#include <thread>
#include <utility>
#include <vector>

#include "attnlab/app/context.hpp"
#include "attnlab/nn/transformer.hpp"
#include "attnlab/ops/cross_entropy.hpp"
#include "attnlab/ops/layernorm.hpp"
#include "attnlab/random.hpp"
#include "attnlab/threads.hpp"
#include "helpers.hpp"

using namespace attnlab;
using namespace attnlab::app;

namespace {

// The count a fresh std::thread sees, and the count it sees after setting `n` itself.
std::pair<int, int> counts_on_new_thread(int n) {
  std::pair<int, int> seen{0, 0};
  std::thread([&] {
    seen.first = num_threads();
    set_num_threads(n);
    seen.second = num_threads();
  }).join();
  return seen;
}

// dgamma of a layernorm backward over 700 rows of 64 floats: 44800 elements, 2 chunks at 2 threads,
// whose partial sums are added in chunk order, so the bits depend on the thread count.
std::vector<float> layernorm_dgamma() {
  Rng rng(81);
  const auto x = randn<float, 2>({700, 64}, rng);
  const auto dy = randn<float, 2>({700, 64}, rng);
  const auto gamma = randn<float, 1>({64}, rng);
  const auto beta = randn<float, 1>({64}, rng);
  LayerNormCache<float, 2> cache;
  (void)layernorm_forward<float, 2>(cache, x, gamma, beta);
  const auto g = layernorm_backward<float, 2>(dy, cache, gamma);
  return {g.dgamma.begin(), g.dgamma.end()};
}

// Losses and the final weights of 2 SGD steps of a small causal Transformer (fused attention,
// gemms large enough to split, layernorms): the ops of a training step, all reading the count.
std::vector<float> training_bits() {
  Rng rng(17);
  Transformer<float> model(test::threads_test_config(true), rng);
  auto params = model.parameters();
  const std::size_t B = 2, T = 260;
  const TokenIds tokens = test::random_ids(B, T, 11, rng);
  const TokenIds targets = test::random_ids(B, T, 11, rng);
  std::vector<float> bits;
  for (int step = 0; step < 2; ++step) {
    const auto ce = softmax_cross_entropy<float, 3>(model.forward({tokens}), targets);
    bits.push_back(ce.loss);
    model.zero_grad();
    model.backward(ce.dlogits);
    test::sgd_step(params, 0.5f);
  }
  for (auto& p : params) bits.insert(bits.end(), p.param->value.begin(), p.param->value.end());
  return bits;
}

bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

// Runs f at `threads` threads on this thread (a ThreadScope).
template <class F>
auto serial_at(int threads, F f) {
  ThreadScope scope(threads);
  return f();
}

// Runs f `repeats` times on each of two std::threads at once, one at 1 thread and one at 2; both
// start together (a latch) so that their ops overlap. Returns every result of each thread.
template <class F>
std::pair<std::vector<std::vector<float>>, std::vector<std::vector<float>>> concurrent_1_and_2(
    F f, int repeats) {
  std::vector<std::vector<float>> at_one, at_two;
  std::latch start(2);
  const auto job = [&](int threads, std::vector<std::vector<float>>& out) {
    ThreadScope scope(threads);
    start.arrive_and_wait();
    for (int r = 0; r < repeats; ++r) {
      out.push_back(f());
      CHECK(num_threads() == threads);  // doctest's CHECK is thread-safe
    }
  };
  std::thread one(job, 1, std::ref(at_one));
  std::thread two(job, 2, std::ref(at_two));
  one.join();
  two.join();
  return {at_one, at_two};
}

}  // namespace

TEST_CASE("threads: the count is a setting of the calling thread") {
  REQUIRE(num_threads() == 1);  // tests/support/test_main.cpp sets 1 on the main thread
  const auto [fresh, after_set] = counts_on_new_thread(3);
  CHECK(fresh == default_num_threads());  // not the main thread's 1
  CHECK(after_set == 3);
  CHECK(num_threads() == 1);  // the other thread's set_num_threads did not reach this one
  CHECK(default_num_threads() >= 1);
  CHECK_THROWS_AS(set_num_threads(0), std::invalid_argument);
  CHECK(num_threads() == 1);
}

TEST_CASE("threads: ThreadScope sets the count for its scope and restores it, also on a throw") {
  REQUIRE(num_threads() == 1);
  {
    ThreadScope outer(3);
    CHECK(num_threads() == 3);
    {
      ThreadScope inner(2);
      CHECK(num_threads() == 2);
    }
    CHECK(num_threads() == 3);
    try {
      ThreadScope throwing(4);
      CHECK(num_threads() == 4);
      throw std::runtime_error("leave the scope");
    } catch (const std::runtime_error&) {
    }
    CHECK(num_threads() == 3);
  }
  CHECK(num_threads() == 1);
  CHECK_THROWS_AS(ThreadScope(0), std::invalid_argument);
  CHECK(num_threads() == 1);

  // A thread that never set a count goes back to the default, not to another thread's count.
  int inside = 0, after = 0;
  std::thread([&] {
    {
      ThreadScope scope(5);
      inside = num_threads();
    }
    after = num_threads();
  }).join();
  CHECK(inside == 5);
  CHECK(after == default_num_threads());
}

TEST_CASE("context: defaults, the application's stop flag, validation and backend names") {
  const Context defaults;
  CHECK(defaults.threads == default_num_threads());
  CHECK(defaults.backend == Backend::cpu);
  CHECK_FALSE(defaults.stop_requested());  // no flag: never stops

  std::atomic<bool> stop{false};
  Context c;
  c.stop = &stop;
  CHECK_FALSE(c.stop_requested());
  stop.store(true);
  CHECK(c.stop_requested());

  c.threads = 0;
  CHECK_THROWS_WITH_AS(validate(c, "train"), "train: threads expected >= 1, got 0",
                       std::invalid_argument);
  c.threads = 2;
  CHECK_NOTHROW(validate(c));

  CHECK(parse_backend("cpu") == Backend::cpu);
  CHECK(parse_backend("cuda") == Backend::cuda);
  CHECK(backend_name(Backend::cuda) == "cuda");
  CHECK(backend_name(parse_backend("cpu")) == "cpu");
  CHECK_THROWS_WITH_AS(parse_backend("gpu", "train", "device"),
                       "train: device expected 'cpu' or 'cuda', got 'gpu'", std::invalid_argument);
}

TEST_CASE("threads: two std::threads at 1 and 2 threads run ops at once, each with its own count") {
  const auto serial_one = serial_at(1, layernorm_dgamma);
  const auto serial_two = serial_at(2, layernorm_dgamma);
  // The count changes the bits here, so a thread that ran at the other thread's count would show.
  REQUIRE_FALSE(same_bits(serial_one, serial_two));
  const auto [at_one, at_two] = concurrent_1_and_2(layernorm_dgamma, 20);
  REQUIRE(at_one.size() == 20);
  REQUIRE(at_two.size() == 20);
  for (const auto& r : at_one) CHECK(same_bits(r, serial_one));
  for (const auto& r : at_two) CHECK(same_bits(r, serial_two));
}

TEST_CASE("threads: concurrent training steps at 1 and 2 threads give the bits of serial runs") {
  const auto serial_one = serial_at(1, training_bits);
  const auto serial_two = serial_at(2, training_bits);
  REQUIRE(serial_one.size() == serial_two.size());
  CHECK(serial_one[1] < serial_one[0]);  // a real training step
  const auto [at_one, at_two] = concurrent_1_and_2(training_bits, 2);
  for (const auto& r : at_one) CHECK(same_bits(r, serial_one));
  for (const auto& r : at_two) CHECK(same_bits(r, serial_two));
}
