// Tensor-core fused attention, FlashAttention-2's algorithm (Dao 2023, Algorithms 1 and 2) on
// mma.sync m16n8k16: bf16 operands, fp32 accumulators and softmax, head dims 64 and 128.
//
//   inputs     q (B,H,Tq,HD), k and v (B,Hkv,Tk,HD), dO (B,H,Tq,HD): bf16, contiguous, row-major,
//              as the fp32 kernels' (attention_fused_kernels.cuh). Sizes, scale s_h (H floats in
//              device memory) and variants come from an AttentionParams<float>, whose own q, k, v
//              are not read.
//   outputs    O (B,H,Tq,HD) and the log-sum-exp LSE (B,H,Tq) in fp32; dQ (B,H,Tq,HD), dK and dV
//              (B,Hkv,Tk,HD) in fp32; dS (B,H,Tq,Tk) in fp32 to AttentionParams::dscores when set.
//
//   forward    one block per (tile of 64 packed query rows, b·kv head): 4 warps of 16 rows each;
//              the rows of the G = H / Hkv query heads that share a K/V head are interleaved (row
//              i·G + m: query i of head m, as the fp32 kernels), so a K/V tile is read once per
//              group, and every row has its own head (scale, ALiBi slope, bias). Q, and K/V
//              tiles of 64 keys, go to shared memory by cp.async (16-byte copies, zero-filled past
//              Tq and Tk); K and V are double-buffered, the next tile in flight while this one is
//              used. Per key tile a warp computes S = Q Kᵀ (16 × 64: ldmatrix.x4 for Q and K, 8 ×
//              HD/16 mma), the score rule on every element of its fragments, the online softmax in
//              registers (each lane holds 2 rows; row max over the quad by __shfl_xor_sync, the row
//              sum kept per lane and summed over the quad at the end), rescales O, and adds P V
//              with P (⊙ the dropout mask M, after the row sum) rounded to bf16 in registers
//              (the S accumulators become the A fragments) and V by ldmatrix.x4.trans; O / l
//              (· 1 / (1 − p) with dropout) at the end.
//   row_dot    D = rowsum(dO ⊙ O), one warp per row (dO bf16, O fp32).
//   dK/dV      one block per (tile of 64 keys, b·kv head): 4 warps of 16 keys each, K and V loaded
//              once; loop over the group's query heads (grouped-query attention) and the query
//              tiles that can see the keys, Q and dO (and LSE, D) double-buffered. Per query tile a
//              warp computes Sᵀ = K Qᵀ and dPᵀ = V dOᵀ (16 keys × 64 queries), recomputes
//              Pᵀ = exp(Sᵀ − LSE), dSᵀ = s·Pᵀ ⊙ (dPᵀ − D) (⊙ the softcap's slope), and adds
//              dV += Pᵀ dO and dK += dSᵀ Q with Pᵀ and dSᵀ in bf16 straight from its registers
//              (dO and Q by ldmatrix.trans). With dropout, dP = (dO Vᵀ) ⊙ M / (1 − p) and dV
//              sums (P ⊙ M)ᵀ dO, times 1 / (1 − p) at the end.
//   dQ         one block per (tile of 64 packed query rows, b·kv head), rows as the forward's: loop
//              over the key tiles it can see, K and V double-buffered; S = Q Kᵀ, dP = dO Vᵀ, dS as
//              above, dQ += dS K (K by .trans); dS itself (before s and the slope, as the fp32
//              kernels write it) to dscores.
// Every output element has exactly one writer, which sums in a fixed order: deterministic, no
// atomics, no zeroed output needed, except dscores: as on the other fused paths (params.hpp), the
// tiles that the rule hides from a whole tile are not written, so pass zeroed memory. The score
// rule (attnlab/attention/score_rule.hpp) is applied per fragment element (score_of_scaled, or
// capped / capped_slope / score_of_capped in the backward), so causal with a query offset, the
// sliding window, the key mask, ALiBi, an additive bias, the softcap and grouped-query attention
// (the packed rows) come from the one rule; key_begin, key_end, query_begin and query_end skip the
// tiles it hides from a whole tile. Dropout is the fp32 kernels' (attention_fused_kernels.cuh):
// the row sums normalise before it, and the mask M of each weight is regenerated from its
// coordinates (attention_kept, attnlab/attention/dropout.hpp) in all three kernels, so every path
// draws the same mask; the scale 1 / (1 − p) goes to O and dV in fp32 (FlashAttention's
// rp_dropout), so P is rounded to bf16 as without dropout. Attention programs are not run
// (check_attention_params).
//
// Shared memory rows are HD + 8 bf16 (16 bytes of padding: ldmatrix's 8 row addresses fall in
// different banks). Forward: Q + 2 K + 2 V tiles = 5 · 64 · (HD + 8) · 2 bytes (46,080 for
// HD = 64, 87,040 for 128); backward: 6 tiles and 4 · 64 floats (56,320 and 105,472): above 48 KiB,
// the launch raises the kernel's limit (CudaRuntime::launch does), sm_80 and later.
//
// Device code only, on raw pointers, except the launch glue at the end, templated on a Runtime
// with KernelDeviceOps's launch(kernel, grid, block, shared_bytes, args...)
// (kernel_device_ops.hpp): under nvcc the CUDA runtime, on the CPU the emulator
// (attnlab/backends/cuda_emulator.hpp, included first), whose mma, ldmatrix and cp.async hold
// per-lane fragments as on the hardware.
#pragma once

#include <cstddef>
#include <cstdint>
#include <stdexcept>
#include <string>

#include "attention_tc_fragments.cuh"
#include "attnlab/attention/dropout.hpp"
#include "attnlab/attention/params.hpp"
#include "attnlab/attention/score_rule.hpp"
#include "attnlab/kernel_math.hpp"
#include "device_compat.cuh"
#include "reduce.cuh"

namespace attnlab::cuda::tc {

// ---- dropout -----------------------------------------------------------------------------------

// The products take the mask M alone (P ⊙ M, P rounded to bf16 as without dropout: the largest
// weight of a row stays exactly 1) and the outputs that sum them, O and dV, the scale 1 / (1 − p)
// in fp32 at the end, as FlashAttention's rp_dropout: the same numbers as P ⊙ M / (1 − p) in exact
// arithmetic, one bf16 rounding less. dP ⊙ M / (1 − p) is in fp32 already and takes both at once.

// 1 / (1 − p), or 1 without dropout.
__device__ inline float dropout_scale(const AttentionSpec& a) {
  return a.dropout_p == 0 ? 1.0f : static_cast<float>(1.0 / (1.0 - a.dropout_p));
}

// attention_kept (attnlab/attention/dropout.hpp) of weights (bh, i, j) and (bh, i, j + 1), j even,
// to kept[0] and kept[1]: one Philox block holds both words (j % 4 is 0 or 2), so the forward's two
// adjacent accumulator columns of a row cost one generator call. The same bits, element by element.
// (The backward calls attention_dropout_factor per element: the pairing there spilled registers.)
__device__ inline void kept_pair(const AttentionSpec& a, std::size_t bh, std::size_t i,
                                 std::size_t j, bool (&kept)[2]) {
  const attention::Philox4 r =
      attention::philox_block(a.dropout_seed, static_cast<std::uint32_t>(i),
                              static_cast<std::uint32_t>(bh), attention::kAttentionStream, j);
  const std::uint32_t threshold = attention::dropout_threshold(a.dropout_p);
  const bool high = (j & 2) != 0;  // words 2, 3 of the block, else 0, 1 (selects, no indexing)
  kept[0] = (high ? r.x[2] : r.x[0]) >= threshold;
  kept[1] = (high ? r.x[3] : r.x[1]) >= threshold;
}

// ---- K/V tiles of the forward and dQ -----------------------------------------------------------

// The key tiles that packed rows [p0, p0 + 64) see, from key_begin of their first query to
// key_end of their last (tiles outside are hidden from the whole tile), with K and V of the slice
// (kg, vg) double-buffered in shared memory (ks, vs: 2 tiles each) by cp.async.
template <int HD>
struct KeyValueTiles {
  attnlab_bf16* ks;
  attnlab_bf16* vs;
  const attnlab_bf16* kg;
  const attnlab_bf16* vg;
  std::size_t Tk;
  std::size_t start = 0;
  int count = 0;

  __device__ KeyValueTiles(attnlab_bf16* ks_, attnlab_bf16* vs_, const attnlab_bf16* kg_,
                           const attnlab_bf16* vg_, const AttentionParams<float>& a, std::size_t p0,
                           std::size_t group)
      : ks(ks_), vs(vs_), kg(kg_), vg(vg_), Tk(a.Tk) {
    const std::size_t first = p0 / group, last = (min_size(p0 + kRows, a.Tq * group) - 1) / group;
    start = attention::key_begin(a, first) / kKeys * kKeys;
    const std::size_t stop = attention::key_end(a, last);
    count = stop > start ? static_cast<int>(cm::tile_count(stop - start, kKeys)) : 0;
  }

  // The first key of tile it.
  __device__ std::size_t key0(int it) const { return start + static_cast<std::size_t>(it) * kKeys; }

  // Issues the copies of tile 0 (when there is one) into buffer 0; the caller commits.
  __device__ void issue_first() const {
    if (count > 0) {
      async_tile<HD>(ks, kg, start, Tk);
      async_tile<HD>(vs, vg, start, Tk);
    }
  }

  // Issues tile it + 1 into the other buffer (read two barriers ago), then waits for tile it and
  // the block; returns the buffer of tile it.
  __device__ int wait(int it) const {
    const int buf = it % 2;
    if (it + 1 < count) {
      async_tile<HD>(ks + (1 - buf) * Shape<HD>::kTile, kg, key0(it + 1), Tk);
      async_tile<HD>(vs + (1 - buf) * Shape<HD>::kTile, vg, key0(it + 1), Tk);
    }
    attnlab_cp_async_commit();
    attnlab_cp_async_wait<1>();  // every group but the newest (the next tile): this tile is in
    __syncthreads();
    return buf;
  }
};

// ---- forward -----------------------------------------------------------------------------------

template <int HD>
__global__ void __launch_bounds__(kThreads)
    tc_forward_kernel(float* out, float* lse, const attnlab_bf16* q, const attnlab_bf16* k,
                      const attnlab_bf16* v, AttentionParams<float> a) {
  using S = Shape<HD>;
  ATTNLAB_DYNAMIC_SHARED(smem_raw);
  attnlab_bf16* qs = reinterpret_cast<attnlab_bf16*>(smem_raw);  // (64, HD)
  attnlab_bf16* ks = qs + S::kTile;                              // 2 × (64, HD)
  attnlab_bf16* vs = ks + 2 * S::kTile;                          // 2 × (64, HD)

  const int warp = static_cast<int>(threadIdx.x) / detail::kWarpSize;
  const int lane = static_cast<int>(threadIdx.x) % detail::kWarpSize, g = lane / 4, t = lane % 4;
  const std::size_t kv = blockIdx.y, group = a.group(), b = kv / a.Hkv;
  const std::size_t p0 = static_cast<std::size_t>(blockIdx.x) * kRows;  // first packed row
  // The lane's two rows: g and g + 8 of the warp's 16 (accumulator elements 0, 1 and 2, 3), packed
  // rows of the group's heads (query row[r] of head slice slice[r]; row[r] >= Tq past the end).
  std::size_t row[2];
  unsigned slice[2], head[2];  // B·H < 2¹⁶ (check_tc_params)
  float s[2];
  ATTNLAB_UNROLL
  for (int r = 0; r < 2; ++r) {
    const std::size_t p = p0 + 16 * warp + g + 8 * r;
    row[r] = p / group;
    slice[r] = static_cast<unsigned>(kv * group + p % group);
    head[r] = static_cast<unsigned>(cm::head_of(slice[r], a.H));
    s[r] = a.scale[head[r]];
  }

  const KeyValueTiles<HD> tiles(ks, vs, k + kv * a.Tk * HD, v + kv * a.Tk * HD, a, p0, group);
  async_packed_tile<HD>(qs, q, kv, group, p0, a.Tq);
  tiles.issue_first();
  attnlab_cp_async_commit();

  float o[S::kDTiles][4];
  zero(o);
  float row_max[2] = {cm::negative_infinity<float>(), cm::negative_infinity<float>()};
  float row_sum[2] = {0.0f, 0.0f};  // the lane's part: its 16 columns of each tile

  for (int it = 0; it < tiles.count; ++it) {
    const std::size_t j0 = tiles.key0(it);
    const int buf = tiles.wait(it);
    const attnlab_bf16* kt = ks + buf * S::kTile;
    const attnlab_bf16* vt = vs + buf * S::kTile;

    float sc[kKeyTiles][4];  // S = Q Kᵀ, then the scores, then the weights
    rows_times_rows<HD>(sc, qs, 16 * warp, kt);
    float tile_max[2] = {cm::negative_infinity<float>(), cm::negative_infinity<float>()};
    ATTNLAB_UNROLL
    for (int nt = 0; nt < kKeyTiles; ++nt) {
      ATTNLAB_UNROLL
      for (int e = 0; e < 4; ++e) {
        const std::size_t i = row[e / 2], j = j0 + 8 * nt + 2 * t + e % 2;
        const float x = i < a.Tq && j < a.Tk ? attention::score_of_scaled(a, b, head[e / 2], i, j,
                                                                          s[e / 2] * sc[nt][e])
                                             : cm::negative_infinity<float>();
        sc[nt][e] = x;
        tile_max[e / 2] = cm::max_of(tile_max[e / 2], x);
      }
    }
    float rescale[2];
    ATTNLAB_UNROLL
    for (int r = 0; r < 2; ++r) {
      const float new_max = cm::max_of(row_max[r], quad_max(tile_max[r]));
      rescale[r] = cm::exp_shifted(row_max[r], new_max);  // 0 while the row has seen nothing
      row_max[r] = new_max;
      row_sum[r] *= rescale[r];
    }
    ATTNLAB_UNROLL
    for (int nt = 0; nt < kKeyTiles; ++nt) {
      ATTNLAB_UNROLL
      for (int e = 0; e < 4; ++e) {
        const float p = cm::exp_shifted(sc[nt][e], row_max[e / 2]);
        row_sum[e / 2] += p;  // in fp32, before dropout and before P is rounded to bf16 for P V
        sc[nt][e] = p;
      }
      if (a.dropout_p != 0) {  // P ⊙ M, the mask from the elements' coordinates; 1 / (1 − p) in O
        ATTNLAB_UNROLL
        for (int r = 0; r < 2; ++r) {
          bool kept[2];
          kept_pair(a, slice[r], row[r], j0 + 8 * nt + 2 * t, kept);
          if (!kept[0]) sc[nt][2 * r] = 0.0f;
          if (!kept[1]) sc[nt][2 * r + 1] = 0.0f;
        }
      }
    }
    ATTNLAB_UNROLL
    for (int dt = 0; dt < S::kDTiles; ++dt) {
      ATTNLAB_UNROLL
      for (int e = 0; e < 4; ++e) o[dt][e] *= rescale[e / 2];
    }
    accumulate_product<HD>(o, sc, vt);
    __syncthreads();  // buffer `buf` is refilled at the next iteration
  }
  attnlab_cp_async_wait_all();  // nothing is left in flight at the exit (no key tile: Q)

  // O = O / l (0 for a row with no visible key), / (1 − p) with dropout; LSE = m + log l (-inf for
  // such a row).
  ATTNLAB_UNROLL
  for (int r = 0; r < 2; ++r) {
    const cm::OnlineSoftmax<float> state{row_max[r], quad_sum(row_sum[r])};
    const std::size_t i = row[r];
    if (i >= a.Tq) continue;
    const float inverse = state.inverse_sum() * dropout_scale(a);
    float* o_row = out + (slice[r] * a.Tq + i) * HD;
    ATTNLAB_UNROLL
    for (int dt = 0; dt < S::kDTiles; ++dt) {
      o_row[8 * dt + 2 * t] = o[dt][2 * r] * inverse;
      o_row[8 * dt + 2 * t + 1] = o[dt][2 * r + 1] * inverse;
    }
    if (t == 0) lse[slice[r] * a.Tq + i] = state.log_sum_exp();
  }
}

// ---- backward ----------------------------------------------------------------------------------

// D = rowsum(dO ⊙ O) over `rows` rows of HD, one warp per row.
template <int HD>
__global__ void __launch_bounds__(kThreads)
    tc_row_dot_kernel(float* row_dot, const attnlab_bf16* dout, const float* out,
                      std::size_t rows) {
  const std::size_t r =
      static_cast<std::size_t>(blockIdx.x) * kWarps + threadIdx.x / detail::kWarpSize;
  const int lane = static_cast<int>(threadIdx.x) % detail::kWarpSize;
  if (r >= rows) return;  // whole warps leave together
  float acc = 0.0f;
  for (int c = lane; c < HD; c += detail::kWarpSize) {
    acc += attnlab_bf16_to_float(dout[r * HD + c]) * out[r * HD + c];
  }
  acc = detail::warp_sum(acc);
  if (lane == 0) row_dot[r] = acc;
}

// A row's query head: its slice bh = b·H + h, its head h and scale s_h (B·H < 2¹⁶: 32 bits).
struct RowHead {
  unsigned bh, h;
  float s;
};

// The backward's elements of one tile pair of batch b, in place, element e of an n-tile in the head
// row_head(e): given the accumulators of the scaled dot (before s) and of dO Vᵀ, p becomes P =
// exp(S − LSE) (P ⊙ M with kDropped, for dV, which takes 1 / (1 − p) at the end) and dp becomes
// s·dS ⊙ slope, dS = P ⊙ (dP − D) with dP = (dO Vᵀ) ⊙ M / (1 − p) under dropout (M the forward's
// mask, regenerated from the coordinates). query(nt, e) and key(nt, e) locate an element; lse_of /
// dot_of give its row's LSE and D; dscore(nt, e, dS) gets dS itself (before s and the slope: the
// bias gradient, as the fp32 kernels' tile_ds).
template <bool kDropped, class Head, class Query, class Key, class Lse, class Dot, class Sink>
__device__ inline void tile_gradient(float (&p)[kKeyTiles][4], float (&dp)[kKeyTiles][4],
                                     const AttentionParams<float>& a, std::size_t b, Head row_head,
                                     Query query, Key key, Lse lse_of, Dot dot_of, Sink dscore) {
  ATTNLAB_UNROLL
  for (int nt = 0; nt < kKeyTiles; ++nt) {
    ATTNLAB_UNROLL
    for (int e = 0; e < 4; ++e) {
      const std::size_t i = query(nt, e), j = key(nt, e);
      const RowHead head = row_head(e);
      const std::size_t bh = head.bh, h = head.h;
      const float s = head.s;
      const float capped = attention::capped(a, s * p[nt][e]);
      const float slope = attention::capped_slope(a, capped);
      const float score = i < a.Tq && j < a.Tk ? attention::score_of_capped(a, b, h, i, j, capped)
                                               : cm::negative_infinity<float>();
      const float weight = cm::weight_from_lse(score, lse_of(nt, e));  // 0 when hidden
      const float keep =
          a.dropout_p == 0 ? 1.0f : attention::attention_dropout_factor<float>(a, bh, i, j);
      const float element = cm::softmax_backward_element(weight, dp[nt][e] * keep, dot_of(nt, e));
      dscore(nt, e, element);
      p[nt][e] = kDropped && keep == 0.0f ? 0.0f : weight;
      dp[nt][e] = s * element * slope;
    }
  }
}

// dK and dV of one tile of 64 keys of K/V slice blockIdx.y, over the query tiles of every query
// head of its group that can see them.
template <int HD>
__global__ void __launch_bounds__(kThreads)
    tc_key_pass_kernel(float* dk, float* dv, const attnlab_bf16* q, const attnlab_bf16* k,
                       const attnlab_bf16* v, const attnlab_bf16* dout, const float* lse,
                       const float* row_dot, AttentionParams<float> a) {
  using S = Shape<HD>;
  ATTNLAB_DYNAMIC_SHARED(smem_raw);
  attnlab_bf16* ks = reinterpret_cast<attnlab_bf16*>(smem_raw);  // (64 keys, HD)
  attnlab_bf16* vs = ks + S::kTile;                              // (64 keys, HD)
  attnlab_bf16* qs = vs + S::kTile;                              // 2 × (64 queries, HD)
  attnlab_bf16* dos = qs + 2 * S::kTile;                         // 2 × (64 queries, HD)
  float* lse_s = reinterpret_cast<float*>(dos + 2 * S::kTile);   // 2 × 64
  float* dot_s = lse_s + 2 * kKeys;                              // 2 × 64

  const int warp = static_cast<int>(threadIdx.x) / detail::kWarpSize;
  const int lane = static_cast<int>(threadIdx.x) % detail::kWarpSize, g = lane / 4, t = lane % 4;
  const std::size_t kv = blockIdx.y, group = a.group();
  const std::size_t j0 = static_cast<std::size_t>(blockIdx.x) * kRows;
  // Queries before query_begin(j0) see none of these keys, nor do those from query_end(last key).
  const std::size_t first_query = attention::query_begin(a, j0) / kKeys * kKeys;
  const std::size_t query_stop = attention::query_end(a, min_size(j0 + kRows, a.Tk) - 1);
  const std::size_t per_head =
      query_stop > first_query ? cm::tile_count(query_stop - first_query, kKeys) : 0;
  const int tiles = static_cast<int>(group * per_head);
  // Tile `it`: query tile it % per_head of head slice kv·G + it / per_head.
  const auto slice_of = [&](int it) {
    return kv * group + static_cast<std::size_t>(it) / per_head;
  };
  const auto first_of = [&](int it) {
    return first_query + static_cast<std::size_t>(it) % per_head * kKeys;
  };
  const auto issue = [&](int it, int buf) {
    const std::size_t bh = slice_of(it), i0 = first_of(it);
    async_tile<HD>(qs + buf * S::kTile, q + bh * a.Tq * HD, i0, a.Tq);
    async_tile<HD>(dos + buf * S::kTile, dout + bh * a.Tq * HD, i0, a.Tq);
    for (int r = static_cast<int>(threadIdx.x); r < kKeys; r += kThreads) {
      const bool in = i0 + r < a.Tq;
      lse_s[buf * kKeys + r] = in ? lse[bh * a.Tq + i0 + r] : cm::negative_infinity<float>();
      dot_s[buf * kKeys + r] = in ? row_dot[bh * a.Tq + i0 + r] : 0.0f;
    }
  };

  async_tile<HD>(ks, k + kv * a.Tk * HD, j0, a.Tk);
  async_tile<HD>(vs, v + kv * a.Tk * HD, j0, a.Tk);
  if (tiles > 0) issue(0, 0);
  attnlab_cp_async_commit();

  float dka[S::kDTiles][4], dva[S::kDTiles][4];
  zero(dka);
  zero(dva);
  for (int it = 0; it < tiles; ++it) {
    const int buf = it % 2;
    const std::size_t bh = slice_of(it), i0 = first_of(it);
    const std::size_t b = cm::batch_of(bh, a.H), h = cm::head_of(bh, a.H);
    if (it + 1 < tiles) issue(it + 1, 1 - buf);
    attnlab_cp_async_commit();
    attnlab_cp_async_wait<1>();
    __syncthreads();
    const attnlab_bf16* qt = qs + buf * S::kTile;
    const attnlab_bf16* dot = dos + buf * S::kTile;
    const float* lse_t = lse_s + buf * kKeys;
    const float* dot_t = dot_s + buf * kKeys;

    float pt[kKeyTiles][4], dst[kKeyTiles][4];  // Sᵀ then Pᵀ; dPᵀ then s·dSᵀ
    rows_times_rows<HD>(pt, ks, 16 * warp, qt);
    rows_times_rows<HD>(dst, vs, 16 * warp, dot);
    // Element (nt, e): key row g (+8 for e ≥ 2) of the warp's 16, query column 8nt + 2t + e % 2.
    // Pᵀ comes out dropped (Pᵀ ⊙ Mᵀ) for dV; dS goes to dscores in the query pass only.
    const RowHead tile_head{static_cast<unsigned>(bh), static_cast<unsigned>(h), a.scale[h]};
    tile_gradient<true>(
        pt, dst, a, b, [&](int) { return tile_head; },
        [&](int nt, int e) { return i0 + 8 * nt + 2 * t + e % 2; },
        [&](int, int e) { return j0 + 16 * warp + g + 8 * (e / 2); },
        [&](int nt, int e) { return lse_t[8 * nt + 2 * t + e % 2]; },
        [&](int nt, int e) { return dot_t[8 * nt + 2 * t + e % 2]; }, [](int, int, float) {});
    accumulate_product<HD>(dva, pt, dot);  // dV += (Pᵀ ⊙ Mᵀ) dO
    accumulate_product<HD>(dka, dst, qt);  // dK += s·dSᵀ Q
    __syncthreads();                       // buffer `buf` is refilled at the next iteration
  }
  attnlab_cp_async_wait_all();

  // Keys that no query sees keep their zero accumulators: every element is written. dV takes the
  // dropout's 1 / (1 − p) here.
  const float dv_scale = dropout_scale(a);
  ATTNLAB_UNROLL
  for (int r = 0; r < 2; ++r) {
    const std::size_t j = j0 + 16 * warp + g + 8 * r;
    if (j >= a.Tk) continue;
    float* dk_row = dk + (kv * a.Tk + j) * HD;
    float* dv_row = dv + (kv * a.Tk + j) * HD;
    ATTNLAB_UNROLL
    for (int dt = 0; dt < S::kDTiles; ++dt) {
      dk_row[8 * dt + 2 * t] = dka[dt][2 * r];
      dk_row[8 * dt + 2 * t + 1] = dka[dt][2 * r + 1];
      dv_row[8 * dt + 2 * t] = dva[dt][2 * r] * dv_scale;
      dv_row[8 * dt + 2 * t + 1] = dva[dt][2 * r + 1] * dv_scale;
    }
  }
}

// dQ of one tile of 64 packed query rows of the query heads of K/V slice blockIdx.y (as the
// forward's), over the key tiles they can see.
template <int HD>
__global__ void __launch_bounds__(kThreads)
    tc_query_pass_kernel(float* dq, const attnlab_bf16* q, const attnlab_bf16* k,
                         const attnlab_bf16* v, const attnlab_bf16* dout, const float* lse,
                         const float* row_dot, AttentionParams<float> a) {
  using S = Shape<HD>;
  ATTNLAB_DYNAMIC_SHARED(smem_raw);
  attnlab_bf16* qs = reinterpret_cast<attnlab_bf16*>(smem_raw);  // (64, HD)
  attnlab_bf16* dos = qs + S::kTile;                             // (64, HD)
  attnlab_bf16* ks = dos + S::kTile;                             // 2 × (64, HD)
  attnlab_bf16* vs = ks + 2 * S::kTile;                          // 2 × (64, HD)

  const int warp = static_cast<int>(threadIdx.x) / detail::kWarpSize;
  const int lane = static_cast<int>(threadIdx.x) % detail::kWarpSize, g = lane / 4, t = lane % 4;
  const std::size_t kv = blockIdx.y, group = a.group(), b = kv / a.Hkv;
  const std::size_t p0 = static_cast<std::size_t>(blockIdx.x) * kRows;  // first packed row
  // The lane's two packed rows, as the forward's: query row[r] of head slice slice[r].
  std::size_t row[2];
  unsigned slice[2];  // B·H < 2¹⁶ (check_tc_params)
  float scale[2];
  float row_lse[2], row_d[2];
  ATTNLAB_UNROLL
  for (int r = 0; r < 2; ++r) {
    const std::size_t p = p0 + 16 * warp + g + 8 * r, bh = kv * group + p % group;
    const std::size_t h = cm::head_of(bh, a.H);
    row[r] = p / group;
    slice[r] = static_cast<unsigned>(bh), scale[r] = a.scale[h];
    const bool in = row[r] < a.Tq;
    row_lse[r] = in ? lse[bh * a.Tq + row[r]] : cm::negative_infinity<float>();
    row_d[r] = in ? row_dot[bh * a.Tq + row[r]] : 0.0f;
  }

  const KeyValueTiles<HD> tiles(ks, vs, k + kv * a.Tk * HD, v + kv * a.Tk * HD, a, p0, group);
  async_packed_tile<HD>(qs, q, kv, group, p0, a.Tq);
  async_packed_tile<HD>(dos, dout, kv, group, p0, a.Tq);
  tiles.issue_first();
  attnlab_cp_async_commit();

  float dqa[S::kDTiles][4];
  zero(dqa);
  for (int it = 0; it < tiles.count; ++it) {
    const std::size_t j0 = tiles.key0(it);
    const int buf = tiles.wait(it);
    const attnlab_bf16* kt = ks + buf * S::kTile;
    const attnlab_bf16* vt = vs + buf * S::kTile;

    float p[kKeyTiles][4], ds[kKeyTiles][4];  // S then P; dP then s·dS
    rows_times_rows<HD>(p, qs, 16 * warp, kt);
    rows_times_rows<HD>(ds, dos, 16 * warp, vt);
    // Element (nt, e): query row g (+8 for e ≥ 2) of the warp's 16, key column 8nt + 2t + e % 2.
    // dS of the tile to a.dscores (the bias gradient): this pass is its one writer per element.
    tile_gradient<false>(
        p, ds, a, b,
        [&](int e) {
          return RowHead{slice[e / 2], slice[e / 2] % static_cast<unsigned>(a.H), scale[e / 2]};
        },
        [&](int, int e) { return row[e / 2]; },
        [&](int nt, int e) { return j0 + 8 * nt + 2 * t + e % 2; },
        [&](int, int e) { return row_lse[e / 2]; }, [&](int, int e) { return row_d[e / 2]; },
        [&](int nt, int e, float element) {
          const std::size_t i = row[e / 2], j = j0 + 8 * nt + 2 * t + e % 2;
          if (a.dscores != nullptr && i < a.Tq && j < a.Tk) {
            a.dscores[(slice[e / 2] * a.Tq + i) * a.Tk + j] = element;
          }
        });
    accumulate_product<HD>(dqa, ds, kt);  // dQ += s·dS K
    __syncthreads();
  }
  attnlab_cp_async_wait_all();

  ATTNLAB_UNROLL
  for (int r = 0; r < 2; ++r) {
    if (row[r] >= a.Tq) continue;
    float* dq_row = dq + (slice[r] * a.Tq + row[r]) * HD;
    ATTNLAB_UNROLL
    for (int dt = 0; dt < S::kDTiles; ++dt) {
      dq_row[8 * dt + 2 * t] = dqa[dt][2 * r];
      dq_row[8 * dt + 2 * t + 1] = dqa[dt][2 * r + 1];
    }
  }
}

// ---- launch glue -------------------------------------------------------------------------------

template <int HD>
constexpr std::size_t forward_smem() {
  return sizeof(attnlab_bf16) * 5 * Shape<HD>::kTile;
}
template <int HD>
constexpr std::size_t backward_smem() {  // the key pass's; the query pass takes 6 tiles only
  return sizeof(attnlab_bf16) * 6 * Shape<HD>::kTile + sizeof(float) * 4 * kKeys;
}

// Throws std::invalid_argument unless the tensor-core kernels run this call: head dims HD, a grid
// that fits.
inline void check_tc_params(const AttentionParams<float>& a, std::size_t head_dim, const char* op) {
  check_attention_params(a, op);
  const auto fail = [&](const std::string& what) {
    throw std::invalid_argument(std::string(op) + ": " + what);
  };
  if (a.D != head_dim || a.Dv != head_dim) {
    fail("head dims D = " + std::to_string(a.D) + ", Dv = " + std::to_string(a.Dv) +
         ", the kernel's are " + std::to_string(head_dim));
  }
  const std::size_t packed = a.Tq * a.group();  // the forward's and dQ's rows per K/V slice
  if (a.B * a.H > 65535 || cm::tile_count(packed > a.Tk ? packed : a.Tk, kRows) > 0x7fffffffu) {
    fail("B*H = " + std::to_string(a.B * a.H) + " exceeds 65535 (grid y)");
  }
}

// O (B,H,Tq,HD) and LSE (B,H,Tq) in fp32 from bf16 q, k, v in device memory. rt.launch as
// KernelDeviceOps's Runtime.
template <int HD, class Runtime>
void tc_attention_forward(Runtime& rt, float* out, float* lse, const attnlab_bf16* q,
                          const attnlab_bf16* k, const attnlab_bf16* v,
                          const AttentionParams<float>& a) {
  check_tc_params(a, HD, "sdpa tensor-core forward");
  if (a.B * a.H * a.Tq == 0) return;
  rt.launch(tc_forward_kernel<HD>,
            dim3(static_cast<unsigned>(cm::tile_count(a.Tq * a.group(), kRows)),
                 static_cast<unsigned>(a.B * a.Hkv)),
            dim3(kThreads), forward_smem<HD>(), out, lse, q, k, v, a);
}

// dQ (B,H,Tq,HD), dK and dV (B,Hkv,Tk,HD) in fp32 from the forward's O and LSE and dO (bf16).
// row_dot: B·H·Tq floats of device scratch (D = rowsum(dO ⊙ O)). Deterministic.
template <int HD, class Runtime>
void tc_attention_backward(Runtime& rt, float* dq, float* dk, float* dv, float* row_dot,
                           const attnlab_bf16* q, const attnlab_bf16* k, const attnlab_bf16* v,
                           const attnlab_bf16* dout, const float* out, const float* lse,
                           const AttentionParams<float>& a) {
  check_tc_params(a, HD, "sdpa tensor-core backward");
  const std::size_t rows = a.B * a.H * a.Tq;
  if (rows > 0) {
    rt.launch(tc_row_dot_kernel<HD>, dim3(static_cast<unsigned>(cm::tile_count(rows, kWarps))),
              dim3(kThreads), 0, row_dot, dout, out, rows);
  }
  if (a.B * a.Hkv * a.Tk > 0) {
    rt.launch(tc_key_pass_kernel<HD>,
              dim3(static_cast<unsigned>(cm::tile_count(a.Tk, kRows)),
                   static_cast<unsigned>(a.B * a.Hkv)),
              dim3(kThreads), backward_smem<HD>(), dk, dv, q, k, v, dout, lse,
              static_cast<const float*>(row_dot), a);
  }
  if (rows > 0) {
    rt.launch(tc_query_pass_kernel<HD>,
              dim3(static_cast<unsigned>(cm::tile_count(a.Tq * a.group(), kRows)),
                   static_cast<unsigned>(a.B * a.Hkv)),
              dim3(kThreads), sizeof(attnlab_bf16) * 6 * Shape<HD>::kTile, dq, q, k, v, dout, lse,
              static_cast<const float*>(row_dot), a);
  }
}

}  // namespace attnlab::cuda::tc
