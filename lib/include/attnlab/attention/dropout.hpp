// Dropout masks from a counter-based generator, the same bits on every path and backend: the CPU
// paths, the CUDA kernels and the emulated device compute a mask element from its coordinates
// alone, so a backward regenerates the forward's mask without storing it, and a run that resumes
// at step n draws the masks it would have drawn.
//
// The generator is Philox4x32-10 (Salmon, Moraes, Dror and Shaw 2011, "Parallel random numbers: as
// easy as 1, 2, 3"; the generator of cuRAND and of PyTorch's CUDA dropout): a bijection of a
// 128-bit counter under a 64-bit key, 10 rounds, four 32-bit words out.
// tests/ops/test_attention_dropout.cpp checks it against Random123's known answers. Element n of a
// stream (a, b, c) under key k is word n % 4 of philox({n / 4, a, b, c}, k); it is kept iff that
// word is ≥ threshold = ⌊p · 2³²⌋, with probability 1 − p to within 2⁻³².
//
// Keys: dropout_key(seed, step, layer) folds a run's seed, the training step and the layer into one
// 64-bit key per call. Streams: attention weights use (a, b, c) = (row i, slice b·H + h,
// kAttentionStream) and element n = key j; other tensors pick their own c.
//
// __host__ __device__ under nvcc, plain inline C++ otherwise; no xtensor.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>

#if defined(__AVX2__) && !defined(__CUDACC__)
#include <immintrin.h>
#define ATTNLAB_PHILOX_AVX2 1
#endif

#include "attnlab/attention/params.hpp"
#include "attnlab/kernel_math.hpp"  // ATTNLAB_HD

namespace attnlab::attention {

struct Philox4 {
  std::uint32_t x[4];
};

// Philox4x32-10 of `counter` under key (k0, k1).
ATTNLAB_HD inline Philox4 philox4x32_10(Philox4 counter, std::uint32_t k0, std::uint32_t k1) {
  constexpr std::uint32_t kM0 = 0xD2511F53u, kM1 = 0xCD9E8D57u;  // multipliers
  constexpr std::uint32_t kW0 = 0x9E3779B9u, kW1 = 0xBB67AE85u;  // key bumps (golden ratio, √3)
  for (int round = 0; round < 10; ++round) {
    const std::uint64_t p0 = static_cast<std::uint64_t>(kM0) * counter.x[0];
    const std::uint64_t p1 = static_cast<std::uint64_t>(kM1) * counter.x[2];
    const auto hi0 = static_cast<std::uint32_t>(p0 >> 32), lo0 = static_cast<std::uint32_t>(p0);
    const auto hi1 = static_cast<std::uint32_t>(p1 >> 32), lo1 = static_cast<std::uint32_t>(p1);
    counter = Philox4{{hi1 ^ counter.x[1] ^ k0, lo1, hi0 ^ counter.x[3] ^ k1, lo0}};
    k0 += kW0;
    k1 += kW1;
  }
  return counter;
}

// Four consecutive words n0 .. n0 + 3 (n0 a multiple of 4) of stream (a, b, c) under `key`.
ATTNLAB_HD inline Philox4 philox_block(std::uint64_t key, std::uint32_t a, std::uint32_t b,
                                       std::uint32_t c, std::size_t n0) {
  return philox4x32_10(Philox4{{static_cast<std::uint32_t>(n0 / 4), a, b, c}},
                       static_cast<std::uint32_t>(key), static_cast<std::uint32_t>(key >> 32));
}

// The CPU's batch form: blocks first_block .. first_block + kPhiloxLanes - 1 of stream (a, b, c)
// under `key`, word w of block l to words[4·l + w]. The same numbers as philox_block, with AVX2
// (ATTNLAB_MARCH's x86-64-v3) sixteen blocks in two registers, else a lane loop.
inline constexpr std::size_t kPhiloxLanes = 16;

inline void philox_blocks(std::uint64_t key, std::uint32_t a, std::uint32_t b, std::uint32_t c,
                          std::uint32_t first_block, std::uint32_t* words) {
  constexpr std::uint32_t kM0 = 0xD2511F53u, kM1 = 0xCD9E8D57u;
  constexpr std::uint32_t kW0 = 0x9E3779B9u, kW1 = 0xBB67AE85u;
#ifdef ATTNLAB_PHILOX_AVX2
  // Eight lanes per register, two registers: the 32 x 32 -> 64-bit products of the even lanes and
  // of the odd lanes (shifted down) by _mm256_mul_epu32, their halves blended back.
  static_assert(kPhiloxLanes == 16, "two AVX2 registers of eight lanes");
  const auto mulhilo = [](__m256i x, __m256i m, __m256i& hi, __m256i& lo) {
    const __m256i even = _mm256_mul_epu32(x, m);
    const __m256i odd = _mm256_mul_epu32(_mm256_srli_epi64(x, 32), m);
    lo = _mm256_blend_epi32(even, _mm256_slli_epi64(odd, 32), 0xAA);
    hi = _mm256_blend_epi32(_mm256_srli_epi64(even, 32), odd, 0xAA);
  };
  const __m256i m0 = _mm256_set1_epi32(static_cast<int>(kM0));
  const __m256i m1 = _mm256_set1_epi32(static_cast<int>(kM1));
  __m256i x0[2], x1[2], x2[2], x3[2];
  for (int v = 0; v < 2; ++v) {
    x0[v] = _mm256_add_epi32(_mm256_set1_epi32(static_cast<int>(first_block + 8 * v)),
                             _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
    x1[v] = _mm256_set1_epi32(static_cast<int>(a));
    x2[v] = _mm256_set1_epi32(static_cast<int>(b));
    x3[v] = _mm256_set1_epi32(static_cast<int>(c));
  }
  auto k0 = static_cast<std::uint32_t>(key), k1 = static_cast<std::uint32_t>(key >> 32);
  for (int round = 0; round < 10; ++round) {
    const __m256i vk0 = _mm256_set1_epi32(static_cast<int>(k0));
    const __m256i vk1 = _mm256_set1_epi32(static_cast<int>(k1));
    for (int v = 0; v < 2; ++v) {
      __m256i hi0, lo0, hi1, lo1;
      mulhilo(x0[v], m0, hi0, lo0);
      mulhilo(x2[v], m1, hi1, lo1);
      x0[v] = _mm256_xor_si256(_mm256_xor_si256(hi1, x1[v]), vk0);
      x2[v] = _mm256_xor_si256(_mm256_xor_si256(hi0, x3[v]), vk1);
      x1[v] = lo1;
      x3[v] = lo0;
    }
    k0 += kW0;
    k1 += kW1;
  }
  for (int v = 0; v < 2; ++v) {  // lane-major: word w of block l at 4·l + w
    alignas(32) std::uint32_t w0[8], w1[8], w2[8], w3[8];
    _mm256_store_si256(reinterpret_cast<__m256i*>(w0), x0[v]);
    _mm256_store_si256(reinterpret_cast<__m256i*>(w1), x1[v]);
    _mm256_store_si256(reinterpret_cast<__m256i*>(w2), x2[v]);
    _mm256_store_si256(reinterpret_cast<__m256i*>(w3), x3[v]);
    for (int l = 0; l < 8; ++l) {
      std::uint32_t* out = words + 4 * (8 * v + l);
      out[0] = w0[l], out[1] = w1[l], out[2] = w2[l], out[3] = w3[l];
    }
  }
#else
  std::uint32_t x0[kPhiloxLanes], x1[kPhiloxLanes], x2[kPhiloxLanes], x3[kPhiloxLanes];
  for (std::size_t l = 0; l < kPhiloxLanes; ++l) {
    x0[l] = first_block + static_cast<std::uint32_t>(l), x1[l] = a, x2[l] = b, x3[l] = c;
  }
  auto k0 = static_cast<std::uint32_t>(key), k1 = static_cast<std::uint32_t>(key >> 32);
  for (int round = 0; round < 10; ++round) {
    for (std::size_t l = 0; l < kPhiloxLanes; ++l) {
      const std::uint64_t p0 = static_cast<std::uint64_t>(kM0) * x0[l];
      const std::uint64_t p1 = static_cast<std::uint64_t>(kM1) * x2[l];
      const auto y0 = static_cast<std::uint32_t>(p1 >> 32) ^ x1[l] ^ k0;
      const auto y2 = static_cast<std::uint32_t>(p0 >> 32) ^ x3[l] ^ k1;
      x1[l] = static_cast<std::uint32_t>(p1);
      x3[l] = static_cast<std::uint32_t>(p0);
      x0[l] = y0;
      x2[l] = y2;
    }
    k0 += kW0;
    k1 += kW1;
  }
  for (std::size_t l = 0; l < kPhiloxLanes; ++l) {
    words[4 * l] = x0[l], words[4 * l + 1] = x1[l], words[4 * l + 2] = x2[l];
    words[4 * l + 3] = x3[l];
  }
#endif
}

// One key per (run seed, training step, layer): a caller's dropout_seed for one call.
ATTNLAB_HD inline std::uint64_t dropout_key(std::uint64_t seed, std::uint64_t step,
                                            std::uint32_t layer) {
  const Philox4 r =
      philox4x32_10(Philox4{{static_cast<std::uint32_t>(step),
                             static_cast<std::uint32_t>(step >> 32), layer, 0x0D20u}},
                    static_cast<std::uint32_t>(seed), static_cast<std::uint32_t>(seed >> 32));
  return (static_cast<std::uint64_t>(r.x[1]) << 32) | r.x[0];
}

// The word threshold of drop probability p in [0, 1): an element is kept iff its word is ≥ it.
ATTNLAB_HD inline std::uint32_t dropout_threshold(double p) {
  return static_cast<std::uint32_t>(p * 4294967296.0);
}

inline constexpr std::uint32_t kAttentionStream = 0xA77u;

// Whether attention weight (slice bh = b·H + h, query i, key j) is kept by the call's dropout.
ATTNLAB_HD inline bool attention_kept(const AttentionSpec& s, std::size_t bh, std::size_t i,
                                      std::size_t j) {
  const Philox4 r = philox_block(s.dropout_seed, static_cast<std::uint32_t>(i),
                                 static_cast<std::uint32_t>(bh), kAttentionStream, j);
  return r.x[j % 4] >= dropout_threshold(s.dropout_p);
}

// The factor of attention weight (bh, i, j) in training: 1 / (1 - p) if kept, 0 if dropped; 1
// without dropout.
template <class T>
ATTNLAB_HD inline T attention_dropout_factor(const AttentionSpec& s, std::size_t bh, std::size_t i,
                                             std::size_t j) {
  if (s.dropout_p == 0) return T(1);
  return attention_kept(s, bh, i, j) ? static_cast<T>(1.0 / (1.0 - s.dropout_p)) : T(0);
}

// x[c] *= the factor of weight (bh, i, j0 + c), c < n: philox_blocks, 4 · kPhiloxLanes keys at a
// time.
template <class T>
inline void attention_dropout_row(const AttentionSpec& s, std::size_t bh, std::size_t i,
                                  std::size_t j0, std::size_t n, T* x) {
  if (s.dropout_p == 0) return;
  const std::uint32_t threshold = dropout_threshold(s.dropout_p);
  const T keep = static_cast<T>(1.0 / (1.0 - s.dropout_p));
  std::uint32_t words[4 * kPhiloxLanes];
  std::size_t c = 0;
  while (c < n) {
    const std::size_t j = j0 + c, block = j / 4;
    philox_blocks(s.dropout_seed, static_cast<std::uint32_t>(i), static_cast<std::uint32_t>(bh),
                  kAttentionStream, static_cast<std::uint32_t>(block), words);
    const std::size_t w0 = j - 4 * block, len = std::min(4 * kPhiloxLanes - w0, n - c);
    T* xc = x + c;
    const std::uint32_t* wc = words + w0;
    for (std::size_t k = 0; k < len; ++k) {
      xc[k] *= wc[k] >= threshold ? keep : T(0);  // NaN stays NaN, as x · 0 does
    }
    c += len;
  }
}

// ---- Flat tensors (residual dropout) ----------------------------------------------------------

// Stream c of a flat tensor's element e under `key`: (a, b, c) = (e / 2³⁴, 0, stream), n = e.
inline constexpr std::uint32_t kResidualStream = 0x4E5u;

// The factor of element e of a flat tensor dropped with probability p: 1 / (1 - p) if kept, else 0.
template <class T>
ATTNLAB_HD inline T element_dropout_factor(std::uint64_t key, double p, std::uint32_t stream,
                                           std::size_t e) {
  const Philox4 r = philox_block(key, static_cast<std::uint32_t>(e >> 34), 0, stream, e);
  return r.x[e % 4] >= dropout_threshold(p) ? static_cast<T>(1.0 / (1.0 - p)) : T(0);
}

// y[e] = x[e] · element_dropout_factor(key, p, stream, e) for e < n (y may be x); one Philox call
// per four elements. The backward of dropout is the same call on the gradient.
template <class T>
inline void dropout_elements(T* y, const T* x, std::size_t n, double p, std::uint64_t key,
                             std::uint32_t stream) {
  const std::uint32_t threshold = dropout_threshold(p);
  const T keep = static_cast<T>(1.0 / (1.0 - p));
  std::uint32_t words[4 * kPhiloxLanes];
  // Chunks of 4 · kPhiloxLanes elements never cross a multiple of 2³⁴: one `a` per chunk.
  for (std::size_t e0 = 0; e0 < n; e0 += 4 * kPhiloxLanes) {
    philox_blocks(key, static_cast<std::uint32_t>(e0 >> 34), 0, stream,
                  static_cast<std::uint32_t>(e0 / 4), words);
    const std::size_t len = std::min(4 * kPhiloxLanes, n - e0);
    for (std::size_t w = 0; w < len; ++w) {
      y[e0 + w] = x[e0 + w] * (words[w] >= threshold ? keep : T(0));
    }
  }
}

}  // namespace attnlab::attention
