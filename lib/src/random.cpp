#include "attnlab/random.hpp"

#include <bit>
#include <cmath>
#include <cstdint>
#include <numbers>

namespace attnlab {

namespace {
std::uint64_t splitmix64(std::uint64_t& x) {
  std::uint64_t z = (x += 0x9e3779b97f4a7c15ULL);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  return z ^ (z >> 31);
}
std::uint64_t rotl(std::uint64_t x, int k) {
  return (x << k) | (x >> (64 - k));
}
}  // namespace

void Rng::reseed(std::uint64_t seed) {
  std::uint64_t sm = seed;
  s0_ = splitmix64(sm);
  s1_ = splitmix64(sm);
  has_cached_ = false;
  cached_bits_ = 0;
}

// xoroshiro128+ (Blackman & Vigna).
std::uint64_t Rng::next_u64() {
  const std::uint64_t a = s0_;
  std::uint64_t b = s1_;
  const std::uint64_t result = a + b;
  b ^= a;
  s0_ = rotl(a, 24) ^ b ^ (b << 16);
  s1_ = rotl(b, 37);
  return result;
}

double Rng::uniform() {
  return static_cast<double>(next_u64() >> 11) * 0x1.0p-53;
}

double Rng::normal() {
  if (has_cached_) {
    has_cached_ = false;
    return std::bit_cast<double>(cached_bits_);
  }
  double u1 = uniform();
  while (u1 <= 0.0) u1 = uniform();
  const double u2 = uniform();
  const double r = std::sqrt(-2.0 * std::log(u1));
  const double theta = 2.0 * std::numbers::pi * u2;
  cached_bits_ = std::bit_cast<std::uint64_t>(r * std::sin(theta));
  has_cached_ = true;
  return r * std::cos(theta);
}

std::uint64_t Rng::below(std::uint64_t n) {
  // Rejection sampling removes the modulo bias.
  const std::uint64_t limit = UINT64_MAX - UINT64_MAX % n;
  std::uint64_t x = next_u64();
  while (x >= limit) x = next_u64();
  return x % n;
}

void Rng::set_state(const State& st) {
  s0_ = st.s0;
  s1_ = st.s1;
  cached_bits_ = st.cached_bits;
  has_cached_ = st.has_cached;
}

template <class T, std::size_t N>
Tensor<T, N> randn(const std::array<std::size_t, N>& shape, Rng& rng, double std) {
  Tensor<T, N> out(shape);
  for (auto& x : out) x = static_cast<T>(std * rng.normal());
  return out;
}

#define ATTNLAB_INSTANTIATE_RANDN(T)                                                  \
  template Tensor<T, 1> randn<T, 1>(const std::array<std::size_t, 1>&, Rng&, double); \
  template Tensor<T, 2> randn<T, 2>(const std::array<std::size_t, 2>&, Rng&, double); \
  template Tensor<T, 3> randn<T, 3>(const std::array<std::size_t, 3>&, Rng&, double); \
  template Tensor<T, 4> randn<T, 4>(const std::array<std::size_t, 4>&, Rng&, double);
ATTNLAB_INSTANTIATE_RANDN(float)
ATTNLAB_INSTANTIATE_RANDN(double)
#undef ATTNLAB_INSTANTIATE_RANDN

}  // namespace attnlab
