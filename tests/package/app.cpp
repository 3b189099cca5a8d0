// An outside program on attnlab's public API: attention forward (BLAS, OpenMP) and a few AdamW
// steps. Prints one line and exits 0 only if the results are sane.
#include <cmath>
#include <cstdio>

#include "attnlab/attnlab.hpp"
#include "attnlab/optim/adamw.hpp"

int main(int, char** argv) {
  attnlab::blas::init_process(argv);  // first: the BLAS kernels for this CPU
  attnlab::set_num_threads(2);
  attnlab::Rng rng(42);
  const auto q = attnlab::randn<float, 4>({2, 2, 5, 8}, rng);
  const auto k = attnlab::randn<float, 4>({2, 2, 6, 8}, rng);
  const auto v = attnlab::randn<float, 4>({2, 2, 6, 3}, rng);
  attnlab::SdpaCache<float> cache;
  const auto out = attnlab::sdpa_forward(cache, q, k, v);
  double row_sum = 0;  // each attention row sums to 1
  for (std::size_t j = 0; j < 6; ++j) row_sum += cache.p(1, 1, 4, j);

  // Minimise |w|^2 / 2 (grad = w) with AdamW.
  attnlab::Parameter<float> w;
  w.value = attnlab::randn<float, 1>({4}, rng);
  w.grad = w.value;
  attnlab::AdamWOptions options;
  options.lr = 0.1;
  attnlab::AdamW<float> opt({{"w", &w}}, options);
  double first = 0, last = 0;
  for (int step = 0; step < 20; ++step) {
    opt.zero_grad();
    w.grad = w.value;
    double loss = 0;
    for (float x : w.value) loss += 0.5 * x * x;
    if (step == 0) first = loss;
    last = loss;
    opt.step();
  }
  const bool ok = out.shape()[3] == 3 && std::abs(row_sum - 1) < 1e-5 && last < first;
  std::printf("attnlab consumer: attention rows sum to %.6f, AdamW loss %.4f -> %.4f: %s\n",
              row_sum, first, last, ok ? "ok" : "FAILED");
  return ok ? 0 : 1;
}
