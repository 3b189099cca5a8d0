// Private to lib/backends/cuda: the tile constants and the fragment helpers of the tensor-core
// fused attention (attention_tc_kernels.cuh, which includes this file): cp.async tile loads,
// ldmatrix fragment loads and the mma tile products, in the PTX ISA's per-lane layouts.
#pragma once

#include <cstddef>
#include <cstdint>

#include "attnlab/kernel_math.hpp"
#include "device_compat.cuh"
#include "reduce.cuh"

namespace attnlab::cuda::tc {

namespace cm = kernel_math;

constexpr int kWarps = 4;
constexpr int kThreads = kWarps * detail::kWarpSize;
constexpr int kRows = 16 * kWarps;  // query rows of a tile (forward, dQ), keys of a tile (dK/dV)
constexpr int kKeys = 64;           // keys of a tile (forward, dQ), query rows of a tile (dK/dV)
constexpr int kPad = 8;             // bf16 elements of padding per shared-memory row

template <int HD>
struct Shape {
  static_assert(HD == 64 || HD == 128, "head dims 64 and 128");
  static constexpr int kLd = HD + kPad;    // shared-memory row stride, in bf16
  static constexpr int kTile = 64 * kLd;   // one 64-row tile
  static constexpr int kDSteps = HD / 16;  // k-steps of 16 over the head dim
  static constexpr int kDTiles = HD / 8;   // n-tiles of 8 over the head dim
};
constexpr int kKeyTiles = kKeys / 8;  // n-tiles of 8 over a tile's 64 columns

// ---- fragments ---------------------------------------------------------------------------------

// cp.async of rows [row0, row0 + 64) of a (rows, HD) bf16 matrix into a shared tile of row stride
// HD + kPad, 16 bytes a copy; rows at or past `rows` are zero-filled (no global read).
template <int HD>
__device__ inline void async_tile(attnlab_bf16* dst, const attnlab_bf16* src, std::size_t row0,
                                  std::size_t rows) {
  constexpr int chunks = HD / 8;
  for (int e = static_cast<int>(threadIdx.x); e < 64 * chunks; e += kThreads) {
    const int r = e / chunks, c = e % chunks;
    const std::size_t row = row0 + static_cast<std::size_t>(r);
    const bool in = row < rows;
    attnlab_cp_async_16_zfill(dst + r * Shape<HD>::kLd + c * 8, in ? src + row * HD + c * 8 : src,
                              in ? 16u : 0u);
  }
}

// The same over the packed rows [p0, p0 + 64) of the `group` query heads of K/V slice kv (grouped-
// query attention, one K/V read per group): packed row p is query p / group of head slice
// kv·group + p % group of a (slices, rows, HD) matrix; rows at or past rows·group are zero-filled.
// group = 1 is async_tile of slice kv.
template <int HD>
__device__ inline void async_packed_tile(attnlab_bf16* dst, const attnlab_bf16* src, std::size_t kv,
                                         std::size_t group, std::size_t p0, std::size_t rows) {
  constexpr int chunks = HD / 8;
  for (int e = static_cast<int>(threadIdx.x); e < 64 * chunks; e += kThreads) {
    const int r = e / chunks, c = e % chunks;
    const std::size_t p = p0 + static_cast<std::size_t>(r);
    const bool in = p < rows * group;
    const std::size_t row = ((kv * group + p % group) * rows + p / group) * HD;
    attnlab_cp_async_16_zfill(dst + r * Shape<HD>::kLd + c * 8, in ? src + row + c * 8 : src,
                              in ? 16u : 0u);
  }
}

// The A fragment (16 × 16, rows r0.., columns k0..) of a row-major shared tile: ldmatrix.x4 of the
// four 8 × 8 quarters, in a0..a7's order (rows +0/+8, then columns +0/+8).
__device__ inline void load_a(std::uint32_t (&a)[4], const attnlab_bf16* tile, int ld, int r0,
                              int k0) {
  const int lane = static_cast<int>(threadIdx.x) % detail::kWarpSize, m = lane / 8, j = lane % 8;
  attnlab_ldmatrix_x4(a, tile + (r0 + j + 8 * (m % 2)) * ld + k0 + 8 * (m / 2));
}

// The B fragments (16 × 8) of the n-tiles n0 and n0 + 8, k-step k0, of B(k, n) = tile(n, k): the
// tile's rows are B's columns (K for Q Kᵀ). b[0], b[1] for n0; b[2], b[3] for n0 + 8.
__device__ inline void load_b_of_rows(std::uint32_t (&b)[4], const attnlab_bf16* tile, int ld,
                                      int n0, int k0) {
  const int lane = static_cast<int>(threadIdx.x) % detail::kWarpSize, m = lane / 8, j = lane % 8;
  attnlab_ldmatrix_x4(b, tile + (n0 + j + 8 * (m / 2)) * ld + k0 + 8 * (m % 2));
}

// The same for B(k, n) = tile(k, n) (V for P V), by ldmatrix.trans.
__device__ inline void load_b_trans(std::uint32_t (&b)[4], const attnlab_bf16* tile, int ld, int k0,
                                    int n0) {
  const int lane = static_cast<int>(threadIdx.x) % detail::kWarpSize, m = lane / 8, j = lane % 8;
  attnlab_ldmatrix_x4_trans(b, tile + (k0 + j + 8 * (m % 2)) * ld + n0 + 8 * (m / 2));
}

// d += A B for the two n-tiles whose B fragments load_b_* gave.
__device__ inline void mma_pair(float (&d0)[4], float (&d1)[4], const std::uint32_t (&a)[4],
                                const std::uint32_t (&b)[4]) {
  const std::uint32_t b0[2] = {b[0], b[1]}, b1[2] = {b[2], b[3]};
  attnlab_mma_m16n8k16_bf16(d0, a, b0, d0);
  attnlab_mma_m16n8k16_bf16(d1, a, b1, d1);
}

// The A fragment of columns 16kk.. of a 16 × 64 accumulator (its n-tiles 2kk and 2kk + 1), rounded
// to bf16: the C layout of two adjacent n-tiles is the A layout of their 16 columns.
__device__ inline void accumulator_as_a(std::uint32_t (&a)[4], const float (&c)[kKeyTiles][4],
                                        int kk) {
  a[0] = attnlab_pack_bf16x2(c[2 * kk][0], c[2 * kk][1]);
  a[1] = attnlab_pack_bf16x2(c[2 * kk][2], c[2 * kk][3]);
  a[2] = attnlab_pack_bf16x2(c[2 * kk + 1][0], c[2 * kk + 1][1]);
  a[3] = attnlab_pack_bf16x2(c[2 * kk + 1][2], c[2 * kk + 1][3]);
}

template <int M, int N>
__device__ inline void zero(float (&x)[M][N]) {
  ATTNLAB_UNROLL
  for (int i = 0; i < M; ++i) {
    ATTNLAB_UNROLL
    for (int j = 0; j < N; ++j) x[i][j] = 0.0f;
  }
}

// acc (16 × 64) = A Bᵀ with A the warp's 16 rows (from r0) of tile `a` and B the 64 rows of tile
// `b`, both (64, HD) in shared memory: Q Kᵀ, dO Vᵀ, K Qᵀ, V dOᵀ.
template <int HD>
__device__ inline void rows_times_rows(float (&acc)[kKeyTiles][4], const attnlab_bf16* a, int r0,
                                       const attnlab_bf16* b) {
  constexpr int ld = Shape<HD>::kLd;
  zero(acc);
  ATTNLAB_UNROLL
  for (int kt = 0; kt < Shape<HD>::kDSteps; ++kt) {
    std::uint32_t af[4];
    load_a(af, a, ld, r0, 16 * kt);
    ATTNLAB_UNROLL
    for (int np = 0; np < kKeyTiles / 2; ++np) {
      std::uint32_t bf[4];
      load_b_of_rows(bf, b, ld, 16 * np, 16 * kt);
      mma_pair(acc[2 * np], acc[2 * np + 1], af, bf);
    }
  }
}

// acc (16 × HD) += P B with P (16 × 64) in the warp's accumulators (rounded to bf16) and B the
// (64, HD) tile `b` in shared memory: P V, Pᵀ dO, dSᵀ Q, dS K.
template <int HD>
__device__ inline void accumulate_product(float (&acc)[Shape<HD>::kDTiles][4],
                                          const float (&p)[kKeyTiles][4], const attnlab_bf16* b) {
  ATTNLAB_UNROLL
  for (int kk = 0; kk < kKeyTiles / 2; ++kk) {
    std::uint32_t pa[4];
    accumulator_as_a(pa, p, kk);
    ATTNLAB_UNROLL
    for (int dp = 0; dp < Shape<HD>::kDTiles / 2; ++dp) {
      std::uint32_t bf[4];
      load_b_trans(bf, b, Shape<HD>::kLd, 16 * kk, 16 * dp);
      mma_pair(acc[2 * dp], acc[2 * dp + 1], pa, bf);
    }
  }
}

__device__ inline float quad_max(float x) {
  x = cm::max_of(x, __shfl_xor_sync(0xffffffffu, x, 1));
  return cm::max_of(x, __shfl_xor_sync(0xffffffffu, x, 2));
}
__device__ inline float quad_sum(float x) {
  x += __shfl_xor_sync(0xffffffffu, x, 1);
  return x + __shfl_xor_sync(0xffffffffu, x, 2);
}

__device__ inline std::size_t min_size(std::size_t x, std::size_t y) {
  return x < y ? x : y;
}

}  // namespace attnlab::cuda::tc
