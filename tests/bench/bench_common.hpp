// Shared declarations of the attnlab benchmark binary (tests/bench).
#pragma once

#include <benchmark/benchmark.h>

#include <cstddef>
#include <string>

#include "attnlab/ops/attention.hpp"

namespace attnlab::bench {

inline constexpr std::size_t kHeads = 8;  // B·H is split as B = B·H / 8 batches of 8 heads

enum class Op { forward, forward_backward };
enum class Variant { floor, reference, fused };

struct Shape {
  Op op;
  Variant variant;
  std::size_t bh, T, D;  // D = Dv
  bool causal;
  int threads;
};

inline std::string name_of(const Shape& s) {
  const char* op = s.op == Op::forward ? "fwd" : "fwdbwd";
  const char* variant = s.variant == Variant::floor       ? "floor"
                        : s.variant == Variant::reference ? "reference"
                                                          : "fused";
  return std::string(op) + "/" + variant + "/bh:" + std::to_string(s.bh) +
         "/T:" + std::to_string(s.T) + "/D:" + std::to_string(s.D) +
         "/causal:" + std::to_string(s.variant == Variant::floor ? 0 : int(s.causal)) +
         "/thr:" + std::to_string(s.threads);
}

// One timed benchmark of the grid (bench_attention.cpp).
void bench_attention(benchmark::State& state, Shape s);
// Peak extra heap bytes of one forward+backward (inputs excluded; O, cache and gradients included).
std::ptrdiff_t attention_peak_bytes(const Shape& s, SdpaPath path);

}  // namespace attnlab::bench
