// bf16 tiles: the products of the fused CPU attention (ops/attention_fused.cpp) under a bf16
// GemmPrecisionScope, in the shapes of Intel's AMX tiles, with two implementations of one tile
// algorithm: AMX (TDPBF16PS on tile registers, bf16_tiles.cpp, functions compiled for amx-tile and
// amx-bf16 alone so that the library keeps its -march and runs everywhere) and portable C++ (below,
// the same tiles in memory). The attention's own products, not a GEMM library's: operands are
// rounded to bf16 (blas_private.hpp's bf16_high_bits, ties to even) into padded tile layouts, the
// products summed in fp32.
//
// Tiles (AMX palette 1, 64 bytes a row):
//   C  16 x 16 fp32;
//   A  16 rows x 32 bf16: A(m, k) at row m, element k;
//   B  16 rows x 32 bf16 in AMX's VNNI pair layout: B(k, n) at row k / 2, element 2n + k % 2.
// dpbf16ps: C(m, n) += Σ_k A(m, k) · B(k, n), k < 32, in fp32.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <vector>

namespace attnlab::detail::tiles {

inline constexpr int kRows = 16;   // rows of every tile
inline constexpr int kDepth = 32;  // bf16 values in a row of A: the k of one dpbf16ps
inline constexpr int kCols = 16;   // fp32 values in a row of C: the n of one dpbf16ps

struct alignas(64) TileC {
  float v[kRows * kCols];
};
struct alignas(64) TileA {
  std::uint16_t v[kRows * kDepth];
};
struct alignas(64) TileB {  // kDepth / 2 pair rows of 2 · kCols bf16
  std::uint16_t v[kDepth / 2 * 2 * kCols];
};

// Where B(k, n) lies in a VNNI-packed B of row stride `stride` (bf16 values).
inline constexpr std::size_t vnni_index(std::size_t k, std::size_t n, std::size_t stride) {
  return k / 2 * stride + 2 * n + k % 2;
}

inline float bf16_to_float(std::uint16_t bits) {
  const std::uint32_t u = static_cast<std::uint32_t>(bits) << 16;
  float x;
  std::memcpy(&x, &u, sizeof x);
  return x;
}

// ---- the portable tiles: the AMX instructions' arithmetic in plain C++ ----------------------
// Strides count elements (AMX's tileloadd counts bytes).

inline void zero(TileC& c) {
  for (float& x : c.v) x = 0;
}

inline void load(TileC& c, const float* src, std::size_t stride) {
  for (int r = 0; r < kRows; ++r)
    std::memcpy(c.v + r * kCols, src + r * stride, sizeof(float) * kCols);
}

inline void store(const TileC& c, float* dst, std::size_t stride) {
  for (int r = 0; r < kRows; ++r)
    std::memcpy(dst + r * stride, c.v + r * kCols, sizeof(float) * kCols);
}

inline void load(TileA& a, const std::uint16_t* src, std::size_t stride) {
  for (int r = 0; r < kRows; ++r) std::memcpy(a.v + r * kDepth, src + r * stride, 2 * kDepth);
}

inline void load(TileB& b, const std::uint16_t* src, std::size_t stride) {
  for (int r = 0; r < kDepth / 2; ++r)
    std::memcpy(b.v + r * 2 * kCols, src + r * stride, 4 * kCols);
}

// C += A · B. Summation order: for each C(m, n), the 16 pairs k = 2t, 2t + 1 in order of t; a
// pair's two products are exact in fp32 (8 + 8 significant bits), their sum is rounded once to
// fp32 and added to C, rounded again. AMX's TDPBF16PS sums in an order of its own and flushes
// subnormal inputs and outputs to zero, so the two may differ in the last bits; both are
// deterministic.
inline void dpbf16ps(TileC& c, const TileA& a, const TileB& b) {
  float even[kDepth / 2][kCols], odd[kDepth / 2][kCols];  // B(2t, n), B(2t + 1, n) as floats
  for (int t = 0; t < kDepth / 2; ++t) {
    for (int n = 0; n < kCols; ++n) {
      even[t][n] = bf16_to_float(b.v[t * 2 * kCols + 2 * n]);
      odd[t][n] = bf16_to_float(b.v[t * 2 * kCols + 2 * n + 1]);
    }
  }
  for (int m = 0; m < kRows; ++m) {
    float row[kCols];
    std::memcpy(row, c.v + m * kCols, sizeof row);
    for (int t = 0; t < kDepth / 2; ++t) {
      const float a0 = bf16_to_float(a.v[m * kDepth + 2 * t]);
      const float a1 = bf16_to_float(a.v[m * kDepth + 2 * t + 1]);
      for (int n = 0; n < kCols; ++n) row[n] += a0 * even[t][n] + a1 * odd[t][n];
    }
    std::memcpy(c.v + m * kCols, row, sizeof row);
  }
}

// ---- the implementations and their choice ----------------------------------------------------

enum class TileImpl { amx, portable };

const char* to_string(TileImpl impl);

// How the fused attention runs its products under a bf16 scope. automatic: through blas::gemm's
// bf16 gemm (oneDNN's bf16 matmul or its emulation), which the AMX tiles only match, so the
// default keeps its bits (tests/bench/README.md, "bf16 tiles of the fused attention on a CPU with
// AMX"); amx: the AMX tiles (where amx_support().usable; elsewhere asking for it throws
// std::runtime_error with amx_support()'s reason, from set_tile_choice or the first read of the
// variable); portable: the portable tiles (tests, comparisons, the algorithm on any machine); off:
// blas::gemm, as automatic.
enum class TileChoice { automatic, portable, off, amx };

// The choice in force: set_tile_choice's, else ATTNLAB_BF16_TILES=auto|amx|portable|off (read once;
// another value throws std::invalid_argument naming the variable, the values and the value given).
TileChoice tile_choice();
// Process-wide, like the precision; for tests and benchmarks. automatic returns to the default
// (which still honours ATTNLAB_BF16_TILES).
void set_tile_choice(TileChoice choice);

// The implementation the tiles run: AMX when the choice is amx, else the portable tiles.
TileImpl tile_impl();

// Whether the fused attention's products go on tiles under a bf16 scope: the choice amx or
// portable.
bool tiles_in_use();

// bf16 values already in a tile layout, `ld` bf16 values apart: op(A)'s rows (row r at data + r·ld,
// the depth zero-padded to a multiple of 32), or op(B)'s VNNI pair rows (pair row t at data +
// t·ld).
struct TileView {
  const std::uint16_t* data = nullptr;
  std::size_t ld = 0;
};

// The tile algorithm on packed operands: C (mt·16 x nt·16 fp32, row-major) = [C +] A · B, with A
// (mt·16 x kt·32 bf16, row-major) and B (kt·32 x nt·16, VNNI: kt·16 rows of nt·32 bf16), in tiles
// of 16 x 16 per C tile, kt dpbf16ps each, in order. AMX throws std::runtime_error with
// amx_support()'s reason where it is not usable.
void tile_product(TileImpl impl, const std::uint16_t* a, const std::uint16_t* b, float* c, int mt,
                  int nt, int kt, bool accumulate);
// The same on views, C's rows ldc floats apart. AMX keeps up to 2 x 2 C tiles in its registers
// (each A and B tile loaded once for them); each C element still takes its kt dpbf16ps in order.
void tile_product(TileImpl impl, TileView a, TileView b, float* c, std::size_t ldc, int mt, int nt,
                  int kt, bool accumulate);

// An input of the fused attention (`blocks` blocks, one per head, of rows x cols floats, compact)
// rounded to bf16 once per call into the tile layouts its products read it in, so that a tile
// product packs only the operands of its own (P, dS). The layouts:
// - a: op(A) = X's rows (Q in Q Kᵀ, dO in dO Vᵀ);
// - b_transposed: op(B) = Xᵀ, depth cols, VNNI (K in Q Kᵀ, V in dO Vᵀ);
// - b_rows: op(B) = rows of X as the depth, VNNI (V in P V, K in dS K, Q in dSᵀ Q, dO in Pᵀ dO).
// Each block is zero-padded to whole tiles, so a view reads the zeros the packing of tile_gemm
// would put there, and the product has tile_gemm's bits.
class PackedInput {
 public:
  enum Layout : unsigned { a = 1, b_transposed = 2, b_rows = 4 };
  // Rounds x in `layouts` (an or of Layout); the storage is kept for the next call.
  void pack(const float* x, std::size_t blocks, std::size_t rows, std::size_t cols,
            unsigned layouts);
  // op(X) at `at` (a row of x, row stride ld) as a tile operand of depth `depth` and width n:
  // as_a: op(A) = those rows, depth cols; else op(B): with trans, their transpose (depth cols);
  // without, `depth` rows from `at` as the depth, n = cols. False where x does not hold it in that
  // layout, or where the view's padding would read values outside the product (then tile_gemm
  // packs the operand itself).
  bool view(const float* at, int ld, bool as_a, bool trans, int depth, TileView& out) const;

 private:
  const float* base_ = nullptr;
  std::size_t blocks_ = 0, rows_ = 0, cols_ = 0, depth_ = 0, units_ = 0, pair_rows_ = 0;
  unsigned layouts_ = 0;
  std::vector<std::uint16_t> a_, b_transposed_, b_rows_;
};

// A tile of the caller's own (P or dS of the fused attention: rows x cols floats, compact), rounded
// to bf16 once into the op(A) layout, for the products that read it as op(A) = the tile or its
// transpose (transposed once, from the rounded values, when first asked for). The caller rounds it
// again whenever it changes, and forgets it when a product writes it (ops/attention_fused.cpp's
// Products does both).
class RoundedTile {
 public:
  void round(const float* x, int rows, int cols);
  void forget() { src_ = nullptr; }
  const float* source() const { return src_; }
  // op(A) at `at` (row stride ld, m x k): the tile itself (trans false: m = rows, k = cols) or its
  // transpose (m = cols, k = rows). False for anything else.
  bool view(const float* at, int ld, bool trans, int m, int k, TileView& out);

 private:
  const float* src_ = nullptr;
  std::size_t rows_ = 0, cols_ = 0, depth_ = 0, t_depth_ = 0;
  bool transposed_ = false;
  std::vector<std::uint16_t> rows_bf16_, transposed_bf16_;
};

// blas::gemm's contract (row-major, op(X) = X or Xᵀ, beta 0 assigns) on the tiles of `impl`: op(A)
// and op(B) rounded to bf16 into zero-padded tiles (the calling thread's scratch), C = alpha ·
// (A · B in fp32) + beta · C. Serial: the attention calls it from its own parallel loops. m, n,
// k < 0 throw std::invalid_argument.
// With a_view or b_view, that operand is read from the view (PackedInput::view, RoundedTile::view)
// instead of being packed from a or b, with the same bits.
void tile_gemm(TileImpl impl, bool trans_a, bool trans_b, int m, int n, int k, float alpha,
               const float* a, int lda, const float* b, int ldb, float beta, float* c, int ldc,
               const TileView* a_view = nullptr, const TileView* b_view = nullptr);

}  // namespace attnlab::detail::tiles
