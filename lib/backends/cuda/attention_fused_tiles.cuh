// The fused kernels' building blocks (attention_fused_kernels.cuh describes the kernels): the
// thread grid, the register-tiled product over shared memory, tile loads, the shared-memory
// geometry, and the built-in rule's score of a tile element. Device code on raw pointers.
#pragma once

#include <cstddef>

#include "attnlab/attention/params.hpp"
#include "attnlab/attention/score_rule.hpp"
#include "attnlab/kernel_math.hpp"
#include "device_compat.cuh"

namespace attnlab::cuda::fused {

namespace cm = kernel_math;

constexpr int kThreads = 256;
constexpr int kSide = 16;   // threads per side of the 16 × 16 thread grid
constexpr int kChunk = 64;  // output columns per micro_gemm pass over a head dim
constexpr int kChunkCols = kChunk / kSide;

// acc[i][j] += Σ_{k < K} A(ty + 16i, k) · B(k, n0 + tx + 16j), with A(r, k) = a[r·a_rs + k·a_ks]
// and B(k, c) = b[k·b_ks + c·b_cs] in shared memory.
template <class T, int MI, int NJ>
__device__ inline void micro_gemm(T (&acc)[MI][NJ], const T* a, int a_rs, int a_ks, const T* b,
                                  int b_ks, int b_cs, int K, int ty, int tx, int n0) {
#pragma unroll 4
  for (int k = 0; k < K; ++k) {
    T av[MI], bv[NJ];
#pragma unroll
    for (int i = 0; i < MI; ++i) av[i] = a[(ty + kSide * i) * a_rs + k * a_ks];
#pragma unroll
    for (int j = 0; j < NJ; ++j) bv[j] = b[k * b_ks + (n0 + tx + kSide * j) * b_cs];
#pragma unroll
    for (int i = 0; i < MI; ++i) {
#pragma unroll
      for (int j = 0; j < NJ; ++j) acc[i][j] += av[i] * bv[j];
    }
  }
}

// C(r, c) += Σ_{k < K} A(r, k) · B(k, c) at the thread's own rows r = ty + 16i of C (MI of them)
// and every column c < width (a multiple of kChunk), one micro_gemm pass a chunk of kChunk
// columns; C(r, c) = c_s[r·width + c] in shared memory, A and B as micro_gemm's. With row_scale,
// C's rows are first multiplied by row_scale[r].
template <int MI, class T>
__device__ inline void accumulate_product(T* c_s, int width, const T* a, int a_rs, int a_ks,
                                          const T* b, int b_ks, int b_cs, int K, int ty, int tx,
                                          const T* row_scale = nullptr) {
  for (int n0 = 0; n0 < width; n0 += kChunk) {
    T acc[MI][kChunkCols];
#pragma unroll
    for (int i = 0; i < MI; ++i) {
      const int r = ty + kSide * i;
#pragma unroll
      for (int j = 0; j < kChunkCols; ++j) {
        const T value = c_s[r * width + n0 + tx + kSide * j];
        acc[i][j] = row_scale == nullptr ? value : value * row_scale[r];
      }
    }
    micro_gemm(acc, a, a_rs, a_ks, b, b_ks, b_cs, K, ty, tx, n0);
#pragma unroll
    for (int i = 0; i < MI; ++i) {
#pragma unroll
      for (int j = 0; j < kChunkCols; ++j) {
        c_s[(ty + kSide * i) * width + n0 + tx + kSide * j] = acc[i][j];
      }
    }
  }
}

template <class T, int MI, int NJ>
__device__ inline void fill(T (&acc)[MI][NJ], T value) {
#pragma unroll
  for (int i = 0; i < MI; ++i) {
#pragma unroll
    for (int j = 0; j < NJ; ++j) acc[i][j] = value;
  }
}

// Copies rows [row0, row0 + TILE) of a (rows, width) global matrix into shared memory with row
// stride ld, zero-filling rows ≥ rows and columns in [width, padded).
template <class T>
__device__ inline void load_tile(T* dst, int ld, const T* src, std::size_t row0, std::size_t rows,
                                 int width, int padded, int tile) {
  for (int e = threadIdx.x; e < tile * padded; e += blockDim.x) {
    const int r = e / padded, c = e % padded;
    const std::size_t row = row0 + r;
    dst[r * ld + c] = (row < rows && c < width) ? src[row * width + c] : T(0);
  }
}

template <class T>
__device__ inline void zero_tile(T* dst, int count) {
  for (int e = threadIdx.x; e < count; e += blockDim.x) dst[e] = T(0);
}

// Shared-memory geometry of one kernel for head dims D, Dv.
struct Geometry {
  int dp, dvp;  // D and Dv padded to multiples of kChunk
  int ldd, lddv, lds;
  __host__ __device__ explicit Geometry(std::size_t D, std::size_t Dv, int tile)
      : dp(static_cast<int>(cm::round_up(D, kChunk))),
        dvp(static_cast<int>(cm::round_up(Dv, kChunk))),
        ldd(dp + 1),
        lddv(dvp + 1),
        lds(tile + 1) {}
};

// The score rule's S for query i and key j of a tile (attnlab/attention/score_rule.hpp), and -inf
// for positions beyond Tq or Tk (the padding of partial tiles).
template <class T>
__device__ inline T tile_score(const AttentionParams<T>& a, std::size_t b, std::size_t h,
                               std::size_t i, std::size_t j, T s, T dot) {
  return i < a.Tq && j < a.Tk ? attention::score(a, b, h, i, j, s, dot)
                              : cm::negative_infinity<T>();
}

}  // namespace attnlab::cuda::fused
