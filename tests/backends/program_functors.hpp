// Score and mask functors of the CUDA program tests, shared by the emulated tests
// (test_cuda_programs.cpp) and the nvcc-compiled kernels of the GPU tests (cuda_programs.cu):
// device-safe, no xtensor.
#pragma once

#include <cmath>
#include <cstddef>
#include <cstdint>

#include "attnlab/attention/dual.hpp"
#include "attnlab/attention/host_device.hpp"

namespace attnlab::test {

// S = c·tanh(u / c) + table_h[clamp(j − i, −R, R) + R] + slope_h · clamp(j − i, −R, R): a soft cap,
// a relative-position table (parameter 0) and a learnable per-head slope (parameter 1).
struct CappedRelative {
  double cap = 6.0;
  std::size_t R = 3;
  ATTNLAB_NO_EXEC_CHECK
  template <class S, class P>
  ATTNLAB_HOST_DEVICE S operator()(S u, std::size_t, std::size_t h, std::size_t i, std::size_t j,
                                   const P& params) const {
    using std::tanh;
    using Plain = decltype(attention::value_of(u));
    const auto r = static_cast<std::ptrdiff_t>(R);
    std::ptrdiff_t rel = static_cast<std::ptrdiff_t>(j) - static_cast<std::ptrdiff_t>(i);
    rel = rel < -r ? -r : (rel > r ? r : rel);
    const Plain c = static_cast<Plain>(cap);
    return c * tanh(u / c) + params(0, h * (2 * R + 1) + static_cast<std::size_t>(rel + r)) +
           params(1, h) * static_cast<Plain>(rel);
  }
};

// Packed documents over raw ids (device memory for the kernels, host memory for the CPU's copy).
struct DocumentIds {
  const std::int32_t* ids = nullptr;
  bool causal = true;
  ATTNLAB_HOST_DEVICE bool operator()(std::size_t, std::size_t, std::size_t i,
                                      std::size_t j) const {
    return ids[i] == ids[j] && (!causal || j <= i);
  }
};

}  // namespace attnlab::test
