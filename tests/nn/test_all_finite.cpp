// all_finite_host (attnlab/nn/module.hpp), the training step's non-finite check: inf, -inf and
// NaN anywhere (in the first chunk, the last, a scalar tail) are found on 1 and 2 threads, and the
// largest finite values, subnormals and -0 are finite.
#include <doctest/doctest.h>

#include <cmath>
#include <limits>
#include <vector>

#include "attnlab/nn/module.hpp"
#include "attnlab/threads.hpp"

using namespace attnlab;

TEST_CASE_TEMPLATE("all_finite_host: every non-finite value is found, every finite one passes", T,
                   float, double) {
  using limits = std::numeric_limits<T>;
  for (int threads : {1, 2}) {
    const ThreadScope scope(threads);
    CAPTURE(threads);
    for (std::size_t n : {std::size_t(1), std::size_t(37), std::size_t(100003)}) {
      CAPTURE(n);
      std::vector<T> x(n);
      for (std::size_t i = 0; i < n; ++i) x[i] = T(std::sin(double(i)));
      x[0] = limits::max();
      if (n > 2) x[1] = -limits::denorm_min(), x[2] = T(-0.0);
      CHECK(all_finite_host(x.data(), n));
      CHECK(all_finite_host(x.data(), 0));
      for (std::size_t at : {std::size_t(0), n / 2, n - 1}) {
        for (T bad : {limits::infinity(), -limits::infinity(), limits::quiet_NaN()}) {
          std::vector<T> y = x;
          y[at] = bad;
          CAPTURE(at);
          CAPTURE(bad);
          CHECK_FALSE(all_finite_host(y.data(), n));
        }
      }
    }
  }
}
