// Fused, flash-style SDPA on the CPU: the same contract as the reference path in attention.cpp.
// References: Dao et al. 2022, "FlashAttention: Fast and Memory-Efficient Exact Attention with
// IO-Awareness", algorithms 1 (forward, online softmax) and 2 (backward, recomputing P); Dao 2023,
// "FlashAttention-2" (D_i = rowsum(dO ⊙ O), saving the log-sum-exp rather than max and sum).
//
// The forward runs one task per (K/V slice, row block), the group's query heads in turn on each key
// block (so grouped-query attention reads a K/V tile once per group); the backward one task per
// K/V slice. One thread per task, OpenBLAS single-threaded inside; a slice is cut into row blocks
// of Br queries and key blocks of Bc keys (Br x Bc tiles, gemm'd through blas.hpp; under a bf16
// GemmPrecisionScope on the bf16 tiles of kernels/bf16_tiles.hpp instead, see Products):
//   forward, per row block i, for each key block j:
//     S = s · Q_i K_jᵀ                 (Br,D) x (D,Bc) -> (Br,Bc), hidden positions at -inf
//     m' = max(m, rowmax S);  P = exp(S − m');  l = e^(m − m') l + rowsum P
//     O_i = e^(m − m') O_i + P V_j      (Br,Bc) x (Bc,Dv) -> (Br,Dv)
//   then O_i /= l and lse_i = m + log l (−inf, and O_i = 0, for a row that sees no key).
//   backward, with D_i = rowsum(dO_i ⊙ O_i) and P = exp(S − lse) recomputed per tile:
//     dV_j += Pᵀ dO_i,  dP = dO_i V_jᵀ,  dS = P ⊙ (dP − D_i),
//     dQ_i += s · dS K_j,  dK_j += s · dSᵀ Q_i
// (with a softcap, dS ⊙ (1 − tanh²(U/c)) in the last two, the slope kept from the recomputed tile).
// (rowsum(dP ⊙ P) = rowsum(dO ⊙ P V) = rowsum(dO ⊙ O) = D_i: the reference's softmax-Jacobian
// term without the full row of P.) The score rule (attnlab/attention/score_rule.hpp) scores and
// hides each tile row; key tiles that no row of a row block can see (causal) are skipped.
// Dropout (P ⊙ M / (1 − p) before P V, after the row sums) regenerates its mask per tile in the
// backward: dV_j += (P ⊙ M/(1−p))ᵀ dO_i, dP = (dO_i V_jᵀ) ⊙ M/(1−p); D_i = rowsum(dO ⊙ O) holds.
// Extra memory: two Br x Bc tiles (three with dropout) and O(Tk) per thread, plus O and lse.
#include "kernels/attention.hpp"
#include "kernels/attention_program.hpp"
#include "kernels/bf16_tiles.hpp"
#include "kernels/rows.hpp"

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <initializer_list>
#include <limits>
#include <type_traits>
#include <vector>

#include <xsimd/xsimd.hpp>

#include "attnlab/attention/dropout.hpp"
#include "attnlab/attention/score_rule.hpp"
#include "attnlab/blas.hpp"
#include "attnlab/ops/softmax.hpp"
#include "attnlab/threads.hpp"

namespace attnlab::detail {

namespace {

template <class T>
constexpr T kHidden = -std::numeric_limits<T>::infinity();

using row_kernels::row_max;

// x[c] = p[c] * (x[c] − shift), vectorised: dS = P ⊙ (dP − D_i) in place of dP.
template <class T>
void subtract_times(T* x, const T* p, T shift, std::size_t n) {
  using batch = xsimd::batch<T>;
  constexpr std::size_t width = batch::size;
  const batch shift_b(shift);
  std::size_t c = 0;
  for (; c + width <= n; c += width) {
    (batch::load_unaligned(p + c) * (batch::load_unaligned(x + c) - shift_b))
        .store_unaligned(x + c);
  }
  for (; c < n; ++c) x[c] = p[c] * (x[c] - shift);
}

// S = the score rule over the tile's scaled dots, row by row: rows [i0, i0 + br), keys [j0, j0 +
// bc). With slope (br, bc) set, the softcap's slope of each dot goes there too (the backward's).
template <class T>
void score_tile(T* sb, const AttentionParams<T>& p, std::size_t b, std::size_t h, std::size_t i0,
                std::size_t br, std::size_t j0, std::size_t bc, T* slope = nullptr) {
  for (std::size_t r = 0; r < br; ++r) {
    attention::cap_row(p, bc, sb + r * bc, slope == nullptr ? nullptr : slope + r * bc);
    attention::score_row_capped(p, b, h, i0 + r, j0, bc, sb + r * bc);
  }
}

// The products of the tiles: blas::gemm, or under a bf16 GemmPrecisionScope (float only) when
// asked for (ATTNLAB_BF16_TILES=amx or portable) the bf16 tiles of kernels/bf16_tiles.hpp, with the
// same contract. Dropout and attention programs keep blas::gemm (its bf16 gemm there): their tile
// code is not checked on the bf16 tiles yet.
// On the tiles, the call's inputs are packed once, before the tasks, into the tile layouts their
// products read (tiles::PackedInput), and a product whose operand lies in one reads its view; only
// the tiles of the call's own (P, dS) are packed per product. Same values, same zero padding, same
// order of the sums: the bits of packing every operand per product.
// On bf16 gemms (no tiles), the call's inputs (q, k, v, and dO in the backward) are rounded once,
// before the tasks, where a gemm per tile would round its own copies of the same rows again for
// every tile that reads them; a product whose operand lies in a rounded input reads its rows
// (blas::gemm_bf16), and a tile of the call's own (P, dS) is rounded as the gemm would. Same
// values, same compact strides: the bits of blas::gemm.
struct Products {
  bool on_tiles = false;
  tiles::TileImpl impl = tiles::TileImpl::portable;

  // An input rounded once: `values` floats from `base`, as rows of operand->cols().
  struct Rounded {
    const float* base = nullptr;
    std::size_t values = 0;
    const blas::Bf16Operand* operand = nullptr;
  };
  std::vector<Rounded> rounded;
  std::vector<const tiles::PackedInput*> packed;  // on the tiles: the inputs packed once

  // On the tiles, a tile of the calling thread's own, P (slot 0) or dS (slot 1), rounded once when
  // it is final, for the products that read it next as op(A) (P V, Pᵀ dO; dS K, dSᵀ Q): one
  // rounding for both of dS's products, and the transposes from the rounded values. A product
  // that writes the tile forgets it; so does forget_own, at the start of each thread's tasks.
  template <class T>
  void round_own(int slot, const T* tile, std::size_t rows, std::size_t cols) const {
    if constexpr (std::is_same_v<T, float>) {
      if (on_tiles) own_tiles().at(slot).round(tile, int(rows), int(cols));
    } else {
      (void)slot, (void)tile, (void)rows, (void)cols;
    }
  }
  void forget_own() const {
    for (tiles::RoundedTile& own : own_tiles()) own.forget();
  }

  template <class T>
  void operator()(bool trans_a, bool trans_b, int m, int n, int k, T alpha, const T* a, int lda,
                  const T* b, int ldb, T beta, T* c, int ldc) const {
    if constexpr (std::is_same_v<T, float>) {
      if (on_tiles) {
        tiles::TileView av, bv;
        const tiles::TileView *pa = nullptr, *pb = nullptr;
        for (tiles::RoundedTile& own : own_tiles()) {
          if (!pa && own.view(a, lda, trans_a, m, k, av)) pa = &av;
        }
        for (const tiles::PackedInput* input : packed) {
          if (!pa && !trans_a && input->view(a, lda, true, false, k, av)) pa = &av;
          if (!pb && input->view(b, ldb, false, trans_b, k, bv)) pb = &bv;
        }
        tiles::tile_gemm(impl, trans_a, trans_b, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc, pa,
                         pb);
        for (tiles::RoundedTile& own : own_tiles()) {
          if (own.source() == c) own.forget();  // written: its rounding is stale
        }
        return;
      }
      if (!rounded.empty()) {
        thread_local blas::Bf16Operand own_a, own_b;
        int a_row = 0, b_row = 0;
        const blas::Bf16Operand& ra =
            operand(a, trans_a ? k : m, trans_a ? m : k, lda, own_a, a_row);
        const blas::Bf16Operand& rb =
            operand(b, trans_b ? n : k, trans_b ? k : n, ldb, own_b, b_row);
        blas::gemm_bf16(trans_a, trans_b, m, n, k, alpha, ra, a_row, rb, b_row, beta, c, ldc);
        return;
      }
    }
    blas::gemm<T>(trans_a, trans_b, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
  }

 private:
  static std::array<tiles::RoundedTile, 2>& own_tiles() {
    thread_local std::array<tiles::RoundedTile, 2> tiles;
    return tiles;
  }

  // The rounded input holding x's rows (row set), else x rounded into `own`.
  const blas::Bf16Operand& operand(const float* x, int rows, int cols, int ld,
                                   blas::Bf16Operand& own, int& row) const {
    const auto at = reinterpret_cast<std::uintptr_t>(x);
    for (const Rounded& r : rounded) {
      const auto begin = reinterpret_cast<std::uintptr_t>(r.base);
      if (at < begin || at >= begin + r.values * sizeof(float) || ld != r.operand->cols()) continue;
      const std::size_t offset = (at - begin) / sizeof(float);
      if (offset % static_cast<std::size_t>(ld) != 0) continue;
      row = static_cast<int>(offset / static_cast<std::size_t>(ld));
      return *r.operand;
    }
    own.round(x, rows, cols, ld);
    row = 0;
    return own;
  }
};

template <class T>
Products products_for(const AttentionParams<T>& p) {
  Products products;
  if constexpr (std::is_same_v<T, float>) {
    products.on_tiles = blas::gemm_precision() == GemmPrecision::bf16 && tiles::tiles_in_use() &&
                        !p.has_program() && p.dropout_p == 0;
    if (products.on_tiles) products.impl = tiles::tile_impl();
  }
  return products;
}

// An input of the call (rows x cols, compact) for Products to round once.
template <class T>
struct Input {
  const T* data;
  std::size_t rows, cols;
};

// Rounds the inputs once on bf16 gemms (float, not on the tiles), into the calling thread's
// storage: the calls of one thread do not overlap.
template <class T>
void round_inputs(Products& products, std::initializer_list<Input<T>> inputs) {
  if constexpr (std::is_same_v<T, float>) {
    if (products.on_tiles || blas::gemm_precision() != GemmPrecision::bf16) return;
    thread_local std::array<blas::Bf16Operand, 4> storage;
    std::size_t i = 0;
    for (const Input<T>& input : inputs) {
      blas::Bf16Operand& operand = storage.at(i++);
      operand.round(input.data, static_cast<int>(input.rows), static_cast<int>(input.cols),
                    static_cast<int>(input.cols));
      products.rounded.push_back({input.data, input.rows * input.cols, &operand});
    }
  } else {
    (void)products, (void)inputs;
  }
}

// Packs the inputs once on the tiles (float only), each in the layouts of `layouts` (an or of
// tiles::PackedInput::Layout), into the calling thread's storage: the calls of one thread do not
// overlap. An input is (data, blocks, rows, cols): one block of rows x cols per head.
struct PackedSpec {
  const void* data;
  std::size_t blocks, rows, cols;
  unsigned layouts;
};

template <class T>
void pack_inputs(Products& products, std::initializer_list<PackedSpec> inputs) {
  if constexpr (std::is_same_v<T, float>) {
    if (!products.on_tiles) return;
    thread_local std::array<tiles::PackedInput, 4> storage;
    std::size_t i = 0;
    for (const PackedSpec& input : inputs) {
      tiles::PackedInput& packed = storage.at(i++);
      packed.pack(static_cast<const float*>(input.data), input.blocks, input.rows, input.cols,
                  input.layouts);
      products.packed.push_back(&packed);
    }
  } else {
    (void)products, (void)inputs;
  }
}

// The tiles a call runs on: a block mask's own, else those asked for (0: the tuned default).
template <class T>
void resolve_tiles(const AttentionParams<T>& p, std::size_t& tile_rows, std::size_t& tile_keys) {
  if (p.block_mask != nullptr) {
    tile_rows = p.block_mask->tile_rows();
    tile_keys = p.block_mask->tile_keys();
    return;
  }
  if (tile_rows == 0) tile_rows = kFusedRowBlock;
  if (tile_keys == 0) tile_keys = kFusedKeyBlock;
}

// The key tiles of one row block for head (b, h): with a block mask, its tiles from the block's
// first visible key (empty ones skipped, the state passed on); without, tiles of tile_keys from
// `first` to `keys` (the built-in rule's bounds), partial for a program. visit(j0, bc, state).
template <class T, class Visit>
void for_each_key_tile(const AttentionParams<T>& p, std::size_t b, std::size_t h, std::size_t i0,
                       std::size_t tile_rows, std::size_t tile_keys, std::size_t first,
                       std::size_t keys, Visit&& visit) {
  if (p.block_mask != nullptr) {
    const auto& rb = p.block_mask->row_block(b, h, i0 / tile_rows);
    std::size_t t = 0;
    for (std::size_t j0 = rb.lo; j0 < rb.hi; j0 += tile_keys, ++t) {
      const attention::BlockState state = p.block_mask->state(rb, t);
      if (state != attention::BlockState::empty) visit(j0, std::min(tile_keys, rb.hi - j0), state);
    }
    return;
  }
  for (std::size_t j0 = first; j0 < keys; j0 += tile_keys) {
    visit(j0, std::min(tile_keys, keys - j0), attention::BlockState::partial);
  }
}

}  // namespace

template <class T>
void sdpa_fused_forward(T* out, T* lse, const AttentionParams<T>& p, std::size_t tile_rows,
                        std::size_t tile_keys) {
  const std::size_t H = p.H, Tq = p.Tq, Tk = p.Tk, D = p.D, Dv = p.Dv;
  resolve_tiles(p, tile_rows, tile_keys);
  const bool program = p.has_program();
  Products products = products_for(p);
  round_inputs<T>(
      products, {{p.q, p.B * H * Tq, D}, {p.k, p.B * p.Hkv * Tk, D}, {p.v, p.B * p.Hkv * Tk, Dv}});
  using Layout = tiles::PackedInput::Layout;
  pack_inputs<T>(products, {{p.q, p.B * H, Tq, D, Layout::a},                 // Q_i in Q_i K_jᵀ
                            {p.k, p.B * p.Hkv, Tk, D, Layout::b_transposed},  // K_jᵀ
                            {p.v, p.B * p.Hkv, Tk, Dv, Layout::b_rows}});     // V_j in P V_j
  const Products& gemm = products;
  const int d = static_cast<int>(D), dv = static_cast<int>(Dv);
  // One task per (K/V slice, row block): for each key block, the g = H / Hkv query heads of the
  // group take their turn on it while it is hot in cache, so each K/V tile is read once per group
  // (grouped-query attention), not once per query head. The rule's key bounds depend on the rows
  // only, so the group shares them. A block mask may differ by head: each head then walks its own
  // tiles.
  const std::size_t group = p.group(), row_blocks = (Tq + tile_rows - 1) / tile_rows;
  const auto task_count = static_cast<std::ptrdiff_t>(p.B * p.Hkv * row_blocks);
#pragma omp parallel num_threads(num_threads())
  {
    std::vector<T> sb(std::min(tile_rows, Tq) * std::min(tile_keys, Tk));  // (Br,Bc) S, then P
    std::vector<unsigned char> visible(
        p.score_program != nullptr ? sb.size() : 0);  // (Br,Bc), a score program's visibility
    // (g, Br) running max and sum of each head's rows; whether a key tile of head g ran yet
    std::vector<T> m(group * tile_rows), l(group * tile_rows);
    std::vector<char> begun(group);
    gemm.forget_own();
#pragma omp for schedule(static)
    for (std::ptrdiff_t task = 0; task < task_count; ++task) {
      const std::size_t kv = static_cast<std::size_t>(task) / row_blocks;
      const std::size_t i0 = static_cast<std::size_t>(task) % row_blocks * tile_rows;
      const std::size_t br = std::min(tile_rows, Tq - i0);
      const int rows = static_cast<int>(br);
      const T* kp = p.k + kv * Tk * D;
      const T* vp = p.v + kv * Tk * Dv;
      // Keys before key_begin(first row) and from key_end(last row) on are hidden from the tile.
      const std::size_t first = attention::key_begin(p, i0);
      const std::size_t keys = attention::key_end(p, i0 + br - 1);
      std::fill(m.begin(), m.end(), kHidden<T>);
      std::fill(l.begin(), l.end(), T(0));
      std::fill(begun.begin(), begun.end(), char(0));
      // One key tile [j0, j0 + bc) of query head g of the group.
      const auto key_tile = [&](std::size_t g, std::size_t j0, std::size_t bc,
                                attention::BlockState state) {
        const int cols = static_cast<int>(bc);
        const std::size_t bh = kv * group + g, b = bh / H, h = bh % H;
        const T* qp = p.q + bh * Tq * D;
        T* o_i = out + (bh * Tq + i0) * Dv;
        T* mg = m.data() + g * tile_rows;
        T* lg = l.data() + g * tile_rows;
        // S = s · Q_i K_jᵀ, hidden at -inf           (Br,D) x (D,Bc) -> (Br,Bc)
        gemm(false, true, rows, cols, d, p.scale[h], qp + i0 * D, d, kp + j0 * D, d, T(0),
             sb.data(), cols);
        if (program) {
          (void)program_scores(sb.data(), static_cast<T*>(nullptr), visible.data(), p, b, h, i0, br,
                               j0, bc, state);
        } else {
          score_tile(sb.data(), p, b, h, i0, br, j0, bc);
        }
        for (std::size_t r = 0; r < br; ++r) {
          T* row = sb.data() + r * bc;
          const T m_new = std::max(mg[r], row_max(row, bc));
          if (m_new == kHidden<T>) {  // nothing visible yet: P = 0, O_i row stays 0
            // ... unless the row holds NaN (row_max ignores it): propagate, never hide it.
            const bool has_nan = std::any_of(row, row + bc, [](T x) { return std::isnan(x); });
            std::fill(row, row + bc, has_nan ? std::numeric_limits<T>::quiet_NaN() : T(0));
            if (has_nan) mg[r] = lg[r] = std::numeric_limits<T>::quiet_NaN();
            continue;
          }
          const T sum = exp_shifted_inplace(row, bc, m_new);  // P = exp(S − m'), hidden -> 0
          // Dropout after the sum (l normalises the weights before dropout): P ⊙ M / (1 − p).
          attention::attention_dropout_row(p, bh, i0 + r, j0, bc, row);
          if (begun[g]) {
            const T correction = std::exp(mg[r] - m_new);  // e^(−inf) = 0 for a row unseen so far
            lg[r] *= correction;
            T* o_row = o_i + r * Dv;
            for (std::size_t c = 0; c < Dv; ++c) o_row[c] *= correction;
          }
          lg[r] += sum;
          mg[r] = m_new;
        }
        gemm.round_own(0, sb.data(), br, bc);  // P, final: for P V_j
        // O_i = correction · O_i + P V_j (the first block assigns)  (Br,Bc) x (Bc,Dv) -> (Br,Dv)
        gemm(false, false, rows, dv, cols, T(1), sb.data(), cols, vp + j0 * Dv, dv,
             begun[g] ? T(1) : T(0), o_i, dv);
        begun[g] = 1;
      };
      if (p.block_mask != nullptr) {
        for (std::size_t g = 0; g < group; ++g) {
          const std::size_t bh = kv * group + g;
          for_each_key_tile(p, bh / H, bh % H, i0, tile_rows, tile_keys, first, keys,
                            [&](std::size_t j0, std::size_t bc, attention::BlockState state) {
                              key_tile(g, j0, bc, state);
                            });
        }
      } else {
        for (std::size_t j0 = first; j0 < keys; j0 += tile_keys) {
          for (std::size_t g = 0; g < group; ++g) {
            key_tile(g, j0, std::min(tile_keys, keys - j0), attention::BlockState::partial);
          }
        }
      }
      for (std::size_t g = 0; g < group; ++g) {
        const std::size_t bh = kv * group + g;
        T* o_i = out + (bh * Tq + i0) * Dv;
        T* lsep = lse + bh * Tq;
        const T* mg = m.data() + g * tile_rows;
        const T* lg = l.data() + g * tile_rows;
        if (!begun[g]) std::fill(o_i, o_i + br * Dv, T(0));  // no key block ran
        for (std::size_t r = 0; r < br; ++r) {
          T* o_row = o_i + r * Dv;
          if (lg[r] == T(0)) {  // the row sees no key: O = 0, lse = -inf, never NaN
            std::fill(o_row, o_row + Dv, T(0));
            lsep[i0 + r] = kHidden<T>;
            continue;
          }
          const T inv = T(1) / lg[r];
          for (std::size_t c = 0; c < Dv; ++c) o_row[c] *= inv;
          lsep[i0 + r] = mg[r] + std::log(lg[r]);
        }
      }
    }
  }
}

template <class T>
void sdpa_fused_backward(T* dq, T* dk, T* dv, T* dscale_part, const T* dout, const T* out,
                         const T* lse, const AttentionParams<T>& p, std::size_t tile_rows,
                         std::size_t tile_keys) {
  const std::size_t H = p.H, Tq = p.Tq, Tk = p.Tk, D = p.D, Dv = p.Dv;
  resolve_tiles(p, tile_rows, tile_keys);
  Products products = products_for(p);
  round_inputs<T>(products, {{p.q, p.B * H * Tq, D},
                             {p.k, p.B * p.Hkv * Tk, D},
                             {p.v, p.B * p.Hkv * Tk, Dv},
                             {dout, p.B * H * Tq, Dv}});
  using Layout = tiles::PackedInput::Layout;
  pack_inputs<T>(products,
                 {{p.q, p.B * H, Tq, D, Layout::a | Layout::b_rows},  // Q K_jᵀ, dSᵀ Q
                  {p.k, p.B * p.Hkv, Tk, D, Layout::b_transposed | Layout::b_rows},  // Kᵀ, dS K
                  {p.v, p.B * p.Hkv, Tk, Dv, Layout::b_transposed},                  // dO V_jᵀ
                  {dout, p.B * H, Tq, Dv, Layout::a | Layout::b_rows}});             // dO, Pᵀ dO
  const Products& gemm = products;
  const int d = static_cast<int>(D), dvw = static_cast<int>(Dv);
  // One K/V slice (b, kv head) per task: dK and dV start at 0 and every query head of its group
  // (bh = kv·g + r, r in order) adds into them, so grouped-query attention sums without races. A
  // score program's parameter gradients go to the slice's own row of p.program_grads, in the
  // order of the loops below: the same sums at any thread count.
  const std::size_t group = p.group();
  const auto kv_count = static_cast<std::ptrdiff_t>(p.B * p.Hkv);
  const bool program = p.has_program();
  const bool program_grads = p.score_program != nullptr && p.program_grads != nullptr;
#pragma omp parallel num_threads(num_threads())
  {
    const std::size_t tile = std::min(tile_rows, Tq) * std::min(tile_keys, Tk);
    std::vector<T> sb(tile);   // (Br,Bc) S, then P
    std::vector<T> dpb(tile);  // (Br,Bc) dP, then dS
    // (Br,Bc) P ⊙ M / (1 − p), with dropout only
    const bool dropout = p.dropout_p != 0;
    std::vector<T> pdb(dropout ? tile : 0);
    // (Br,Bc) dS/dU: the softcap's slope 1 − tanh²(U/c) at U = s · Q_i K_jᵀ, or a score program's
    const bool sloped = p.softcap != 0 || p.score_program != nullptr;
    std::vector<T> slb(sloped ? tile : 0);
    std::vector<unsigned char> visible(
        p.score_program != nullptr ? tile : 0);   // (Br,Bc), a score program's visibility
    std::vector<T> ub(program_grads ? tile : 0);  // (Br,Bc) U, for ∂f/∂θ
    std::vector<T> delta(Tq);                     // (Tq,) D_i = rowsum(dO ⊙ O)
    gemm.forget_own();
#pragma omp for schedule(static)
    for (std::ptrdiff_t kv_index = 0; kv_index < kv_count; ++kv_index) {
      const auto kv = static_cast<std::size_t>(kv_index);
      T* dkp = dk + kv * Tk * D;
      T* dvp = dv + kv * Tk * Dv;
      std::fill(dkp, dkp + Tk * D, T(0));
      std::fill(dvp, dvp + Tk * Dv, T(0));
      const std::vector<T*> grads = program_grads ? program_grad_row(p, kv) : std::vector<T*>();
      for (std::size_t bh = kv * group; bh < (kv + 1) * group; ++bh) {
        const std::size_t b = bh / H, h = bh % H;
        const T s = p.scale[h];
        const T* qp = p.q + bh * Tq * D;
        const T* kp = p.k + kv * Tk * D;
        const T* vp = p.v + kv * Tk * Dv;
        const T* op = out + bh * Tq * Dv;
        const T* dop = dout + bh * Tq * Dv;
        const T* lsep = lse + bh * Tq;
        T* dqp = dq + bh * Tq * D;
        std::fill(dqp, dqp + Tq * D, T(0));
        for (std::size_t i = 0; i < Tq; ++i) {
          T acc = 0;
          for (std::size_t c = 0; c < Dv; ++c) acc += dop[i * Dv + c] * op[i * Dv + c];
          delta[i] = acc;
        }
        for (std::size_t i0 = 0; i0 < Tq; i0 += tile_rows) {
          const std::size_t br = std::min(tile_rows, Tq - i0);
          const std::size_t first = attention::key_begin(p, i0);        // earlier keys: hidden
          const std::size_t keys = attention::key_end(p, i0 + br - 1);  // later keys: hidden
          const int rows = static_cast<int>(br);
          const auto key_tile = [&](std::size_t j0, std::size_t bc, attention::BlockState state) {
            const int cols = static_cast<int>(bc);
            // S = s · Q_i K_jᵀ, recomputed               (Br,D) x (D,Bc) -> (Br,Bc)
            gemm(false, true, rows, cols, d, s, qp + i0 * D, d, kp + j0 * D, d, T(0), sb.data(),
                 cols);
            if (program_grads) std::copy_n(sb.data(), br * bc, ub.data());
            if (program) {
              (void)program_scores(sb.data(), sloped ? slb.data() : nullptr, visible.data(), p, b,
                                   h, i0, br, j0, bc, state);
            } else {
              score_tile(sb.data(), p, b, h, i0, br, j0, bc, sloped ? slb.data() : nullptr);
            }
            for (std::size_t r = 0; r < br; ++r) {  // P = exp(S − lse): the forward's weights
              T* row = sb.data() + r * bc;
              const T row_lse = lsep[i0 + r];
              if (row_lse == kHidden<T>) {
                std::fill(row, row + bc, T(0));
              } else {
                exp_shifted_inplace(row, bc, row_lse);
              }
            }
            gemm.round_own(0, sb.data(), br, bc);  // P, final: for Pᵀ dO_i
            // dP = dO_i V_jᵀ                            (Br,Dv) x (Dv,Bc) -> (Br,Bc)
            gemm(false, true, rows, cols, dvw, T(1), dop + i0 * Dv, dvw, vp + j0 * Dv, dvw, T(0),
                 dpb.data(), cols);
            if (dropout) {  // the forward's mask, regenerated once for P and dP
              std::fill_n(pdb.data(), br * bc, T(1));
              for (std::size_t r = 0; r < br; ++r) {
                attention::attention_dropout_row(p, bh, i0 + r, j0, bc, pdb.data() + r * bc);
              }
              for (std::size_t e = 0; e < br * bc; ++e) {
                dpb[e] *= pdb[e];        // dP ⊙ M / (1 − p)
                pdb[e] *= sb.data()[e];  // P ⊙ M / (1 − p)
              }
            }
            // dV_j += Pᵀ dO_i (P ⊙ M/(1−p) w. dropout)   (Bc,Br) x (Br,Dv) -> (Bc,Dv)
            gemm(true, false, cols, dvw, rows, T(1), dropout ? pdb.data() : sb.data(), cols,
                 dop + i0 * Dv, dvw, T(1), dvp + j0 * Dv, dvw);
            // dS = P ⊙ (dP − D_i); P = 0 at hidden positions and in empty rows, hence dS = 0
            for (std::size_t r = 0; r < br; ++r) {
              subtract_times(dpb.data() + r * bc, sb.data() + r * bc, delta[i0 + r], bc);
            }
            if (p.dscores != nullptr) {  // the bias gradient: this tile of dS
              for (std::size_t r = 0; r < br; ++r) {
                std::copy_n(dpb.data() + r * bc, bc, p.dscores + (bh * Tq + i0 + r) * Tk + j0);
              }
            }
            // A score program's parameters: Σ dS · ∂f/∂θ at U
            if (program_grads) {
              program_tile_grads(p, grads, ub.data(), dpb.data(), b, h, i0, br, j0, bc);
            }
            // dU = dS ⊙ dS/dU with a softcap or a score program
            for (std::size_t e = 0; sloped && e < br * bc; ++e) dpb[e] *= slb[e];
            gemm.round_own(1, dpb.data(), br, bc);  // dS, final: for dS K_j and dSᵀ Q_i
            // dQ_i += s · dS K_j                        (Br,Bc) x (Bc,D) -> (Br,D)
            gemm(false, false, rows, d, cols, s, dpb.data(), cols, kp + j0 * D, d, T(1),
                 dqp + i0 * D, d);
            // dK_j += s · dSᵀ Q_i                       (Bc,Br) x (Br,D) -> (Bc,D)
            gemm(true, false, cols, d, rows, s, dpb.data(), cols, qp + i0 * D, d, T(1),
                 dkp + j0 * D, d);
          };
          for_each_key_tile(p, b, h, i0, tile_rows, tile_keys, first, keys, key_tile);
        }
        // dL/ds = Σ dS ⊙ (Q Kᵀ) = ⟨dS K, Q⟩ = ⟨dQ, Q⟩ / s
        T acc = 0;
        for (std::size_t i = 0; i < Tq * D; ++i) acc += dqp[i] * qp[i];
        dscale_part[bh] = acc / s;
      }
    }
  }
}

#define ATTNLAB_INSTANTIATE_SDPA_FUSED(T)                                             \
  template void sdpa_fused_forward<T>(T*, T*, const AttentionParams<T>&, std::size_t, \
                                      std::size_t);                                   \
  template void sdpa_fused_backward<T>(T*, T*, T*, T*, const T*, const T*, const T*,  \
                                       const AttentionParams<T>&, std::size_t, std::size_t);
ATTNLAB_INSTANTIATE_SDPA_FUSED(float)
ATTNLAB_INSTANTIATE_SDPA_FUSED(double)
#undef ATTNLAB_INSTANTIATE_SDPA_FUSED

}  // namespace attnlab::detail
