// Kernels of the fused GPU attention (launch glue: kernel_device_ops.hpp), FlashAttention-2 style
// (Dao 2023, Algorithms 1 and 2), in plain FMA arithmetic for float and double. No (Tq, Tk) matrix
// is ever stored.
//
//   forward    one block per (packed query tile, K/V slice): the rows of the G = H / Hkv query
//              heads that share the slice are interleaved (row i·G + m: query i of head m), so a
//              K/V tile is read once per group; loop over key tiles, S = s·Q Kᵀ in shared memory,
//              online softmax (running max and sum per row), O ← α·O + P V; saves O and the
//              log-sum-exp (LSE) of each row.
//   row_dot    D = rowsum(dO ⊙ O) (= rowsum(dP ⊙ P)), one warp per row.
//   dK/dV      one block per (key tile, b·h): loop over the query tiles that can see the keys,
//              recompute P = exp(s·Q Kᵀ − LSE), dV += Pᵀ dO, dP = dO Vᵀ, dS = s·P ⊙ (dP − D)
//              (⊙ the softcap's slope 1 − tanh²(s·q·k/c) with a cap), dK += dSᵀ Q; dS/s before
//              the slope to AttentionParams::dscores when set (the bias gradient).
//   dQ         one block per (query tile, b·h): loop over key tiles, dQ += dS K.
// Every output element has exactly one writer: deterministic, no atomics, no zeroed memory needed
// (except dscores, whose tiles hidden from every query of a tile are skipped). Dropout multiplies
// the weights by M / (1 − p) after the row sums (forward) and P and dP alike in both backward
// passes, the mask regenerated from its coordinates (attnlab/attention/dropout.hpp).
//
// Tiles: TILE query rows × TILE keys (TILE = 64, or 16 when the head dims need more shared memory
// than the device has). 256 threads; thread (ty, tx) = (t / 16, t % 16) owns rows ty + 16·i and
// columns tx + 16·j of each product's output (micro_gemm), so that its shared-memory reads are
// broadcasts along rows and consecutive (or odd-strided) along columns. Head dims are padded with
// zeros to a multiple of 64 in shared memory: the padding adds zeros to every dot product.
//
// Device code only, on raw pointers: compiled by nvcc through cuda_device_ops.cu, and by the C++
// compiler in tests/backends/test_cuda_emulated.cpp, which runs these kernels on the CPU under an
// emulation of the CUDA thread model (device_compat.cuh).
#pragma once

#include <algorithm>
#include <cstddef>

#include "attention_fused_tiles.cuh"
#include "attention_program_device.cuh"
#include "attnlab/attention/dropout.hpp"
#include "attnlab/attention/params.hpp"
#include "attnlab/attention/score_rule.hpp"
#include "attnlab/kernel_math.hpp"
#include "device_compat.cuh"
#include "reduce.cuh"

namespace attnlab::cuda::fused {

namespace cm = kernel_math;

// ---- forward --------------------------------------------------------------------------------

template <class T>
std::size_t forward_smem(const Geometry& g, int tile) {
  // Q, K-then-V, S/P, O accumulator, row max / sum / rescale
  return sizeof(T) * (static_cast<std::size_t>(tile) * g.ldd + tile * cm::max_of(g.ldd, g.lddv) +
                      tile * g.lds + tile * g.dvp + 3 * tile);
}

// The kernels' bodies take the program P (NoProgram: the built-in rule alone); the kernels for a
// program are in attention_program_kernels.cuh.
template <class T, int TILE, class P>
__device__ inline void fused_forward_body(T* out, T* lse, const AttentionParams<T>& a,
                                          const ProgramRun<T, P>& run) {
  constexpr int MI = TILE / kSide, NS = TILE / kSide;
  ATTNLAB_DYNAMIC_SHARED(smem_raw);
  const Geometry g(a.D, a.Dv, TILE);
  const int ldkv = cm::max_of(g.ldd, g.lddv);
  T* qs = reinterpret_cast<T*>(smem_raw);  // (TILE, dp)  queries of this tile
  T* kvs = qs + TILE * g.ldd;              // (TILE, dp) keys, then (TILE, dvp) values
  T* ss = kvs + TILE * ldkv;               // (TILE, TILE) scores, then weights
  T* os = ss + TILE * g.lds;               // (TILE, dvp) unnormalised output
  T* row_max = os + TILE * g.dvp;
  T* row_sum = row_max + TILE;
  T* row_rescale = row_sum + TILE;

  const int t = threadIdx.x, tx = t % kSide, ty = t / kSide;
  const int lane = t % detail::kWarpSize, warp = t / detail::kWarpSize;
  const int warps = kThreads / detail::kWarpSize;
  // Packed grouped-query attention: the block's K/V slice kv serves the group's G query heads,
  // whose rows are interleaved, packed row ρ = i·G + m being query i of head slice kv·G + m. A K/V
  // tile is read once for every head of the group (G = 1: plain attention, ρ = i).
  const std::size_t kv = blockIdx.y, group = a.group(), packed = group * a.Tq;
  const std::size_t rho0 = static_cast<std::size_t>(blockIdx.x) * TILE;
  const auto query_of = [&](int r) { return (rho0 + r) / group; };  // ≥ Tq past the last row
  const auto slice_of = [&](int r) { return kv * group + (rho0 + r) % group; };
  const int D = static_cast<int>(a.D), Dv = static_cast<int>(a.Dv);

  for (int e = t; e < TILE * g.dp; e += kThreads) {  // Q rows of the packed tile, zero-padded
    const int r = e / g.dp, c = e % g.dp;
    const std::size_t i = query_of(r);
    qs[r * g.ldd + c] = (i < a.Tq && c < D) ? a.q[(slice_of(r) * a.Tq + i) * a.D + c] : T(0);
  }
  zero_tile(os, TILE * g.dvp);
  for (int r = t; r < TILE; r += kThreads) {
    row_max[r] = cm::negative_infinity<T>();
    row_sum[r] = T(0);
  }
  // The tile's queries see keys [key_begin(first), key_end(last)); the key tiles outside are
  // hidden from the whole tile.
  const std::size_t last_query = (std::min(rho0 + TILE, packed) - 1) / group;
  std::size_t key_end = attention::key_end(a, last_query);
  std::size_t key_start = attention::key_begin(a, rho0 / group) / TILE * TILE;
  // A mask program's block mask (query tiles of TILE rows) gives the keys the tile sees, in tiles
  // from its first, over the G slices whose rows it packs. Row block rb is packed rows
  // [rb·TILE·G, (rb + 1)·TILE·G), a whole number of packed tiles: each packed tile lies in one.
  const bool blocks = P::kMask && run.args.block_states != nullptr;
  const std::size_t row_block = rho0 / (static_cast<std::size_t>(TILE) * group);
  if (blocks) block_range(run.args, kv * group, group, row_block, key_start, key_end);

  for (std::size_t j0 = key_start; j0 < key_end; j0 += TILE) {
    TileState st;
    if constexpr (P::kMask) {
      st.partial = true;
      if (blocks) st = tile_state(run.args, kv * group, group, row_block, j0, TILE);
      if (st.skip) continue;  // the same for every thread of the block
    }
    __syncthreads();  // the previous tile's O update has finished reading V and P
    load_tile(kvs, ldkv, a.k + kv * a.Tk * a.D, j0, a.Tk, D, g.dp, TILE);
    __syncthreads();
    {  // S = s · Q Kᵀ, hidden at -inf                  (TILE,dp) x (dp,TILE) -> (TILE,TILE)
      T acc[MI][NS];
      fill(acc, T(0));
      micro_gemm(acc, qs, g.ldd, 1, kvs, 1, ldkv, g.dp, ty, tx, 0);
#pragma unroll
      for (int i = 0; i < MI; ++i) {
#pragma unroll
        for (int j = 0; j < NS; ++j) {
          const int r = ty + kSide * i, c = tx + kSide * j;
          const std::size_t bh = slice_of(r), h = cm::head_of(bh, a.H), b = cm::batch_of(bh, a.H);
          T score = tile_score(a, b, h, query_of(r), j0 + c, a.scale[h], acc[i][j]);
          if constexpr (P::kAny) {
            score = program_score(run, st, score, b, bh, h, query_of(r), j0 + c, a.Tq, a.Tk);
          }
          ss[r * g.lds + c] = score;
        }
      }
    }
    __syncthreads();  // S complete, K no longer read
    load_tile(kvs, ldkv, a.v + kv * a.Tk * a.Dv, j0, a.Tk, Dv, g.dvp, TILE);
    // Online softmax, one warp per row: P = exp(S − m_new), l ← α·l + Σ P, α = exp(m_old − m_new).
    for (int r = warp; r < TILE; r += warps) {
      T tile_max = cm::negative_infinity<T>();
      for (int c = lane; c < TILE; c += detail::kWarpSize) {
        tile_max = cm::max_of(tile_max, ss[r * g.lds + c]);
      }
      tile_max = detail::warp_max(tile_max);
      const cm::OnlineSoftmax<T> old{row_max[r], row_sum[r]};
      const T new_max = cm::max_of(old.max, tile_max);
      T tile_sum = 0;
      for (int c = lane; c < TILE; c += detail::kWarpSize) {
        const T p = cm::exp_shifted(ss[r * g.lds + c], new_max);
        tile_sum += p;  // the row sum normalises the weights before dropout
        ss[r * g.lds + c] = a.dropout_p == 0 ? p
                                             : p * attention::attention_dropout_factor<T>(
                                                       a, slice_of(r), query_of(r), j0 + c);
      }
      tile_sum = detail::warp_sum(tile_sum);
      if (lane == 0) {
        const T rescale = old.rescale_factor(new_max);
        row_rescale[r] = rescale;
        row_sum[r] = old.sum * rescale + tile_sum;
        row_max[r] = new_max;
      }
    }
    __syncthreads();
    // O ← α·O + P V                                    (TILE,TILE) x (TILE,dvp) -> (TILE,dvp)
    accumulate_product<MI>(os, g.dvp, ss, g.lds, 1, kvs, ldkv, 1, TILE, ty, tx, row_rescale);
  }
  __syncthreads();
  // O = O / l (0 for a row with no visible key); LSE = m + log l (-inf for such a row).
  for (int e = t; e < TILE * Dv; e += kThreads) {
    const int r = e / Dv, c = e % Dv;
    const std::size_t i = query_of(r);
    if (i < a.Tq) {
      const cm::OnlineSoftmax<T> state{row_max[r], row_sum[r]};
      out[cm::bhrc_offset(slice_of(r), i, c, a.Tq, a.Dv)] = os[r * g.dvp + c] * state.inverse_sum();
    }
  }
  for (int r = t; r < TILE; r += kThreads) {
    const std::size_t i = query_of(r);
    if (i < a.Tq) {
      lse[slice_of(r) * a.Tq + i] = cm::OnlineSoftmax<T>{row_max[r], row_sum[r]}.log_sum_exp();
    }
  }
}

// ---- backward -------------------------------------------------------------------------------

// D_i = Σ_c dO[i][c] · O[i][c], one warp per row.
template <class T>
__global__ void __launch_bounds__(kThreads)
    row_dot_kernel(T* row_dot, const T* dout, const T* out, std::size_t rows, std::size_t Dv) {
  const std::size_t row = static_cast<std::size_t>(blockIdx.x) * (kThreads / detail::kWarpSize) +
                          threadIdx.x / detail::kWarpSize;
  const int lane = threadIdx.x % detail::kWarpSize;
  if (row >= rows) return;  // whole warps leave together
  T acc = 0;
  for (std::size_t c = lane; c < Dv; c += detail::kWarpSize) {
    acc += dout[row * Dv + c] * out[row * Dv + c];
  }
  acc = detail::warp_sum(acc);
  if (lane == 0) row_dot[row] = acc;
}

// Loads the per-row LSE and D of query rows [i0, i0 + TILE); -inf and 0 beyond Tq.
template <class T>
__device__ inline void load_row_stats(T* lse_s, T* dot_s, const T* lse, const T* row_dot,
                                      std::size_t bh, std::size_t i0, std::size_t Tq, int tile) {
  for (int r = threadIdx.x; r < tile; r += blockDim.x) {
    const bool in = i0 + r < Tq;
    lse_s[r] = in ? lse[bh * Tq + i0 + r] : cm::negative_infinity<T>();
    dot_s[r] = in ? row_dot[bh * Tq + i0 + r] : T(0);
  }
}

// P = exp(s·Q Kᵀ − LSE) at the thread's own elements of the tile pair (queries i0 + r, keys
// j0 + c), with Q and K in shared memory; 0 at hidden positions and beyond Tq or Tk. slope gets
// the softcap's slope 1 − tanh²(u/c) at u = s·q·k (1 without a cap: attention::capped_slope).
// With a program P: the mask and score programs at the tile state st (slope = ∂f/∂u), and u
// itself to us (row stride lds) when it is not null, for the parameters' gradients.
template <class T, int MI, int NS, class P>
__device__ inline void tile_weights(T (&p)[MI][NS], T (&slope)[MI][NS], const T* qs, const T* ks,
                                    int ldd, int dp, const T* lse_s, const AttentionParams<T>& a,
                                    std::size_t b, std::size_t h, T s, std::size_t i0,
                                    std::size_t j0, int ty, int tx, const ProgramRun<T, P>& run,
                                    const TileState& st, T* us, int lds) {
  fill(p, T(0));
  micro_gemm(p, qs, ldd, 1, ks, 1, ldd, dp, ty, tx, 0);  // Q Kᵀ  (TILE,dp) x (dp,TILE)
#pragma unroll
  for (int i = 0; i < MI; ++i) {
#pragma unroll
    for (int j = 0; j < NS; ++j) {
      const int r = ty + kSide * i, c = tx + kSide * j;
      const T capped = attention::capped(a, s * p[i][j]);
      slope[i][j] = attention::capped_slope(a, capped);
      const std::size_t qi = i0 + r, kj = j0 + c;
      T score = qi < a.Tq && kj < a.Tk ? attention::score_of_capped(a, b, h, qi, kj, capped)
                                       : cm::negative_infinity<T>();
      if constexpr (P::kAny) {
        score =
            program_score_slope(run, st, score, b, b * a.H + h, h, qi, kj, a.Tq, a.Tk, slope[i][j]);
        if (us != nullptr) us[r * lds + c] = capped;
      }
      // weight_from_lse gives 0 for a hidden score (-inf)
      p[i][j] = cm::weight_from_lse(score, lse_s[r]);
    }
  }
}

// s·dS ⊙ slope, dS = P ⊙ (dP − D) with dP = dO Vᵀ (dO and V in shared memory), written to ds at
// the thread's own elements; slope is the softcap's (tile_weights). D = rowsum(dO ⊙ O) equals
// rowsum(dP ⊙ P). dS itself goes to dscores (the tile's first element in a (rows, Tk) matrix;
// `rows` x `cols` of the tile are in range) when it is not null: the bias gradient.
template <class T, int MI, int NS>
__device__ inline void tile_ds(T* ds, int lds, const T (&p)[MI][NS], const T (&slope)[MI][NS],
                               const T* dos, const T* vs, int lddv, int dvp, const T* dot_s, T s,
                               int ty, int tx, const AttentionParams<T>& a, std::size_t bh,
                               std::size_t i0, std::size_t j0, T* dscores, std::size_t rows,
                               std::size_t cols, T* es = nullptr) {
  T dp_acc[MI][NS];
  fill(dp_acc, T(0));
  micro_gemm(dp_acc, dos, lddv, 1, vs, 1, lddv, dvp, ty, tx, 0);  // dO Vᵀ (TILE,dvp) x (dvp,TILE)
#pragma unroll
  for (int i = 0; i < MI; ++i) {
#pragma unroll
    for (int j = 0; j < NS; ++j) {
      const int r = ty + kSide * i, c = tx + kSide * j;
      // With dropout, dP = (dO Vᵀ) ⊙ M / (1 − p)
      const T dp = a.dropout_p == 0 ? dp_acc[i][j]
                                    : dp_acc[i][j] * attention::attention_dropout_factor<T>(
                                                         a, bh, i0 + r, j0 + c);
      const T element = cm::softmax_backward_element(p[i][j], dp, dot_s[r]);
      if (dscores != nullptr && static_cast<std::size_t>(r) < rows &&
          static_cast<std::size_t>(c) < cols) {
        dscores[r * a.Tk + c] = element;
      }
      if (es != nullptr) es[r * lds + c] = element;  // dL/dS, for the parameters' gradients
      ds[r * lds + c] = s * element * slope[i][j];
    }
  }
}

template <class T>
std::size_t key_pass_smem(const Geometry& g, int tile, bool program_grads = false) {
  // K, V, Q, dO, P/dS, dK and dV accumulators, LSE and D of the query tile; a score program's u
  // and dS for the gradients of its parameters
  return sizeof(T) * (static_cast<std::size_t>(tile) * (2 * g.ldd + 2 * g.lddv + g.lds + g.dp +
                                                        g.dvp + (program_grads ? 2 * g.lds : 0)) +
                      2 * tile);
}

// dK and dV of one key tile, over every query tile that can see it.
template <class T, int TILE, class P>
__device__ inline void fused_key_pass_body(T* dk, T* dv, const T* dout, const T* lse,
                                           const T* row_dot, const AttentionParams<T>& a,
                                           const ProgramRun<T, P>& run) {
  constexpr int MI = TILE / kSide, NS = TILE / kSide;
  ATTNLAB_DYNAMIC_SHARED(smem_raw);
  const Geometry g(a.D, a.Dv, TILE);
  T* ks = reinterpret_cast<T*>(smem_raw);  // (TILE, dp)
  T* vs = ks + TILE * g.ldd;               // (TILE, dvp)
  T* qs = vs + TILE * g.lddv;              // (TILE, dp)
  T* dos = qs + TILE * g.ldd;              // (TILE, dvp)
  T* ps = dos + TILE * g.lddv;             // (TILE queries, TILE keys): P, then dS
  T* dks = ps + TILE * g.lds;              // (TILE, dp)
  T* dvs = dks + TILE * g.dp;              // (TILE, dvp)
  T* lse_s = dvs + TILE * g.dvp;
  T* dot_s = lse_s + TILE;
  // A score program's u and dS of the tile (key_pass_smem with program_grads)
  T* us = P::kScore ? dot_s + TILE : nullptr;
  T* es = P::kScore ? us + TILE * g.lds : nullptr;

  const int t = threadIdx.x, tx = t % kSide, ty = t / kSide;
  // The block's own row of parameter gradients, zeroed and then summed by thread 0 alone.
  T* grad_row =
      P::kScore && run.args.grad_rows != nullptr
          ? run.args.grad_rows +
                (static_cast<std::size_t>(blockIdx.y) * gridDim.x + blockIdx.x) * run.args.width
          : nullptr;
  if (grad_row != nullptr && t == 0) {
    for (std::size_t e = 0; e < run.args.width; ++e) grad_row[e] = T(0);
  }
  // One block per (K/V slice, key tile): the tiles of K and V are read once for the whole group
  // of query heads that share them (grouped-query attention), whose dK and dV add up here.
  const std::size_t kv = blockIdx.y, group = a.group();
  const std::size_t j0 = static_cast<std::size_t>(blockIdx.x) * TILE;
  const int D = static_cast<int>(a.D), Dv = static_cast<int>(a.Dv);

  load_tile(ks, g.ldd, a.k + kv * a.Tk * a.D, j0, a.Tk, D, g.dp, TILE);
  load_tile(vs, g.lddv, a.v + kv * a.Tk * a.Dv, j0, a.Tk, Dv, g.dvp, TILE);
  zero_tile(dks, TILE * g.dp);
  zero_tile(dvs, TILE * g.dvp);
  // Queries before query_begin(j0) see none of these keys; start at the tile holding it.
  const std::size_t first_query = attention::query_begin(a, j0) / TILE * TILE;
  // Queries from query_end(last key of the tile) on see none of them either (a sliding window).
  const std::size_t query_stop = attention::query_end(a, std::min(j0 + TILE, a.Tk) - 1);

  for (std::size_t bh = kv * group; bh < (kv + 1) * group; ++bh) {
    const std::size_t b = cm::batch_of(bh, a.H), h = cm::head_of(bh, a.H);
    const T s = a.scale[h];
    for (std::size_t i0 = first_query; i0 < query_stop; i0 += TILE) {
      TileState st;
      if constexpr (P::kMask) {
        st.partial = true;
        if (run.args.block_states != nullptr) st = tile_state(run.args, bh, i0 / TILE, j0, TILE);
        if (st.skip) continue;  // the same for every thread of the block
      }
      __syncthreads();  // the previous query tile is no longer read
      load_tile(qs, g.ldd, a.q + bh * a.Tq * a.D, i0, a.Tq, D, g.dp, TILE);
      load_tile(dos, g.lddv, dout + bh * a.Tq * a.Dv, i0, a.Tq, Dv, g.dvp, TILE);
      load_row_stats(lse_s, dot_s, lse, row_dot, bh, i0, a.Tq, TILE);
      __syncthreads();
      // P = exp(s·Q Kᵀ − LSE), kept in registers for dS and stored for dV
      T p[MI][NS], slope[MI][NS];
      tile_weights(p, slope, qs, ks, g.ldd, g.dp, lse_s, a, b, h, s, i0, j0, ty, tx, run, st, us,
                   g.lds);
#pragma unroll
      for (int i = 0; i < MI; ++i) {
#pragma unroll
        for (int j = 0; j < NS; ++j) {  // P ⊙ M / (1 − p) with dropout, for dV
          const int r = ty + kSide * i, c = tx + kSide * j;
          ps[r * g.lds + c] = a.dropout_p == 0 ? p[i][j]
                                               : p[i][j] * attention::attention_dropout_factor<T>(
                                                               a, bh, i0 + r, j0 + c);
        }
      }
      __syncthreads();
      // dV += Pᵀ dO                                      (TILE,TILE)ᵀ x (TILE,dvp) -> (TILE,dvp)
      accumulate_product<MI>(dvs, g.dvp, ps, 1, g.lds, dos, g.lddv, 1, TILE, ty, tx);
      __syncthreads();  // P is no longer read: overwrite it with dS
      // dS of the tile to a.dscores (the bias gradient) in this pass only: one writer per element
      T* dscores = a.dscores == nullptr ? nullptr : a.dscores + (bh * a.Tq + i0) * a.Tk + j0;
      tile_ds(ps, g.lds, p, slope, dos, vs, g.lddv, g.dvp, dot_s, s, ty, tx, a, bh, i0, j0, dscores,
              std::min<std::size_t>(TILE, a.Tq - i0), std::min<std::size_t>(TILE, a.Tk - j0), es);
      __syncthreads();
      if (grad_row != nullptr && t == 0) {  // read while the others compute dK below
        accumulate_param_grads(
            run, grad_row, es, us, g.lds, static_cast<int>(std::min<std::size_t>(TILE, a.Tq - i0)),
            static_cast<int>(std::min<std::size_t>(TILE, a.Tk - j0)), b, h, i0, j0);
      }
      // dK += dSᵀ Q  (dS already carries s)              (TILE,TILE)ᵀ x (TILE,dp) -> (TILE,dp)
      accumulate_product<MI>(dks, g.dp, ps, 1, g.lds, qs, g.ldd, 1, TILE, ty, tx);
    }
  }
  __syncthreads();
  // Keys that no query sees keep their zero accumulators: every element is written.
  for (int e = t; e < TILE * D; e += kThreads) {
    const int r = e / D, c = e % D;
    if (j0 + r < a.Tk) dk[cm::bhrc_offset(kv, j0 + r, c, a.Tk, a.D)] = dks[r * g.dp + c];
  }
  for (int e = t; e < TILE * Dv; e += kThreads) {
    const int r = e / Dv, c = e % Dv;
    if (j0 + r < a.Tk) dv[cm::bhrc_offset(kv, j0 + r, c, a.Tk, a.Dv)] = dvs[r * g.dvp + c];
  }
}

template <class T>
std::size_t query_pass_smem(const Geometry& g, int tile) {
  // Q, dO, K, V, dS, dQ accumulator, LSE and D
  return sizeof(T) *
         (static_cast<std::size_t>(tile) * (2 * g.ldd + 2 * g.lddv + g.lds + g.dp) + 2 * tile);
}

// dQ of one query tile, over the key tiles it can see.
template <class T, int TILE, class P>
__device__ inline void fused_query_pass_body(T* dq, const T* dout, const T* lse, const T* row_dot,
                                             const AttentionParams<T>& a,
                                             const ProgramRun<T, P>& run) {
  constexpr int MI = TILE / kSide;
  ATTNLAB_DYNAMIC_SHARED(smem_raw);
  const Geometry g(a.D, a.Dv, TILE);
  T* qs = reinterpret_cast<T*>(smem_raw);  // (TILE, dp)
  T* dos = qs + TILE * g.ldd;              // (TILE, dvp)
  T* ks = dos + TILE * g.lddv;             // (TILE, dp)
  T* vs = ks + TILE * g.ldd;               // (TILE, dvp)
  T* ds = vs + TILE * g.lddv;              // (TILE, TILE)
  T* dqs = ds + TILE * g.lds;              // (TILE, dp)
  T* lse_s = dqs + TILE * g.dp;
  T* dot_s = lse_s + TILE;

  const int t = threadIdx.x, tx = t % kSide, ty = t / kSide;
  const std::size_t bh = blockIdx.y, b = cm::batch_of(bh, a.H), h = cm::head_of(bh, a.H);
  const std::size_t kv = a.kv_slice_of(bh);
  const std::size_t i0 = static_cast<std::size_t>(blockIdx.x) * TILE;
  const T s = a.scale[h];
  const int D = static_cast<int>(a.D), Dv = static_cast<int>(a.Dv);

  load_tile(qs, g.ldd, a.q + bh * a.Tq * a.D, i0, a.Tq, D, g.dp, TILE);
  load_tile(dos, g.lddv, dout + bh * a.Tq * a.Dv, i0, a.Tq, Dv, g.dvp, TILE);
  load_row_stats(lse_s, dot_s, lse, row_dot, bh, i0, a.Tq, TILE);
  zero_tile(dqs, TILE * g.dp);
  const std::size_t last_query = std::min(i0 + TILE, a.Tq) - 1;
  std::size_t key_end = attention::key_end(a, last_query);
  std::size_t key_start = attention::key_begin(a, i0) / TILE * TILE;
  if (P::kMask && run.args.block_states != nullptr) {
    block_range(run.args, bh, 1, blockIdx.x, key_start, key_end);
  }

  for (std::size_t j0 = key_start; j0 < key_end; j0 += TILE) {
    TileState st;
    if constexpr (P::kMask) {
      st.partial = true;
      if (run.args.block_states != nullptr) st = tile_state(run.args, bh, blockIdx.x, j0, TILE);
      if (st.skip) continue;  // the same for every thread of the block
    }
    __syncthreads();  // the previous key tile and dS are no longer read
    load_tile(ks, g.ldd, a.k + kv * a.Tk * a.D, j0, a.Tk, D, g.dp, TILE);
    load_tile(vs, g.lddv, a.v + kv * a.Tk * a.Dv, j0, a.Tk, Dv, g.dvp, TILE);
    __syncthreads();
    {
      T p[MI][MI], slope[MI][MI];
      tile_weights(p, slope, qs, ks, g.ldd, g.dp, lse_s, a, b, h, s, i0, j0, ty, tx, run, st,
                   static_cast<T*>(nullptr), 0);
      tile_ds(ds, g.lds, p, slope, dos, vs, g.lddv, g.dvp, dot_s, s, ty, tx, a, bh, i0, j0,
              static_cast<T*>(nullptr), 0, 0);
    }
    __syncthreads();
    // dQ += dS K  (dS already carries s)               (TILE,TILE) x (TILE,dp) -> (TILE,dp)
    accumulate_product<MI>(dqs, g.dp, ds, g.lds, 1, ks, g.ldd, 1, TILE, ty, tx);
  }
  __syncthreads();
  for (int e = t; e < TILE * D; e += kThreads) {
    const int r = e / D, c = e % D;
    if (i0 + r < a.Tq) dq[cm::bhrc_offset(bh, i0 + r, c, a.Tq, a.D)] = dqs[r * g.dp + c];
  }
}

template <class T, int TILE>
__global__ void __launch_bounds__(kThreads)
    fused_forward_kernel(T* out, T* lse, AttentionParams<T> a) {
  fused_forward_body<T, TILE>(out, lse, a, ProgramRun<T, NoProgram>{});
}
template <class T, int TILE>
__global__ void __launch_bounds__(kThreads)
    fused_key_pass_kernel(T* dk, T* dv, const T* dout, const T* lse, const T* row_dot,
                          AttentionParams<T> a) {
  fused_key_pass_body<T, TILE>(dk, dv, dout, lse, row_dot, a, ProgramRun<T, NoProgram>{});
}
template <class T, int TILE>
__global__ void __launch_bounds__(kThreads)
    fused_query_pass_kernel(T* dq, const T* dout, const T* lse, const T* row_dot,
                            AttentionParams<T> a) {
  fused_query_pass_body<T, TILE>(dq, dout, lse, row_dot, a, ProgramRun<T, NoProgram>{});
}

// Grids: x = tile index, y = b·h.
template <class T>
inline dim3 query_tile_grid(const AttentionParams<T>& a, int tile) {
  return dim3(static_cast<unsigned>(cm::tile_count(a.Tq, tile)), static_cast<unsigned>(a.B * a.H));
}
template <class T>
inline dim3 packed_query_grid(const AttentionParams<T>& a, int tile) {  // the forward's grid
  return dim3(static_cast<unsigned>(cm::tile_count(a.group() * a.Tq, tile)),
              static_cast<unsigned>(a.B * a.Hkv));
}
template <class T>
inline dim3 key_tile_grid(const AttentionParams<T>& a, int tile) {  // one block per K/V slice
  return dim3(static_cast<unsigned>(cm::tile_count(a.Tk, tile)),
              static_cast<unsigned>(a.B * a.Hkv));
}
constexpr std::size_t kRowDotRowsPerBlock = kThreads / detail::kWarpSize;  // one warp per row

}  // namespace attnlab::cuda::fused
