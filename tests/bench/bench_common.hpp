// Shared declarations of the attnlab benchmark binary (tests/bench).
#pragma once

#include <benchmark/benchmark.h>

#include <cstddef>
#include <string>

#include "attnlab/ops/attention.hpp"

namespace attnlab::bench {

inline constexpr std::size_t kHeads = 8;  // B·H is split as B = B·H / 8 batches of 8 heads

enum class Op { forward, forward_backward };

// The variants timed side by side at one grid point, in this order (see bench_attention.cpp).
inline constexpr const char* kVariants[] = {"floor", "ref", "ref_causal", "fused", "fused_causal"};

struct Shape {
  Op op;
  std::size_t bh, T, D;  // D = Dv
  int threads;
};

inline std::string name_of(const Shape& s) {
  return std::string(s.op == Op::forward ? "fwd" : "fwdbwd") + "/bh:" + std::to_string(s.bh) +
         "/T:" + std::to_string(s.T) + "/D:" + std::to_string(s.D) +
         "/thr:" + std::to_string(s.threads);
}

// One grid point: each iteration runs the GEMM floor and the four attention variants once each,
// interleaved, and the counters report the minimum seconds of each variant (bench_attention.cpp).
void bench_attention(benchmark::State& state, Shape s);
// Times with the process CPU clock instead of the wall clock (--cpu-time).
void use_cpu_time(bool on);
// Peak extra heap bytes of one forward+backward (inputs excluded; O, cache and gradients included).
std::ptrdiff_t attention_peak_bytes(const Shape& s, SdpaPath path, bool causal);

}  // namespace attnlab::bench
