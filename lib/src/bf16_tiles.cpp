// bf16 tiles (kernels/bf16_tiles.hpp): the AMX implementation, the choice between it and the
// portable one, and the packing of float operands into bf16 tiles: per product (tile_gemm), an
// input once per call (PackedInput), a tile of the caller's own once (RoundedTile).
#include "kernels/bf16_tiles.hpp"

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cstdlib>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

#include "amx_tile_config.hpp"
#include "attnlab/fma_peak.hpp"
#include "attnlab/threads.hpp"
#include "blas_private.hpp"

#if defined(__x86_64__) && defined(__linux__)
#include <immintrin.h>
#define ATTNLAB_TILES_AMX 1
#endif

namespace attnlab {

void check_arg(bool ok, std::string_view op, std::string_view name, std::string_view what,
               std::string_view got);

namespace detail::tiles {

namespace {

// set_tile_choice's choice, or -1: none (ATTNLAB_BF16_TILES decides).
std::atomic<int> forced_choice{-1};

TileChoice env_choice() {
  static const TileChoice choice = [] {
    const char* env = std::getenv("ATTNLAB_BF16_TILES");
    const std::string value = env != nullptr ? env : "";
    if (value.empty() || value == "auto") return TileChoice::automatic;
    if (value == "portable") return TileChoice::portable;
    if (value == "off") return TileChoice::off;
    if (value == "amx") {
      const AmxSupport& amx = amx_support();
      if (!amx.usable)
        throw std::runtime_error("ATTNLAB_BF16_TILES: amx asked for, but " + amx.reason);
      return TileChoice::amx;
    }
    check_arg(false, "ATTNLAB_BF16_TILES", "value", "auto, amx, portable or off",
              "'" + value + "'");
    return TileChoice::automatic;
  }();
  return choice;
}

// Where a product's C tiles go. Raw (finish false): C itself, tiles of 16 x 16 at c (row stride
// ldc), loaded first when accumulating. Finished: each tile, once its sums are done, as alpha · acc
// + beta · C into the rows and columns of C inside m x n (beta 0 assigns), while it is in cache.
struct Sink {
  float* c;
  std::size_t ldc;
  bool finish = false, accumulate = false;
  int m = 0, n = 0;
  float alpha = 1, beta = 0;
};

// Sink::finish for the C tile whose first element is (row0, col0), its sums in acc (16 x 16).
void finish_tile(const float* __restrict acc, const Sink& s, int row0, int col0) {
  const int rows = std::min(kRows, s.m - row0), cols = std::min(kCols, s.n - col0);
  const float alpha = s.alpha, beta = s.beta;  // locals: C may not alias them
  for (int r = 0; r < rows; ++r) {
    const float* __restrict a = acc + r * kCols;
    float* __restrict out = s.c + static_cast<std::size_t>(row0 + r) * s.ldc + col0;
    if (cols == kCols) {  // a whole row of the tile: the same arithmetic on a fixed width
      if (beta == 0) {
#pragma omp simd
        for (int q = 0; q < kCols; ++q) out[q] = alpha * a[q];
      } else {
#pragma omp simd
        for (int q = 0; q < kCols; ++q) out[q] = alpha * a[q] + beta * out[q];
      }
    } else if (beta == 0) {
      for (int q = 0; q < cols; ++q) out[q] = alpha * a[q];
    } else {
      for (int q = 0; q < cols; ++q) out[q] = alpha * a[q] + beta * out[q];
    }
  }
}

// The portable tile algorithm, the AMX one's loops on tiles in memory.
void portable_product(TileView a, TileView b, const Sink& sink, int mt, int nt, int kt) {
  TileC tc;
  TileA ta;
  TileB tb;
  for (int i = 0; i < mt; ++i) {
    for (int j = 0; j < nt; ++j) {
      float* ct = sink.c + i * kRows * sink.ldc + j * kCols;
      if (sink.accumulate && !sink.finish) {
        load(tc, ct, sink.ldc);
      } else {
        zero(tc);
      }
      for (int t = 0; t < kt; ++t) {
        load(ta, a.data + i * kRows * a.ld + t * kDepth, a.ld);
        load(tb, b.data + t * (kDepth / 2) * b.ld + j * 2 * kCols, b.ld);
        dpbf16ps(tc, ta, tb);
      }
      if (sink.finish) {
        finish_tile(tc.v, sink, i * kRows, j * kCols);
      } else {
        store(tc, ct, sink.ldc);
      }
    }
  }
}

#ifdef ATTNLAB_TILES_AMX
// The portable loops on tile registers (strides in bytes), on a block of MI x NJ C tiles (at most
// 2 x 2) from C tile (i, j) at once: C tiles 0-3 (tile 2·mi + nj), A tiles 4-5, B tiles 6-7.
// Palette 1, 16 rows of 64 bytes each. Each C tile still takes its kt dpbf16ps in order.
template <int MI, int NJ>
__attribute__((target("amx-tile,amx-bf16"))) inline void amx_block(TileView a, TileView b,
                                                                   const Sink& sink, int i, int j,
                                                                   int kt) {
  alignas(64) float done[4][kRows * kCols];  // finished sinks: the sums, tile by tile
  const bool raw = !sink.finish;
  const auto c_at = [&](int ti, int tj) -> float* {
    return raw ? sink.c + (i + ti) * kRows * sink.ldc + (j + tj) * kCols : done[2 * ti + tj];
  };
  const std::size_t c_stride = (raw ? sink.ldc : kCols) * sizeof(float);
  const std::size_t a_stride = a.ld * 2, b_stride = b.ld * 2;
  if (raw && sink.accumulate) {
    _tile_loadd(0, c_at(0, 0), c_stride);
    if (NJ > 1) _tile_loadd(1, c_at(0, 1), c_stride);
    if (MI > 1) _tile_loadd(2, c_at(1, 0), c_stride);
    if (MI > 1 && NJ > 1) _tile_loadd(3, c_at(1, 1), c_stride);
  } else {
    _tile_zero(0);
    if (NJ > 1) _tile_zero(1);
    if (MI > 1) _tile_zero(2);
    if (MI > 1 && NJ > 1) _tile_zero(3);
  }
  const std::uint16_t* ai = a.data + i * kRows * a.ld;
  const std::uint16_t* bj = b.data + j * 2 * kCols;
  for (int t = 0; t < kt; ++t) {
    const std::uint16_t* at = ai + t * kDepth;
    const std::uint16_t* bt = bj + t * (kDepth / 2) * b.ld;
    _tile_loadd(4, at, a_stride);
    _tile_loadd(6, bt, b_stride);
    if (MI > 1) _tile_loadd(5, at + kRows * a.ld, a_stride);
    if (NJ > 1) _tile_loadd(7, bt + 2 * kCols, b_stride);
    _tile_dpbf16ps(0, 4, 6);
    if (NJ > 1) _tile_dpbf16ps(1, 4, 7);
    if (MI > 1) _tile_dpbf16ps(2, 5, 6);
    if (MI > 1 && NJ > 1) _tile_dpbf16ps(3, 5, 7);
  }
  _tile_stored(0, c_at(0, 0), c_stride);
  if (NJ > 1) _tile_stored(1, c_at(0, 1), c_stride);
  if (MI > 1) _tile_stored(2, c_at(1, 0), c_stride);
  if (MI > 1 && NJ > 1) _tile_stored(3, c_at(1, 1), c_stride);
  if (raw) return;
  for (int ti = 0; ti < MI; ++ti)
    for (int tj = 0; tj < NJ; ++tj)
      finish_tile(done[2 * ti + tj], sink, (i + ti) * kRows, (j + tj) * kCols);
}

__attribute__((target("amx-tile,amx-bf16"))) void amx_product(TileView a, TileView b,
                                                              const Sink& sink, int mt, int nt,
                                                              int kt) {
  AmxTileConfig config;
  for (int t = 0; t < 8; ++t) config.colsb[t] = 64, config.rows[t] = kRows;
  _tile_loadconfig(&config);
  for (int i = 0; i < mt; i += 2) {
    for (int j = 0; j < nt; j += 2) {
      const bool two_rows = i + 1 < mt, two_cols = j + 1 < nt;
      if (two_rows && two_cols) {
        amx_block<2, 2>(a, b, sink, i, j, kt);
      } else if (two_rows) {
        amx_block<2, 1>(a, b, sink, i, j, kt);
      } else if (two_cols) {
        amx_block<1, 2>(a, b, sink, i, j, kt);
      } else {
        amx_block<1, 1>(a, b, sink, i, j, kt);
      }
    }
  }
  _tile_release();
}
#endif

// The product on `impl` into `sink`.
void run_product(TileImpl impl, TileView a, TileView b, const Sink& sink, int mt, int nt, int kt) {
  if (impl == TileImpl::portable) {
    portable_product(a, b, sink, mt, nt, kt);
    return;
  }
  const AmxSupport& amx = amx_support();
  if (!amx.usable) throw std::runtime_error("tile_product: " + amx.reason);
#ifdef ATTNLAB_TILES_AMX
  amx_product(a, b, sink, mt, nt, kt);
#endif
}

}  // namespace

const char* to_string(TileImpl impl) {
  return impl == TileImpl::amx ? "amx" : "portable";
}

TileChoice tile_choice() {
  const int forced = forced_choice.load(std::memory_order_relaxed);
  if (forced >= 0 && static_cast<TileChoice>(forced) != TileChoice::automatic) {
    return static_cast<TileChoice>(forced);
  }
  return env_choice();
}

void set_tile_choice(TileChoice choice) {
  if (choice == TileChoice::amx && !amx_support().usable)
    throw std::runtime_error("set_tile_choice: amx asked for, but " + amx_support().reason);
  forced_choice.store(static_cast<int>(choice), std::memory_order_relaxed);
}

TileImpl tile_impl() {
  return tile_choice() == TileChoice::amx ? TileImpl::amx : TileImpl::portable;
}

bool tiles_in_use() {
  const TileChoice choice = tile_choice();
  return choice == TileChoice::portable || choice == TileChoice::amx;
}

void tile_product(TileImpl impl, TileView a, TileView b, float* c, std::size_t ldc, int mt, int nt,
                  int kt, bool accumulate) {
  Sink sink{c, ldc};
  sink.accumulate = accumulate;
  run_product(impl, a, b, sink, mt, nt, kt);
}

void tile_product(TileImpl impl, const std::uint16_t* a, const std::uint16_t* b, float* c, int mt,
                  int nt, int kt, bool accumulate) {
  tile_product(impl, TileView{a, static_cast<std::size_t>(kt) * kDepth},
               TileView{b, static_cast<std::size_t>(nt) * 2 * kCols}, c,
               static_cast<std::size_t>(nt) * kCols, mt, nt, kt, accumulate);
}

namespace {

// x's rows [r0, r1) (cols values each, row stride ld) rounded into rows of a tile layout, `stride`
// bf16 values apart, from column 0; the rest of each row, to `width`, is zero.
void round_rows(const float* x, std::size_t ld, std::size_t r0, std::size_t r1, std::size_t cols,
                std::uint16_t* dst, std::size_t stride, std::size_t width) {
  for (std::size_t r = r0; r < r1; ++r) {
    std::uint16_t* out = dst + (r - r0) * stride;
    blas::detail::round_row_bf16(x + r * ld, static_cast<int>(cols), out);
    std::fill(out + cols, out + width, std::uint16_t{0});
  }
}

// op(B) = Xᵀ for x (n rows of k values, row stride ld) into VNNI pair rows of `units` 32-bit units,
// `units` apart: pair row t holds (x[q][2t], x[q][2t + 1]) at unit q, zero past k. The pair rows
// [0, ceil(k / 2)) are written, the units [0, n) of each; `row` is scratch of at least k + 1.
void pack_transposed(const float* x, std::size_t ld, std::size_t n, std::size_t k,
                     std::uint16_t* dst, std::size_t units, std::uint16_t* row) {
  row[k] = 0;  // an odd k's last pair has no second value
  for (std::size_t q = 0; q < n; ++q) {
    blas::detail::round_row_bf16(x + q * ld, static_cast<int>(k), row);
    for (std::size_t t = 0; 2 * t < k; ++t) {
      std::uint16_t* unit = dst + 2 * (t * units + q);
      unit[0] = row[2 * t];
      unit[1] = row[2 * t + 1];
    }
  }
}

// op(B) = X for x (k rows of n values, row stride ld): rows 2t and 2t + 1 interleaved into pair row
// t (2 · units bf16 apart); columns past n and an odd k's last second row stay as they are.
void pack_rows(const float* x, std::size_t ld, std::size_t k, std::size_t n, std::uint16_t* dst,
               std::size_t units, std::uint16_t* row) {
  for (std::size_t p = 0; p < k; ++p) {
    blas::detail::round_row_bf16(x + p * ld, static_cast<int>(n), row);
    std::uint16_t* out = dst + p / 2 * 2 * units + p % 2;
    for (std::size_t q = 0; q < n; ++q) out[2 * q] = row[q];
  }
}

// dst (cols x rows, row stride ld) = srcᵀ for src (rows x cols of 16-bit values, row stride
// cols unless given): 8 x 8 blocks through SSE2's unpacks, the edges one value at a time.
void transpose16(const std::uint16_t* src, std::size_t rows, std::size_t cols, std::uint16_t* dst,
                 std::size_t ld, std::size_t src_ld = 0) {
  const std::size_t sld = src_ld != 0 ? src_ld : cols;
  std::size_t r = 0;
#ifdef ATTNLAB_TILES_AMX
  for (; r + 8 <= rows; r += 8) {
    std::size_t c = 0;
    for (; c + 8 <= cols; c += 8) {
      const auto load = [&](std::size_t i) {
        return _mm_loadu_si128(reinterpret_cast<const __m128i*>(src + (r + i) * sld + c));
      };
      // pairs of rows, then quads, then all eight: column c + i is the i-th store
      __m128i x0 = load(0), x1 = load(1);
      const __m128i t0 = _mm_unpacklo_epi16(x0, x1), t1 = _mm_unpackhi_epi16(x0, x1);
      x0 = load(2), x1 = load(3);
      const __m128i t2 = _mm_unpacklo_epi16(x0, x1), t3 = _mm_unpackhi_epi16(x0, x1);
      x0 = load(4), x1 = load(5);
      const __m128i t4 = _mm_unpacklo_epi16(x0, x1), t5 = _mm_unpackhi_epi16(x0, x1);
      x0 = load(6), x1 = load(7);
      const __m128i t6 = _mm_unpacklo_epi16(x0, x1), t7 = _mm_unpackhi_epi16(x0, x1);
      const __m128i u0 = _mm_unpacklo_epi32(t0, t2), u1 = _mm_unpackhi_epi32(t0, t2);
      const __m128i u2 = _mm_unpacklo_epi32(t1, t3), u3 = _mm_unpackhi_epi32(t1, t3);
      const __m128i u4 = _mm_unpacklo_epi32(t4, t6), u5 = _mm_unpackhi_epi32(t4, t6);
      const __m128i u6 = _mm_unpacklo_epi32(t5, t7), u7 = _mm_unpackhi_epi32(t5, t7);
      const auto store = [&](std::size_t i, __m128i y) {
        _mm_storeu_si128(reinterpret_cast<__m128i*>(dst + (c + i) * ld + r), y);
      };
      store(0, _mm_unpacklo_epi64(u0, u4));
      store(1, _mm_unpackhi_epi64(u0, u4));
      store(2, _mm_unpacklo_epi64(u1, u5));
      store(3, _mm_unpackhi_epi64(u1, u5));
      store(4, _mm_unpacklo_epi64(u2, u6));
      store(5, _mm_unpackhi_epi64(u2, u6));
      store(6, _mm_unpacklo_epi64(u3, u7));
      store(7, _mm_unpackhi_epi64(u3, u7));
    }
    for (; c < cols; ++c)
      for (std::size_t i = r; i < r + 8; ++i) dst[c * ld + i] = src[i * sld + c];
  }
#endif
  for (; r < rows; ++r)
    for (std::size_t c = 0; c < cols; ++c) dst[c * ld + r] = src[r * sld + c];
}

// op(A) = Xᵀ from X's rows already rounded (rows x cols bf16, row stride src_ld): cols rows of
// `depth` values in dst, each zero past `rows`.
void transpose_rounded(const std::uint16_t* src, std::size_t rows, std::size_t cols,
                       std::size_t src_ld, std::uint16_t* dst, std::size_t depth) {
  transpose16(src, rows, cols, dst, depth, src_ld);
  for (std::size_t r = 0; r < cols; ++r)
    std::fill(dst + r * depth + rows, dst + (r + 1) * depth, std::uint16_t{0});
}

std::size_t round_up(std::size_t x, std::size_t to) {
  return (x + to - 1) / to * to;
}

}  // namespace

void PackedInput::pack(const float* x, std::size_t blocks, std::size_t rows, std::size_t cols,
                       unsigned layouts) {
  base_ = x;
  blocks_ = blocks, rows_ = rows, cols_ = cols, layouts_ = layouts;
  depth_ = round_up(cols, kDepth);  // a's row, b_transposed's depth
  // b_transposed: units a pair row in a block, an odd number of cache lines, so that the 16 pair
  // rows of a tile fall in 16 different sets of the L1 cache (a row of 4 KB put all 16 in one)
  units_ = round_up(rows, kCols);
  if (units_ / kCols % 2 == 0) units_ += kCols;
  pair_rows_ = round_up(rows, kDepth) / 2;          // b_rows: pair rows in a block
  const std::size_t t_block = depth_ / 2 * units_;  // b_transposed, 32-bit units
  const std::size_t r_block = pair_rows_ * 2 * round_up(cols, kCols);  // b_rows, bf16 values
  // Slack past the last block, zero: a view's tile may read up to a tile past its own rows or units
  // (into C rows or columns that are dropped), never past the storage. Each block zeroes its own
  // padding below, on its thread.
  const auto sized = [](std::vector<std::uint16_t>& v, std::size_t blocks_end, std::size_t slack) {
    v.resize(blocks_end + slack);
    std::fill(v.begin() + static_cast<std::ptrdiff_t>(blocks_end), v.end(), std::uint16_t{0});
  };
  if (layouts & a) sized(a_, blocks * rows * depth_, kRows * depth_);
  if (layouts & b_transposed) sized(b_transposed_, 2 * blocks * t_block, 2 * kCols);
  if (layouts & b_rows) sized(b_rows_, blocks * r_block, 0);
  // The blocks over the threads where no parallel region is running (the attention's batch threads
  // call this on their own thread).
  const int threads = num_threads();
  const bool split = threads > 1 && !omp_in_parallel() && blocks > 1;
#pragma omp parallel num_threads(threads) if (split)
  {
    std::vector<std::uint16_t> row(std::max(rows, cols) + 1);
#pragma omp for schedule(static)
    for (std::ptrdiff_t bi = 0; bi < static_cast<std::ptrdiff_t>(blocks); ++bi) {
      const auto b = static_cast<std::size_t>(bi);
      const float* xb = x + b * rows * cols;
      if (layouts & a)
        round_rows(xb, cols, 0, rows, cols, a_.data() + b * rows * depth_, depth_, depth_);
      if (layouts & b_transposed) {  // the padding: units past rows, pair rows past cols / 2
        std::uint16_t* block = b_transposed_.data() + 2 * b * t_block;
        std::fill(block, block + 2 * t_block, std::uint16_t{0});
        pack_transposed(xb, cols, rows, cols, block, units_, row.data());
      }
      if (layouts & b_rows) {  // the padding: columns past cols, pair rows past rows / 2
        std::uint16_t* block = b_rows_.data() + b * r_block;
        std::fill(block, block + r_block, std::uint16_t{0});
        pack_rows(xb, cols, rows, cols, block, round_up(cols, kCols), row.data());
      }
    }
  }
}

bool PackedInput::view(const float* at, int ld, bool as_a, bool trans, int depth,
                       TileView& out) const {
  const auto begin = reinterpret_cast<std::uintptr_t>(base_);
  const auto here = reinterpret_cast<std::uintptr_t>(at);
  if (base_ == nullptr || cols_ == 0 || here < begin || static_cast<std::size_t>(ld) != cols_ ||
      depth < 0)
    return false;
  const std::size_t offset = (here - begin) / sizeof(float);
  if ((here - begin) % sizeof(float) != 0 || offset % cols_ != 0 ||
      offset / cols_ >= blocks_ * rows_)
    return false;
  const std::size_t g = offset / cols_, b = g / rows_, r = g % rows_;
  const auto k = static_cast<std::size_t>(depth);
  if (as_a) {  // op(A): the rows from g, depth cols
    if (!(layouts_ & a) || k != cols_) return false;
    out = {a_.data() + g * depth_, depth_};
    return true;
  }
  if (trans) {  // op(B) = Xᵀ: unit r of the block's pair rows, depth cols
    if (!(layouts_ & b_transposed) || k != cols_) return false;
    out = {b_transposed_.data() + 2 * (b * (depth_ / 2) * units_ + r), 2 * units_};
    return true;
  }
  // op(B) = rows [r, r + k) as the depth: from a pair boundary, and the depth's padding to whole
  // tiles must be the block's zeros (the product's own rows otherwise: a k that fills its tiles).
  if (!(layouts_ & b_rows) || r % 2 != 0 || r + k > rows_) return false;
  if (k % kDepth != 0 && !(r + k == rows_ && r % kDepth == 0)) return false;
  const std::size_t units = round_up(cols_, kCols);
  out = {b_rows_.data() + (b * pair_rows_ + r / 2) * 2 * units, 2 * units};
  return true;
}

void RoundedTile::round(const float* x, int rows, int cols) {
  src_ = x;
  rows_ = static_cast<std::size_t>(rows), cols_ = static_cast<std::size_t>(cols);
  depth_ = round_up(cols_, kDepth);
  transposed_ = false;
  // Slack rows past the tile: a product's last A tile may read up to 15 of them (dropped C rows).
  rows_bf16_.resize((round_up(rows_, kRows) + kRows) * depth_);
  round_rows(x, cols_, 0, rows_, cols_, rows_bf16_.data(), depth_, depth_);
  std::fill(rows_bf16_.begin() + static_cast<std::ptrdiff_t>(rows_ * depth_), rows_bf16_.end(),
            std::uint16_t{0});
}

bool RoundedTile::view(const float* at, int ld, bool trans, int m, int k, TileView& out) {
  if (src_ == nullptr || at != src_ || static_cast<std::size_t>(ld) != cols_ || m < 0 || k < 0)
    return false;
  const auto mu = static_cast<std::size_t>(m), ku = static_cast<std::size_t>(k);
  if (!trans) {
    if (mu != rows_ || ku != cols_) return false;
    out = {rows_bf16_.data(), depth_};
    return true;
  }
  if (mu != cols_ || ku != rows_) return false;
  if (!transposed_) {  // from the rounded rows: the values the transposed packing would round
    t_depth_ = round_up(rows_, kDepth);
    transposed_bf16_.resize((round_up(cols_, kRows) + kRows) * t_depth_);
    transpose_rounded(rows_bf16_.data(), rows_, cols_, depth_, transposed_bf16_.data(), t_depth_);
    std::fill(transposed_bf16_.begin() + static_cast<std::ptrdiff_t>(cols_ * t_depth_),
              transposed_bf16_.end(), std::uint16_t{0});
    transposed_ = true;
  }
  out = {transposed_bf16_.data(), t_depth_};
  return true;
}

void tile_gemm(TileImpl impl, bool trans_a, bool trans_b, int m, int n, int k, float alpha,
               const float* a, int lda, const float* b, int ldb, float beta, float* c, int ldc,
               const TileView* a_view, const TileView* b_view) {
  const char* op = "tile_gemm";
  check_arg(m >= 0, op, "m", ">= 0", std::to_string(m));
  check_arg(n >= 0, op, "n", ">= 0", std::to_string(n));
  check_arg(k >= 0, op, "k", ">= 0", std::to_string(k));
  if (m == 0 || n == 0) return;
  const std::size_t mp = round_up(static_cast<std::size_t>(m), kRows);
  const std::size_t np = round_up(static_cast<std::size_t>(n), kCols);
  const std::size_t kp = round_up(static_cast<std::size_t>(k), kDepth);
  const auto mu = static_cast<std::size_t>(m), nu = static_cast<std::size_t>(n),
             ku = static_cast<std::size_t>(k);
  thread_local std::vector<std::uint16_t> a_tiles, b_tiles, row;
  row.resize(std::max({mu, nu, ku}) + 1);
  // The padding is zero: zero products. Rows are rounded 16 values at a time (round_row_bf16).
  // op(A)(r, p) at row r, element p.
  TileView av{a_tiles.data(), kp};
  if (a_view != nullptr) {
    av = *a_view;
  } else {
    a_tiles.resize(mp * kp);
    av.data = a_tiles.data();
    if (trans_a) {  // op(A)(r, p) = a[p, r]: a's rows rounded, then transposed into the tiles
      thread_local std::vector<std::uint16_t> rounded;
      rounded.resize(ku * mu);
      round_rows(a, static_cast<std::size_t>(lda), 0, ku, mu, rounded.data(), mu, mu);
      transpose_rounded(rounded.data(), ku, mu, mu, a_tiles.data(), kp);
    } else {
      round_rows(a, static_cast<std::size_t>(lda), 0, mu, ku, a_tiles.data(), kp, kp);
    }
    std::fill(a_tiles.begin() + static_cast<std::ptrdiff_t>(mu * kp), a_tiles.end(),
              std::uint16_t{0});
  }
  // op(B)(p, q) at VNNI pair row p / 2, element 2q + p % 2: as 32-bit units, pair row t holds
  // (op(B)(2t, q), op(B)(2t + 1, q)) at unit q, the first in the low half.
  TileView bv{nullptr, 2 * np};
  if (b_view != nullptr) {
    bv = *b_view;
  } else {
    b_tiles.assign(kp * np, 0);
    bv.data = b_tiles.data();
    if (trans_b) {  // op(B)(p, q) = b[q, p]: row q of b holds unit q of every pair row, in order
      pack_transposed(b, static_cast<std::size_t>(ldb), nu, ku, b_tiles.data(), np, row.data());
    } else {  // b's rows 2t and 2t + 1 interleaved into pair row t
      pack_rows(b, static_cast<std::size_t>(ldb), ku, nu, b_tiles.data(), np, row.data());
    }
  }
  Sink sink{c, static_cast<std::size_t>(ldc)};
  sink.finish = true;
  sink.m = m, sink.n = n, sink.alpha = alpha, sink.beta = beta;
  run_product(impl, av, bv, sink, static_cast<int>(mp / kRows), static_cast<int>(np / kCols),
              static_cast<int>(kp / kDepth));
}

}  // namespace detail::tiles
}  // namespace attnlab
