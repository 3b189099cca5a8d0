// A small, portable, seedable random generator. Unlike <random>'s distributions its normal draws
// are specified here, so a seed gives the same numbers with every standard library, and its whole
// state is two integers that a checkpoint can save and restore.
#pragma once

#include <cstdint>
#include <vector>

#include "attnlab/tensor.hpp"

namespace attnlab {

class Rng {
 public:
  explicit Rng(std::uint64_t seed = 0) { reseed(seed); }
  void reseed(std::uint64_t seed);

  std::uint64_t next_u64();
  // Uniform in [0, 1) with 53 random bits.
  double uniform();
  // Standard normal (Box-Muller, both draws used).
  double normal();
  // Uniform integer in [0, n); n >= 1.
  std::uint64_t below(std::uint64_t n);

  struct State {
    std::uint64_t s0, s1, cached_bits;
    bool has_cached;
  };
  State state() const { return {s0_, s1_, cached_bits_, has_cached_}; }
  void set_state(const State& st);

 private:
  std::uint64_t s0_ = 0, s1_ = 0;
  std::uint64_t cached_bits_ = 0;  // the spare normal draw, stored as its bit pattern
  bool has_cached_ = false;
};

// A tensor of N(0, std^2) draws in row-major order.
template <class T, std::size_t N>
Tensor<T, N> randn(const std::array<std::size_t, N>& shape, Rng& rng, double std = 1.0);

}  // namespace attnlab
