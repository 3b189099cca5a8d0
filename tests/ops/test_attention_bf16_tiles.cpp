// The bf16 tiles of the fused CPU attention (lib/src/kernels/bf16_tiles.hpp): the tile operations
// against a double product of the same bf16 values (several depths, the VNNI pair layout, and a
// wrong layout that fails); operands packed once (a call's inputs, the tiles P and dS) against
// packing per product, bit for bit, with NaN around the rows a product reads; the fused attention
// on the portable tiles under a bf16 scope against attention in double on the bf16-rounded
// inputs, with FlashAttention's criterion (at most twice the error of a plain bf16
// implementation, plus 1e-6) for causal, a key mask, grouped-query attention and a softcap, and so
// is the default (blas's bf16 gemm on inputs rounded once per call); its determinism; the AMX
// tiles against the portable ones (skipped without AMX); and, without a bf16 scope, the fp32 path
// bit for bit.
#include <doctest/doctest.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <iostream>
#include <limits>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "attnlab/blas.hpp"
#include "attnlab/fma_peak.hpp"
#include "attnlab/ops/attention.hpp"
#include "attnlab/random.hpp"
#include "attnlab/threads.hpp"
#include "kernels/bf16_tiles.hpp"

using namespace attnlab;
namespace tiles = attnlab::detail::tiles;

namespace {

// tests/CMakeLists.txt registers this as a ctest skip marker: the AMX cases are reported as
// skipped on machines without AMX, never as passed.
constexpr const char* kAmxSkipMarker = "ATTNLAB_TEST_SKIPPED_NO_AMX";

std::uint16_t bf16_bits(float x) {  // ties to even, as the library's rounding (finite x only)
  std::uint32_t u;
  std::memcpy(&u, &x, sizeof u);
  return static_cast<std::uint16_t>((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}

float round_bf16(float x) {
  return tiles::bf16_to_float(bf16_bits(x));
}

// Sets the tile choice for a test and restores the default (and one thread) when it ends.
struct ChoiceGuard {
  explicit ChoiceGuard(tiles::TileChoice choice) { tiles::set_tile_choice(choice); }
  ~ChoiceGuard() {
    tiles::set_tile_choice(tiles::TileChoice::automatic);
    set_num_threads(1);
  }
};

// A (16 x K) and B (K x 16) of bf16 values, B packed as VNNI pairs (or, wrong, row by row), and
// the double product of the same values.
struct TileProblem {
  int depth;
  std::vector<std::uint16_t> a, b_vnni, b_rows;
  std::vector<double> exact, bound;  // |A|·|B| per element: the scale of fp32 rounding
};

TileProblem make_problem(int depth, Rng& rng) {
  TileProblem pr{depth, {}, {}, {}, {}, {}};
  const auto av = randn<float, 2>({16, static_cast<std::size_t>(depth)}, rng);
  const auto bv = randn<float, 2>({static_cast<std::size_t>(depth), 16}, rng);
  pr.a.resize(16 * depth);
  pr.b_vnni.resize(16 * depth);
  pr.b_rows.resize(16 * depth);
  for (int m = 0; m < 16; ++m)
    for (int k = 0; k < depth; ++k) pr.a[m * depth + k] = bf16_bits(av(m, k));
  for (int k = 0; k < depth; ++k) {
    for (int n = 0; n < 16; ++n) {
      const std::uint16_t x = bf16_bits(bv(k, n));
      pr.b_vnni[tiles::vnni_index(k, n, 32)] = x;
      pr.b_rows[k * 16 + n] = x;
    }
  }
  pr.exact.assign(256, 0);
  pr.bound.assign(256, 0);
  for (int m = 0; m < 16; ++m) {
    for (int n = 0; n < 16; ++n) {
      for (int k = 0; k < depth; ++k) {
        const double x = tiles::bf16_to_float(pr.a[m * depth + k]);
        const double y = tiles::bf16_to_float(pr.b_rows[k * 16 + n]);
        pr.exact[m * 16 + n] += x * y;
        pr.bound[m * 16 + n] += std::abs(x * y);
      }
    }
  }
  return pr;
}

// The largest error of C against the exact product in units of the fp32 summation bound
// (depth · 2⁻²⁴ · Σ|a·b|): at most 1 for any order of fp32 sums.
double sum_error(const std::vector<float>& c, const TileProblem& pr) {
  double worst = 0;
  const double eps = std::ldexp(1.0, -24) * pr.depth;
  for (int e = 0; e < 256; ++e) {
    worst = std::max(worst, std::abs(c[e] - pr.exact[e]) / (eps * pr.bound[e] + 1e-30));
  }
  return worst;
}

std::vector<float> run_tiles(tiles::TileImpl impl, const TileProblem& pr,
                             const std::vector<std::uint16_t>& b) {
  std::vector<float> c(256, 0);
  tiles::tile_product(impl, pr.a.data(), b.data(), c.data(), 1, 1, pr.depth / 32, false);
  return c;
}

// ---- attention: cases, inputs on bf16 values, the double and the plain bf16 references ----

struct Case {
  std::string name;
  std::size_t B, H, Hkv, T, D;
  bool causal = false, masked = false;
  double softcap = 0;
};

struct Inputs {
  Tensor4<float> q, k, v, dout;
  KeyMask mask;
};

Inputs make_inputs(const Case& c, std::uint64_t seed) {
  Rng rng(seed);
  Inputs in{
      randn<float, 4>({c.B, c.H, c.T, c.D}, rng), randn<float, 4>({c.B, c.Hkv, c.T, c.D}, rng),
      randn<float, 4>({c.B, c.Hkv, c.T, c.D}, rng), randn<float, 4>({c.B, c.H, c.T, c.D}, rng),
      KeyMask(std::array<std::size_t, 2>{c.B, c.T})};
  for (auto* t : {&in.q, &in.k, &in.v, &in.dout}) {
    for (float& x : *t) x = round_bf16(x);
  }
  const auto u = randn<double, 2>({c.B, c.T}, rng);
  for (std::size_t b = 0; b < c.B; ++b)
    for (std::size_t j = 0; j < c.T; ++j) in.mask(b, j) = !c.masked || j == 0 || u(b, j) > -0.67;
  return in;
}

struct Result {
  std::vector<double> out, dq, dk, dv;
};

// Attention element by element. R = double, round_points false: exact arithmetic on the bf16
// inputs. R = float, round_points true: the plain bf16 implementation: scores and softmax in fp32
// from the bf16 inputs, P rounded to bf16 before P V and Pᵀ dO, s·dS rounded before dS K and
// dSᵀ Q, fp32 sums.
template <class R>
Result reference(const Case& c, const Inputs& in, bool round_points) {
  const auto rnd = [&](R x) { return round_points ? static_cast<R>(round_bf16(float(x))) : x; };
  const std::size_t G = c.H / c.Hkv, D = c.D, T = c.T;
  const R s = static_cast<R>(1 / std::sqrt(static_cast<double>(D)));
  const R hidden = -std::numeric_limits<R>::infinity();
  Result res;
  res.out.assign(c.B * c.H * T * D, 0);
  res.dq.assign(res.out.size(), 0);
  std::vector<R> dk(c.B * c.Hkv * T * D, 0), dv(dk.size(), 0);
  for (std::size_t b = 0; b < c.B; ++b) {
    for (std::size_t h = 0; h < c.H; ++h) {
      const std::size_t kv = h / G;
      for (std::size_t i = 0; i < T; ++i) {
        std::vector<R> score(T, hidden), slope(T, 1), p(T, 0), dp(T, 0), o(D, 0);
        R top = hidden;
        for (std::size_t j = 0; j < T; ++j) {
          if (!in.mask(b, j) || (c.causal && j > i)) continue;
          R dot = 0;
          for (std::size_t d = 0; d < D; ++d) dot += R(in.q(b, h, i, d)) * R(in.k(b, kv, j, d));
          R x = s * dot;
          if (c.softcap > 0) {
            const R cap = static_cast<R>(c.softcap);
            x = cap * std::tanh(x / cap);
            slope[j] = 1 - (x / cap) * (x / cap);
          }
          score[j] = x;
          top = std::max(top, x);
        }
        R sum = 0;
        for (std::size_t j = 0; j < T; ++j)
          if (score[j] != hidden) sum += p[j] = std::exp(score[j] - top);
        for (std::size_t j = 0; j < T; ++j) {
          p[j] /= sum;
          const R pr = rnd(p[j]);
          for (std::size_t d = 0; d < D; ++d) {
            o[d] += pr * R(in.v(b, kv, j, d));
            dp[j] += R(in.dout(b, h, i, d)) * R(in.v(b, kv, j, d));
            dv[((b * c.Hkv + kv) * T + j) * D + d] += pr * R(in.dout(b, h, i, d));
          }
        }
        R row_dot = 0;  // D_i = rowsum(dO ⊙ O)
        for (std::size_t d = 0; d < D; ++d) row_dot += R(in.dout(b, h, i, d)) * o[d];
        const std::size_t row = ((b * c.H + h) * T + i) * D;
        for (std::size_t d = 0; d < D; ++d) res.out[row + d] = double(o[d]);
        std::vector<R> dq(D, 0);
        for (std::size_t j = 0; j < T; ++j) {
          if (p[j] == 0) continue;
          const R g = rnd(s * p[j] * (dp[j] - row_dot) * slope[j]);
          for (std::size_t d = 0; d < D; ++d) {
            dq[d] += g * R(in.k(b, kv, j, d));
            dk[((b * c.Hkv + kv) * T + j) * D + d] += g * R(in.q(b, h, i, d));
          }
        }
        for (std::size_t d = 0; d < D; ++d) res.dq[row + d] = double(dq[d]);
      }
    }
  }
  res.dk.assign(dk.begin(), dk.end());
  res.dv.assign(dv.begin(), dv.end());
  return res;
}

struct Fused {
  Tensor4<float> out;
  SdpaGrads<float> g;
};

Fused run_fused(const Case& c, const Inputs& in) {
  SdpaOptions options;
  options.path = SdpaPath::fused;
  options.causal = c.causal;
  options.softcap = c.softcap;
  options.tile_rows = 32;  // several row and key tiles, ragged at the ends
  options.tile_keys = 48;
  SdpaCache<float> cache;
  Fused f;
  f.out = sdpa_forward(cache, in.q, in.k, in.v, options, c.masked ? &in.mask : nullptr);
  f.g = sdpa_backward(in.dout, cache, in.q, in.k, in.v);
  return f;
}

template <class X>
double max_error(const X& x, const std::vector<double>& exact) {
  double worst = 0;
  std::size_t e = 0;
  for (auto it = x.begin(); it != x.end(); ++it, ++e)
    worst = std::max(worst, std::abs(double(*it) - exact[e]));
  return worst;
}

// Two bf16 runs whose products sum in different fp32 orders: the fused path rounds P and s·dS to
// bf16 before the next product, so an fp32 difference that crosses a bf16 rounding boundary moves
// an element by up to one bf16 step of the intermediate (2⁻⁸ relative) times the other operand.
// So: at most 1% of the elements differ by more than 1e-4, and none by more than 2⁻⁸.
template <class X, class Y>
bool agree_to_bf16_rounding(const X& x, const Y& y) {
  std::size_t apart = 0;
  double worst = 0;
  auto it = y.begin();
  for (auto v : x) {
    const double d = std::abs(double(v) - double(*it++));
    apart += d > 1e-4;
    worst = std::max(worst, d);
  }
  return apart * 100 <= x.size() && worst <= std::ldexp(1.0, -8);
}

template <class T>
bool bit_identical(const T& a, const T& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(*a.data())) == 0;
}

bool same_bits(const Fused& a, const Fused& b) {
  return bit_identical(a.out, b.out) && bit_identical(a.g.dq, b.g.dq) &&
         bit_identical(a.g.dk, b.g.dk) && bit_identical(a.g.dv, b.g.dv) &&
         bit_identical(a.g.dscale, b.g.dscale);
}

const std::vector<Case>& cases() {
  // T = 70 and D = 40: ragged row and key tiles, and a depth that pads the bf16 tiles.
  static const std::vector<Case> all = {
      {"causal", 2, 2, 2, 70, 40, true, false, 0},
      {"key mask", 2, 2, 2, 70, 40, false, true, 0},
      {"grouped-query", 2, 4, 2, 70, 40, true, false, 0},
      {"softcap", 2, 2, 2, 70, 40, true, true, 5},
  };
  return all;
}

}  // namespace

TEST_CASE("bf16 tiles: portable dpbf16ps is the product of the bf16 values, VNNI pairs") {
  Rng rng(7);
  for (int depth : {32, 64, 160}) {
    CAPTURE(depth);
    const TileProblem pr = make_problem(depth, rng);
    CHECK(sum_error(run_tiles(tiles::TileImpl::portable, pr, pr.b_vnni), pr) <= 1.0);
    // The single-tile operations by hand: zero, load, dpbf16ps per 32 of depth, store.
    tiles::TileC c;
    tiles::TileA a;
    tiles::TileB b;
    tiles::zero(c);
    for (int t = 0; t < depth / 32; ++t) {
      tiles::load(a, pr.a.data() + t * 32, depth);
      tiles::load(b, pr.b_vnni.data() + t * 16 * 32, 32);
      tiles::dpbf16ps(c, a, b);
    }
    std::vector<float> out(256);
    tiles::store(c, out.data(), 16);
    CHECK(out == run_tiles(tiles::TileImpl::portable, pr, pr.b_vnni));
    // B packed row by row (not in pairs) gives another product: the layout is checked.
    CHECK(sum_error(run_tiles(tiles::TileImpl::portable, pr, pr.b_rows), pr) > 1000.0);
  }
}

TEST_CASE("bf16 tiles: tile_gemm is blas::gemm's contract on bf16 operands") {
  Rng rng(8);
  const int m = 37, n = 29, k = 41, pad = 3;  // none a multiple of a tile side
  for (bool ta : {false, true}) {
    for (bool tb : {false, true}) {
      CAPTURE(ta);
      CAPTURE(tb);
      const int lda = (ta ? m : k) + pad, ldb = (tb ? k : n) + pad, ldc = n + pad;
      const auto av = randn<float, 1>({static_cast<std::size_t>((ta ? k : m) * lda)}, rng);
      const auto bv = randn<float, 1>({static_cast<std::size_t>((tb ? n : k) * ldb)}, rng);
      const auto cv = randn<float, 1>({static_cast<std::size_t>(m * ldc)}, rng);
      std::vector<float> c(cv.begin(), cv.end());
      tiles::tile_gemm(tiles::TileImpl::portable, ta, tb, m, n, k, 0.5f, av.data(), lda, bv.data(),
                       ldb, 1.0f, c.data(), ldc);
      double worst = 0;
      for (int i = 0; i < m; ++i) {
        for (int j = 0; j < n; ++j) {
          double sum = 0, bound = 0;
          for (int p = 0; p < k; ++p) {
            const double x = round_bf16(ta ? av(p * lda + i) : av(i * lda + p));
            const double y = round_bf16(tb ? bv(j * ldb + p) : bv(p * ldb + j));
            sum += x * y;
            bound += std::abs(x * y);
          }
          const double want = 0.5 * sum + cv(i * ldc + j);
          worst = std::max(worst, std::abs(c[i * ldc + j] - want) / (2e-7 * k * bound + 1e-6));
        }
      }
      CHECK(worst <= 1.0);
      CHECK(c[ldc - 1] == cv(ldc - 1));  // the padding of C's rows is untouched
    }
  }
  std::vector<float> x(4);
  CHECK_THROWS_WITH_AS(tiles::tile_gemm(tiles::TileImpl::portable, false, false, -1, 1, 1, 1.0f,
                                        x.data(), 1, x.data(), 1, 0.0f, x.data(), 1),
                       "tile_gemm: m expected >= 0, got -1", std::invalid_argument);
}

namespace {

// The implementations this machine runs: portable always, AMX where usable.
std::vector<tiles::TileImpl> impls_here() {
  std::vector<tiles::TileImpl> impls{tiles::TileImpl::portable};
  if (amx_support().usable) impls.push_back(tiles::TileImpl::amx);
  return impls;
}

// tile_gemm(C = A · B) with one operand a row range of x read through x's packed view, and again
// packing it per product: the same bits, and the view was taken (or refused, when `viewed` is
// false). The other operand is random; C starts random and beta is 1.
struct ViewCase {
  const char* what;
  bool as_a, trans;  // x's operand: op(A) = rows; op(B) = rowsᵀ (trans) or rows as the depth
  std::size_t row;   // x's first row (global: blocks of `rows` rows)
  int m, n, k;
  bool viewed;
};

void check_view(tiles::TileImpl impl, const tiles::PackedInput& packed, const Tensor2<float>& x,
                const ViewCase& vc, Rng& rng) {
  CAPTURE(vc.what);
  const int cols = static_cast<int>(x.shape()[1]);
  const float* at = x.data() + vc.row * x.shape()[1];
  tiles::TileView view;
  const bool taken = packed.view(at, cols, vc.as_a, vc.trans, vc.k, view);
  CHECK(taken == vc.viewed);
  const int other_rows = vc.as_a ? vc.k : vc.m, other_cols = vc.as_a ? vc.n : vc.k;
  const auto other = randn<float, 2>(
      {static_cast<std::size_t>(other_rows), static_cast<std::size_t>(other_cols)}, rng);
  const auto c0 =
      randn<float, 2>({static_cast<std::size_t>(vc.m), static_cast<std::size_t>(vc.n)}, rng);
  std::vector<float> per_product(c0.begin(), c0.end()), through_view(c0.begin(), c0.end());
  const auto run = [&](std::vector<float>& c, const tiles::TileView* v) {
    if (vc.as_a) {
      tiles::tile_gemm(impl, false, false, vc.m, vc.n, vc.k, 0.5f, at, cols, other.data(),
                       other_cols, 1.0f, c.data(), vc.n, v, nullptr);
    } else {
      tiles::tile_gemm(impl, false, vc.trans, vc.m, vc.n, vc.k, 0.5f, other.data(), other_cols, at,
                       cols, 1.0f, c.data(), vc.n, nullptr, v);
    }
  };
  run(per_product, nullptr);
  run(through_view, taken ? &view : nullptr);
  CHECK(std::memcmp(per_product.data(), through_view.data(), per_product.size() * 4) == 0);
  CHECK(std::all_of(through_view.begin(), through_view.end(),
                    [](float v) { return std::isfinite(v); }));
}

}  // namespace

// Blocks of 70 rows of 40 values (ragged against 16, 32 and the depth's 32): every view a product
// reads has the bits of packing per product, whatever row it starts at; a NaN in every row the
// product does not read (the row before and the rows after) never reaches C, as with packing
// per product; and a view that would read past the product's own rows is refused.
TEST_CASE("bf16 tiles: inputs packed once give the bits of packing every product") {
  Rng rng(21);
  constexpr std::size_t kBlocks = 3, kRowsPer = 70, kCols = 40;
  auto x = randn<float, 2>({kBlocks * kRowsPer, kCols}, rng);
  const float nan = std::numeric_limits<float>::quiet_NaN();
  using Layout = tiles::PackedInput::Layout;
  const std::vector<ViewCase> view_cases = {
      // op(A) = x's rows: any first row, ragged m
      {"A, block start", true, false, 70, 70, 24, 40, true},
      {"A, mid block, ragged", true, false, 75, 17, 24, 40, true},
      // op(B) = rowsᵀ: any first row, ragged n
      {"B transposed, block start", false, true, 140, 20, 70, 40, true},
      {"B transposed, mid block", false, true, 73, 20, 33, 40, true},
      // op(B) = rows as the depth: a whole number of depth tiles from an even row, or the block's
      // tail from a tile boundary (its padding is the block's zeros)
      {"B rows, two depth tiles", false, false, 70, 20, 40, 64, true},
      {"B rows, even row", false, false, 72, 20, 40, 32, true},
      {"B rows, block tail", false, false, 102, 20, 40, 38, true},
      {"B rows, odd row (refused)", false, false, 71, 20, 40, 32, false},
      {"B rows, ragged depth mid block (refused)", false, false, 70, 20, 40, 40, false},
      {"B rows, past the block (refused)", false, false, 110, 20, 40, 32, false},
  };
  for (tiles::TileImpl impl : impls_here()) {
    CAPTURE(tiles::to_string(impl));
    for (const ViewCase& vc : view_cases) {
      // NaN in the rows around the product's own: the row before and every row after
      const std::size_t own = vc.as_a    ? std::size_t(vc.m)
                              : vc.trans ? std::size_t(vc.n)
                                         : std::size_t(vc.k);
      auto poisoned = x;
      for (std::size_t r = 0; r < kBlocks * kRowsPer; ++r) {
        if (r + 1 == vc.row || r >= vc.row + own)
          for (std::size_t c = 0; c < kCols; ++c) poisoned(r, c) = nan;
      }
      tiles::PackedInput packed;
      packed.pack(poisoned.data(), kBlocks, kRowsPer, kCols,
                  Layout::a | Layout::b_transposed | Layout::b_rows);
      check_view(impl, packed, poisoned, vc, rng);
    }
  }
  // Not a row of x, another stride, another depth, or a layout not packed: no view.
  tiles::PackedInput packed;
  packed.pack(x.data(), kBlocks, kRowsPer, kCols, Layout::a);
  tiles::TileView view;
  CHECK(packed.view(x.data(), 40, true, false, 40, view));
  CHECK_FALSE(packed.view(x.data() + 1, 40, true, false, 40, view));
  CHECK_FALSE(packed.view(x.data(), 41, true, false, 40, view));
  CHECK_FALSE(packed.view(x.data(), 40, true, false, 39, view));
  CHECK_FALSE(packed.view(x.data() + kBlocks * kRowsPer * kCols, 40, true, false, 40, view));
  CHECK_FALSE(packed.view(x.data(), 40, false, true, 40, view));
  CHECK_FALSE(packed.view(x.data(), 40, false, false, 32, view));
}

// P and dS of the fused attention: a tile rounded once is read as op(A) = the tile (P V, dS K) and
// as its transpose (Pᵀ dO, dSᵀ Q) with the bits of packing it per product, ragged against every
// tile side; any other operand, shape or stride is refused, and a forgotten tile gives no view.
TEST_CASE("bf16 tiles: a tile rounded once gives the bits of packing it per product") {
  Rng rng(22);
  for (tiles::TileImpl impl : impls_here()) {
    CAPTURE(tiles::to_string(impl));
    for (auto [rows, cols] : {std::pair{128, 128}, std::pair{37, 70}, std::pair{70, 5}}) {
      CAPTURE(rows);
      CAPTURE(cols);
      const auto x =
          randn<float, 2>({static_cast<std::size_t>(rows), static_cast<std::size_t>(cols)}, rng);
      tiles::RoundedTile own;
      own.round(x.data(), rows, cols);
      for (bool trans : {false, true}) {
        CAPTURE(trans);
        const int m = trans ? cols : rows, k = trans ? rows : cols, n = 24;
        const auto b = randn<float, 2>({static_cast<std::size_t>(k), std::size_t(n)}, rng);
        const auto c0 = randn<float, 2>({static_cast<std::size_t>(m), std::size_t(n)}, rng);
        tiles::TileView view;
        REQUIRE(own.view(x.data(), cols, trans, m, k, view));
        std::vector<float> per_product(c0.begin(), c0.end()), through_view(c0.begin(), c0.end());
        tiles::tile_gemm(impl, trans, false, m, n, k, 0.5f, x.data(), cols, b.data(), n, 1.0f,
                         per_product.data(), n);
        tiles::tile_gemm(impl, trans, false, m, n, k, 0.5f, x.data(), cols, b.data(), n, 1.0f,
                         through_view.data(), n, &view, nullptr);
        CHECK(std::memcmp(per_product.data(), through_view.data(), per_product.size() * 4) == 0);
        CHECK_FALSE(own.view(x.data(), cols, trans, m + 1, k, view));
        CHECK_FALSE(own.view(x.data(), cols, trans, m, k - 1, view));
      }
      tiles::TileView view;
      CHECK_FALSE(own.view(x.data() + cols, cols, false, rows - 1, cols, view));
      CHECK_FALSE(own.view(x.data(), cols + 1, false, rows, cols, view));
      own.forget();
      CHECK(own.source() == nullptr);
      CHECK_FALSE(own.view(x.data(), cols, false, rows, cols, view));
    }
  }
}

// FlashAttention's criterion for every case on the tiles `choice` picks: against the double product
// of the bf16 inputs, the error is at most twice a plain bf16 implementation's, and above fp32's.
void check_criterion(tiles::TileChoice choice) {
  ChoiceGuard guard(choice);
  for (const Case& c : cases()) {
    CAPTURE(c.name);
    const Inputs in = make_inputs(c, 11);
    const Result exact = reference<double>(c, in, false);
    const Result plain = reference<float>(c, in, true);
    Fused f;
    {
      const blas::GemmPrecisionScope scope(GemmPrecision::bf16);
      f = run_fused(c, in);
    }
    const Fused fp32 = run_fused(c, in);
    const auto check = [&](const char* what, const auto& got, const auto& fp32_got,
                           const std::vector<double>& want, const std::vector<double>& plain_got) {
      CAPTURE(what);
      const double err = max_error(got, want), plain_err = max_error(plain_got, want);
      CAPTURE(err);
      CAPTURE(plain_err);
      CHECK(err <= 2 * plain_err + 1e-6);
      CHECK(err > max_error(fp32_got, want));  // the products did run in bf16
    };
    check("out", f.out, fp32.out, exact.out, plain.out);
    check("dq", f.g.dq, fp32.g.dq, exact.dq, plain.dq);
    check("dk", f.g.dk, fp32.g.dk, exact.dk, plain.dk);
    check("dv", f.g.dv, fp32.g.dv, exact.dv, plain.dv);
  }
}

TEST_CASE("bf16 tiles: the fused attention is within twice a plain bf16 implementation's error") {
  check_criterion(tiles::TileChoice::portable);
}

// The default, blas's bf16 gemm: the call's inputs are rounded once and each tile product reads
// its rows of them, so a wrong row or stride shows here.
TEST_CASE("bf16 fused attention on bf16 gemms (the default) meets the same criterion") {
  check_criterion(tiles::TileChoice::automatic);
}

TEST_CASE("bf16 tiles: the same bits twice and at 1 and 2 threads") {
  ChoiceGuard guard(tiles::TileChoice::portable);
  const blas::GemmPrecisionScope scope(GemmPrecision::bf16);
  const Case c{"grouped-query, key mask", 3, 4, 2, 70, 40, true, true, 0};
  const Inputs in = make_inputs(c, 12);
  set_num_threads(1);
  const Fused one = run_fused(c, in);
  const Fused again = run_fused(c, in);
  set_num_threads(2);
  const Fused two = run_fused(c, in);
  CHECK(same_bits(one, again));
  CHECK(same_bits(one, two));
}

TEST_CASE("bf16 tiles: without a bf16 scope the fused attention is the fp32 path, bit for bit") {
  ChoiceGuard guard(tiles::TileChoice::portable);
  const Case c{"causal, key mask", 2, 4, 2, 70, 40, true, true, 0};
  const Inputs in = make_inputs(c, 13);
  const Fused with_tiles_chosen = run_fused(c, in);
  tiles::set_tile_choice(tiles::TileChoice::off);
  const Fused fp32 = run_fused(c, in);
  CHECK(same_bits(with_tiles_chosen, fp32));
  // Under the scope the portable tiles run, and their bits differ from blas's bf16 gemm's only
  // in the order of fp32 sums (and the bf16 roundings of P that this moves): close, and the
  // products differ from fp32's.
  const blas::GemmPrecisionScope scope(GemmPrecision::bf16);
  const Fused blas_bf16 = run_fused(c, in);
  tiles::set_tile_choice(tiles::TileChoice::portable);
  const Fused tiled = run_fused(c, in);
  CHECK_FALSE(same_bits(tiled, fp32));
  CHECK(agree_to_bf16_rounding(tiled.out, blas_bf16.out));
  // The default is blas's bf16 gemm, bit for bit, with AMX or without (the tiles are slower).
  tiles::set_tile_choice(tiles::TileChoice::automatic);
  const Fused automatic = run_fused(c, in);
  CHECK_FALSE(tiles::tiles_in_use());
  CHECK(same_bits(automatic, blas_bf16));
}

// (d) Where AMX is usable: TDPBF16PS against the double product and the portable tiles, and the
// fused attention on AMX against the portable tiles. Elsewhere reported as skipped, with the
// reason, and asking for AMX tiles refuses with it.
TEST_CASE("bf16 tiles: AMX tiles equal the portable ones to fp32 summation order") {
  const AmxSupport& amx = amx_support();
  if (!amx.usable) {
    std::vector<std::uint16_t> a(512), b(512);
    std::vector<float> c(256);
    CHECK_THROWS_WITH_AS(
        tiles::tile_product(tiles::TileImpl::amx, a.data(), b.data(), c.data(), 1, 1, 1, false),
        ("tile_product: " + amx.reason).c_str(), std::runtime_error);
    CHECK_THROWS_WITH_AS(tiles::set_tile_choice(tiles::TileChoice::amx),
                         ("set_tile_choice: amx asked for, but " + amx.reason).c_str(),
                         std::runtime_error);
    CHECK(tiles::tile_impl() == tiles::TileImpl::portable);
    std::cout << kAmxSkipMarker << ": " << amx.reason << std::endl;
    return;
  }
  Rng rng(9);
  for (int depth : {32, 64, 160}) {
    CAPTURE(depth);
    const TileProblem pr = make_problem(depth, rng);
    CHECK(sum_error(run_tiles(tiles::TileImpl::amx, pr, pr.b_vnni), pr) <= 1.0);
    CHECK(sum_error(run_tiles(tiles::TileImpl::amx, pr, pr.b_rows), pr) > 1000.0);
  }
  check_criterion(tiles::TileChoice::amx);
  ChoiceGuard guard(tiles::TileChoice::amx);
  CHECK(tiles::tile_impl() == tiles::TileImpl::amx);
  const blas::GemmPrecisionScope scope(GemmPrecision::bf16);
  for (const Case& c : cases()) {
    CAPTURE(c.name);
    const Inputs in = make_inputs(c, 14);
    tiles::set_tile_choice(tiles::TileChoice::amx);
    const Fused on_amx = run_fused(c, in);
    tiles::set_tile_choice(tiles::TileChoice::portable);
    const Fused portable = run_fused(c, in);
    // Only the order of fp32 sums (and AMX's flush of subnormals) differs, and the bf16
    // roundings of P and s·dS that this moves.
    CHECK(agree_to_bf16_rounding(on_amx.out, portable.out));
    CHECK(agree_to_bf16_rounding(on_amx.g.dq, portable.g.dq));
    CHECK(agree_to_bf16_rounding(on_amx.g.dk, portable.g.dk));
    CHECK(agree_to_bf16_rounding(on_amx.g.dv, portable.g.dv));
  }
}
