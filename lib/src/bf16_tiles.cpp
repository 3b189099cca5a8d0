// bf16 tiles (kernels/bf16_tiles.hpp): the AMX implementation, the choice between it and the
// portable one, and the packing of float operands into bf16 tiles.
#include "kernels/bf16_tiles.hpp"

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

#include "amx_tile_config.hpp"
#include "attnlab/fma_peak.hpp"
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

// The portable tile algorithm, the AMX one's loops on tiles in memory.
void portable_product(const std::uint16_t* a, const std::uint16_t* b, float* c, int mt, int nt,
                      int kt, bool accumulate) {
  const std::size_t lda = static_cast<std::size_t>(kt) * kDepth;
  const std::size_t ldb = static_cast<std::size_t>(nt) * 2 * kCols;
  const std::size_t ldc = static_cast<std::size_t>(nt) * kCols;
  TileC tc;
  TileA ta;
  TileB tb;
  for (int i = 0; i < mt; ++i) {
    for (int j = 0; j < nt; ++j) {
      float* ct = c + i * kRows * ldc + j * kCols;
      if (accumulate) {
        load(tc, ct, ldc);
      } else {
        zero(tc);
      }
      for (int t = 0; t < kt; ++t) {
        load(ta, a + i * kRows * lda + t * kDepth, lda);
        load(tb, b + t * (kDepth / 2) * ldb + j * 2 * kCols, ldb);
        dpbf16ps(tc, ta, tb);
      }
      store(tc, ct, ldc);
    }
  }
}

#ifdef ATTNLAB_TILES_AMX
// The same loops as portable_product on tile registers (strides in bytes). Palette 1: tile 0 is C
// (16 rows of 16 floats), 1 is A (16 rows of 32 bf16), 2 is B (16 pair rows of 32 bf16); 64 bytes
// a row each.
__attribute__((target("amx-tile,amx-bf16"))) void amx_product(const std::uint16_t* a,
                                                              const std::uint16_t* b, float* c,
                                                              int mt, int nt, int kt,
                                                              bool accumulate) {
  AmxTileConfig config;
  for (int t = 0; t < 3; ++t) config.colsb[t] = 64, config.rows[t] = kRows;
  _tile_loadconfig(&config);
  const std::size_t lda = static_cast<std::size_t>(kt) * kDepth;
  const std::size_t ldb = static_cast<std::size_t>(nt) * 2 * kCols;
  const std::size_t ldc = static_cast<std::size_t>(nt) * kCols;
  for (int i = 0; i < mt; ++i) {
    for (int j = 0; j < nt; ++j) {
      float* ct = c + i * kRows * ldc + j * kCols;
      if (accumulate) {
        _tile_loadd(0, ct, ldc * sizeof(float));
      } else {
        _tile_zero(0);
      }
      for (int t = 0; t < kt; ++t) {
        _tile_loadd(1, a + i * kRows * lda + t * kDepth, lda * 2);
        _tile_loadd(2, b + t * (kDepth / 2) * ldb + j * 2 * kCols, ldb * 2);
        _tile_dpbf16ps(0, 1, 2);
      }
      _tile_stored(0, ct, ldc * sizeof(float));
    }
  }
  _tile_release();
}
#endif

int round_up(int x, int to) {
  return (x + to - 1) / to * to;
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

void tile_product(TileImpl impl, const std::uint16_t* a, const std::uint16_t* b, float* c, int mt,
                  int nt, int kt, bool accumulate) {
  if (impl == TileImpl::portable) {
    portable_product(a, b, c, mt, nt, kt, accumulate);
    return;
  }
  const AmxSupport& amx = amx_support();
  if (!amx.usable) throw std::runtime_error("tile_product: " + amx.reason);
#ifdef ATTNLAB_TILES_AMX
  amx_product(a, b, c, mt, nt, kt, accumulate);
#endif
}

void tile_gemm(TileImpl impl, bool trans_a, bool trans_b, int m, int n, int k, float alpha,
               const float* a, int lda, const float* b, int ldb, float beta, float* c, int ldc) {
  const char* op = "tile_gemm";
  check_arg(m >= 0, op, "m", ">= 0", std::to_string(m));
  check_arg(n >= 0, op, "n", ">= 0", std::to_string(n));
  check_arg(k >= 0, op, "k", ">= 0", std::to_string(k));
  if (m == 0 || n == 0) return;
  const int mp = round_up(m, kRows), np = round_up(n, kCols), kp = round_up(k, kDepth);
  thread_local std::vector<std::uint16_t> a_tiles, b_tiles, row;
  thread_local std::vector<float> c_tiles;
  a_tiles.resize(static_cast<std::size_t>(mp) * kp);
  b_tiles.resize(static_cast<std::size_t>(kp) * np);
  c_tiles.resize(static_cast<std::size_t>(mp) * np);
  row.resize(static_cast<std::size_t>(std::max({m, n, k})) + 1);
  // The padding is zero: zero products. Rows are rounded 16 values at a time (round_row_bf16).
  // op(A)(r, p) at row r, element p.
  if (trans_a) {  // op(A)(r, p) = a[p, r]: round a's rows, then scatter them down the columns
    std::fill(a_tiles.begin(), a_tiles.end(), std::uint16_t{0});
    for (int p = 0; p < k; ++p) {
      blas::detail::round_row_bf16(a + static_cast<std::size_t>(p) * lda, m, row.data());
      for (int r = 0; r < m; ++r) a_tiles[static_cast<std::size_t>(r) * kp + p] = row[r];
    }
  } else {
    for (int r = 0; r < mp; ++r) {
      std::uint16_t* dst = a_tiles.data() + static_cast<std::size_t>(r) * kp;
      const int done = r < m ? k : 0;
      if (r < m) blas::detail::round_row_bf16(a + static_cast<std::size_t>(r) * lda, k, dst);
      std::fill(dst + done, dst + kp, std::uint16_t{0});
    }
  }
  // op(B)(p, q) at VNNI pair row p / 2, element 2q + p % 2: as 32-bit units, pair row t holds
  // (op(B)(2t, q), op(B)(2t + 1, q)) at unit q, the first in the low half.
  std::fill(b_tiles.begin(), b_tiles.end(), std::uint16_t{0});
  const std::size_t units = static_cast<std::size_t>(np);  // 32-bit units per pair row
  if (trans_b) {  // op(B)(p, q) = b[q, p]: row q of b holds unit q of every pair row, in order
    row[k] = 0;   // an odd k's last pair has no second value
    for (int q = 0; q < n; ++q) {
      blas::detail::round_row_bf16(b + static_cast<std::size_t>(q) * ldb, k, row.data());
      for (int t = 0; 2 * t < k; ++t) {
        std::uint16_t* unit = b_tiles.data() + 2 * (static_cast<std::size_t>(t) * units + q);
        unit[0] = row[2 * t];
        unit[1] = row[2 * t + 1];
      }
    }
  } else {  // b's rows 2t and 2t + 1 interleaved into pair row t
    for (int p = 0; p < k; ++p) {
      blas::detail::round_row_bf16(b + static_cast<std::size_t>(p) * ldb, n, row.data());
      std::uint16_t* dst = b_tiles.data() + static_cast<std::size_t>(p / 2) * 2 * units + p % 2;
      for (int q = 0; q < n; ++q) dst[2 * q] = row[q];
    }
  }
  tile_product(impl, a_tiles.data(), b_tiles.data(), c_tiles.data(), mp / kRows, np / kCols,
               kp / kDepth, false);
  for (int r = 0; r < m; ++r) {
    const float* acc = c_tiles.data() + static_cast<std::size_t>(r) * np;
    float* out = c + static_cast<std::size_t>(r) * ldc;
    if (beta == 0) {
#pragma omp simd
      for (int q = 0; q < n; ++q) out[q] = alpha * acc[q];
    } else {
#pragma omp simd
      for (int q = 0; q < n; ++q) out[q] = alpha * acc[q] + beta * out[q];
    }
  }
}

}  // namespace detail::tiles
}  // namespace attnlab
