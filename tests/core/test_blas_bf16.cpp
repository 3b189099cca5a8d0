// bf16 gemms (GemmPrecision::bf16): under a GemmPrecisionScope(bf16) every float gemm equals the
// product of A and B rounded to bfloat16 (to nearest, ties to even: io/safetensors.hpp's
// float_to_bf16, which matches PyTorch's .bfloat16()) summed in fp32, for every transpose, padded
// leading dimension, alpha and beta, on one thread and split over two; it is measurably not the
// fp32 gemm; overflow, NaN and beta = 0 behave as documented; the scope is a process-wide count.
// oneDNN's matmul primitive, which runs bf16 gemms where the CPU has AMX, is checked here with f32
// operands (the same strides, transposes and post-ops) so that it runs on any CPU. Operands rounded
// once (blas::Bf16Operand) give gemm_bf16 the bits of the gemm that rounds its own, and the linear
// kernels that round each operand once per call the bits of one rounding gemm per row chunk.
#include <doctest/doctest.h>

#include <algorithm>
#include <cfloat>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <thread>
#include <vector>

#include "attnlab/blas.hpp"
#include "attnlab/io/safetensors.hpp"
#include "attnlab/random.hpp"
#include "attnlab/threads.hpp"
#include "kernels/linear.hpp"

using namespace attnlab;

namespace {

float round_bf16(float x) {
  return bf16_to_float(float_to_bf16(x));
}

struct Case {
  bool ta, tb;
  int m, n, k;
  int pad = 3;
};

struct Operands {
  std::vector<float> a, b, c;
  int lda, ldb, ldc;
};

Operands make_operands(const Case& s, std::uint64_t seed) {
  Operands o;
  o.lda = (s.ta ? s.m : s.k) + s.pad;
  o.ldb = (s.tb ? s.k : s.n) + s.pad;
  o.ldc = s.n + s.pad;
  Rng rng(seed);
  const auto fill = [&rng](std::vector<float>& x, std::size_t size) {
    x.resize(size);
    for (float& v : x) v = static_cast<float>(rng.normal());
  };
  fill(o.a, static_cast<std::size_t>((s.ta ? s.k : s.m) * o.lda));
  fill(o.b, static_cast<std::size_t>((s.tb ? s.n : s.k) * o.ldb));
  fill(o.c, static_cast<std::size_t>(s.m * o.ldc));
  return o;
}

// alpha · op(round(A)) op(round(B)) + beta · C in double (round = identity when !bf16), and the
// scale sum |alpha| |a||b| + |beta c| of each entry, for the error bound of fp32 sums.
void reference(const Case& s, const Operands& o, float alpha, float beta, bool bf16,
               std::vector<double>& out, std::vector<double>& scale) {
  out.assign(static_cast<std::size_t>(s.m * s.n), 0);
  scale.assign(out.size(), 0);
  const auto r = [bf16](float x) { return static_cast<double>(bf16 ? round_bf16(x) : x); };
  for (int i = 0; i < s.m; ++i) {
    for (int j = 0; j < s.n; ++j) {
      double sum = 0, abs_sum = 0;
      for (int p = 0; p < s.k; ++p) {
        const double x = r(s.ta ? o.a[p * o.lda + i] : o.a[i * o.lda + p]);
        const double y = r(s.tb ? o.b[j * o.ldb + p] : o.b[p * o.ldb + j]);
        sum += x * y;
        abs_sum += std::abs(x * y);
      }
      const double c0 = beta == 0 ? 0.0 : o.c[i * o.ldc + j];  // beta 0: C is not read
      out[i * s.n + j] = alpha * sum + beta * c0;
      scale[i * s.n + j] = std::abs(alpha) * abs_sum + std::abs(beta * c0);
    }
  }
}

// The largest |got - expected| / scale over C's entries (its padding must be untouched).
double worst_error(const Case& s, const Operands& before, const std::vector<float>& c,
                   const std::vector<double>& expected, const std::vector<double>& scale) {
  double worst = 0;
  for (int i = 0; i < s.m; ++i) {
    for (int j = 0; j < s.n; ++j)
      worst = std::max(worst, std::abs(c[i * before.ldc + j] - expected[i * s.n + j]) /
                                  std::max(scale[i * s.n + j], 1e-30));
    for (int j = s.n; j < before.ldc; ++j)
      if (c[i * before.ldc + j] != before.c[i * before.ldc + j]) return INFINITY;
  }
  return worst;
}

std::vector<float> run_gemm(const Case& s, const Operands& o, float alpha, float beta) {
  std::vector<float> c = o.c;
  blas::gemm<float>(s.ta, s.tb, s.m, s.n, s.k, alpha, o.a.data(), o.lda, o.b.data(), o.ldb, beta,
                    c.data(), o.ldc);
  return c;
}

}  // namespace

TEST_CASE("bf16 rounding: to nearest with ties to even, overflow to inf, as PyTorch") {
  // Independent of the library: bf16 keeps 8 significant bits, so 1 + 2^-8 is a tie (to 1, even)
  // and 1 + 3 · 2^-8 a tie the other way (to 1 + 2^-6).
  CHECK(round_bf16(1.0f + std::ldexp(1.0f, -8)) == 1.0f);
  CHECK(round_bf16(1.0f + 3 * std::ldexp(1.0f, -8)) == 1.0f + std::ldexp(1.0f, -6));
  CHECK(round_bf16(1.0f + 5 * std::ldexp(1.0f, -9)) == 1.0f + std::ldexp(1.0f, -7));
  CHECK(std::isinf(round_bf16(FLT_MAX)));
}

TEST_CASE("bf16 gemm: the products of A and B rounded to bf16, summed in fp32, every transpose") {
  const float alpha = 0.75f, beta = -0.5f;
  for (const bool ta : {false, true}) {
    for (const bool tb : {false, true}) {
      const Case s{ta, tb, 37, 29, 300};
      CAPTURE(ta);
      CAPTURE(tb);
      const Operands o = make_operands(s, 7 + 2 * ta + tb);
      std::vector<double> bf16_ref, fp32_ref, scale, scale32;
      reference(s, o, alpha, beta, true, bf16_ref, scale);
      reference(s, o, alpha, beta, false, fp32_ref, scale32);
      const std::vector<float> fp32 = run_gemm(s, o, alpha, beta);
      std::vector<float> bf16;
      {
        const blas::GemmPrecisionScope scope(GemmPrecision::bf16);
        bf16 = run_gemm(s, o, alpha, beta);
      }
      // fp32 sums of k = 300 exact products: within a few float ulps of the scale.
      CHECK(worst_error(s, o, bf16, bf16_ref, scale) < 1e-5);
      CHECK(worst_error(s, o, fp32, fp32_ref, scale32) < 1e-5);
      // The operands' rounding (relative 2^-9 each) shows: bf16 is not the fp32 gemm.
      CHECK(worst_error(s, o, bf16, fp32_ref, scale32) > 1e-4);
      CHECK(worst_error(s, o, fp32, bf16_ref, scale) > 1e-4);
    }
  }
}

TEST_CASE("bf16 gemm: split over two threads it is still the bf16 product") {
  const ThreadScope threads(2);
  const Case s{false, true, 256, 192, 64, 1};  // 3.1M multiply-adds: split by rows
  const Operands o = make_operands(s, 99);
  std::vector<double> ref, scale;
  reference(s, o, 1.0f, 0.0f, true, ref, scale);
  const blas::GemmPrecisionScope scope(GemmPrecision::bf16);
  CHECK(worst_error(s, o, run_gemm(s, o, 1.0f, 0.0f), ref, scale) < 1e-5);
  const Case wide{true, false, 40, 512, 64, 2};  // wider than tall: split by columns
  const Operands w = make_operands(wide, 100);
  reference(wide, w, 2.0f, 1.0f, true, ref, scale);
  CHECK(worst_error(wide, w, run_gemm(wide, w, 2.0f, 1.0f), ref, scale) < 1e-5);
}

TEST_CASE("bf16 gemm: A times the identity is A rounded to bf16, ties in every column position") {
  // The operands' rounding copy runs 8 or 16 values at a time, then one by one, and over the
  // threads when it is large: every value must round as float_to_bf16 (ties to even) wherever it
  // falls. A is 1024 x 67 with a padded row (68); B the 67 x 67 identity, so C holds A's rounded
  // values exactly (one non-zero product each).
  const ThreadScope threads(2);
  const int m = 1024, k = 67, lda = 68;
  std::vector<float> a(static_cast<std::size_t>(m) * lda, 7.0f), b(k * k, 0.0f), c(m * k, 0.0f);
  for (int p = 0; p < k; ++p) b[p * k + p] = 1.0f;
  const float ulp = std::ldexp(1.0f, -7);  // of bf16 at [1, 2)
  const float kinds[] = {
      1.0f + ulp / 2,                        // tie, to even (down)
      1.0f + 3 * ulp / 2,                    // tie, to even (up)
      1.0f + ulp / 2 + 1e-7f,                // just past a tie: up
      1.0f + ulp / 2 - 1.2e-7f,              // just short of one: down
      -(1.0f + 3 * ulp / 2),                 // a negative tie
      std::ldexp(1.0f, -120) * 1.00390625f,  // a tie far from 1
      0.0f,
      -3.0e38f,  // large and finite after rounding
  };
  constexpr int n_kinds = sizeof kinds / sizeof kinds[0];
  Rng rng(17);
  for (int r = 0; r < m; ++r) {
    for (int j = 0; j < k; ++j) {
      // the kinds cycle through every column position, the rest are random
      a[r * lda + j] =
          (r + j) % 3 == 0 ? kinds[(r + j) % n_kinds] : static_cast<float>(rng.normal() * 3.0);
    }
  }
  {
    const blas::GemmPrecisionScope scope(GemmPrecision::bf16);
    blas::gemm(false, false, m, k, k, 1.0f, a.data(), lda, b.data(), k, 0.0f, c.data(), k);
  }
  int wrong = 0;
  for (int r = 0; r < m; ++r)
    for (int j = 0; j < k; ++j) wrong += c[r * k + j] != round_bf16(a[r * lda + j]);
  CHECK(wrong == 0);
}

TEST_CASE("bf16 gemm: beta 0 ignores C, a NaN stays in its row, a float beyond bf16 is inf") {
  const Case s{false, false, 4, 3, 5, 0};
  Operands o = make_operands(s, 5);
  std::fill(o.c.begin(), o.c.end(), NAN);
  o.a[1 * o.lda + 2] = NAN;      // row 1 of C
  o.a[3 * o.lda + 0] = FLT_MAX;  // rounds up to bf16's inf: row 3 is ±inf (or NaN)
  std::fill(o.b.begin(), o.b.begin() + s.n, 1.0f);  // row 0 of B: positive
  const blas::GemmPrecisionScope scope(GemmPrecision::bf16);
  const std::vector<float> c = run_gemm(s, o, 1.0f, 0.0f);
  for (int j = 0; j < s.n; ++j) {
    CHECK(std::isfinite(c[0 * o.ldc + j]));
    CHECK(std::isnan(c[1 * o.ldc + j]));
    CHECK(std::isfinite(c[2 * o.ldc + j]));
    CHECK(std::isinf(c[3 * o.ldc + j]));
  }
}

TEST_CASE("bf16 gemm precision: a process-wide count of scopes, seen by other threads") {
  CHECK(blas::gemm_precision() == GemmPrecision::fp32);
  {
    const blas::GemmPrecisionScope outer(GemmPrecision::bf16);
    CHECK(blas::gemm_precision() == GemmPrecision::bf16);
    {
      const blas::GemmPrecisionScope fp32(GemmPrecision::fp32);  // cannot undo a bf16 scope
      CHECK(blas::gemm_precision() == GemmPrecision::bf16);
      const blas::GemmPrecisionScope inner(GemmPrecision::bf16);
      GemmPrecision seen = GemmPrecision::fp32;
      std::thread other([&seen] { seen = blas::gemm_precision(); });
      other.join();
      CHECK(seen == GemmPrecision::bf16);
    }
    CHECK(blas::gemm_precision() == GemmPrecision::bf16);
  }
  CHECK(blas::gemm_precision() == GemmPrecision::fp32);
  CHECK(parse_gemm_precision("bf16", "x") == GemmPrecision::bf16);
  CHECK(parse_gemm_precision("fp32", "x") == GemmPrecision::fp32);
  CHECK(parse_gemm_precision("tf32", "x") == GemmPrecision::tf32);
  CHECK_THROWS_WITH(parse_gemm_precision("fp16", "train: precision"),
                    "train: precision: expected fp32, bf16 or tf32, got 'fp16'");
}

TEST_CASE("oneDNN matmul primitive (the bf16 engine's path) with f32 operands equals the loop") {
  if (!onednn_built()) {
    CHECK_FALSE(blas::testing::onednn_matmul_f32(false, false, 1, 1, 1, 1, nullptr, 1, nullptr, 1,
                                                 0, nullptr, 1));
    return;
  }
  // Multiples of 1/4 in [-5/4, 5/4]: every product and sum is exact, so any order gives the loop.
  for (const bool ta : {false, true}) {
    for (const bool tb : {false, true}) {
      for (const float beta : {0.0f, 0.25f}) {
        CAPTURE(ta);
        CAPTURE(tb);
        CAPTURE(beta);
        const Case s{ta, tb, 37, 29, 41, 3};
        Operands o = make_operands(s, 1);
        const auto quarter = [](std::vector<float>& x, int shift) {
          for (std::size_t i = 0; i < x.size(); ++i)
            x[i] = static_cast<float>(static_cast<int>((i * 7 + shift) % 11) - 5) / 4;
        };
        quarter(o.a, 0);
        quarter(o.b, 3);
        quarter(o.c, 5);
        if (beta == 0)  // C is ignored at beta 0
          for (int i = 0; i < 2; ++i) std::fill_n(o.c.begin() + i * o.ldc, s.n, NAN);
        std::vector<double> ref, scale;
        reference(s, o, 0.5f, beta, false, ref, scale);
        for (int round = 0; round < 2; ++round) {  // the second call reuses the kept primitive
          std::vector<float> c = o.c;
          REQUIRE(blas::testing::onednn_matmul_f32(ta, tb, s.m, s.n, s.k, 0.5f, o.a.data(), o.lda,
                                                   o.b.data(), o.ldb, beta, c.data(), o.ldc));
          CHECK(worst_error(s, o, c, ref, scale) == 0);
        }
      }
    }
  }
}

namespace {

// The stored rows x cols of op(X) starting at row `row` of a compact matrix x.
std::vector<float> rows_of(const std::vector<float>& x, int cols, int row, int rows) {
  return {x.begin() + static_cast<std::ptrdiff_t>(row) * cols,
          x.begin() + static_cast<std::ptrdiff_t>(row + rows) * cols};
}

std::vector<float> random_floats(std::size_t size, std::uint64_t seed) {
  Rng rng(seed);
  std::vector<float> x(size);
  for (float& v : x) v = static_cast<float>(rng.normal());
  return x;
}

}  // namespace

TEST_CASE("bf16 gemm on operands rounded once: the bits of the rounding gemm, from any row") {
  const ThreadScope threads(2);
  const blas::GemmPrecisionScope scope(GemmPrecision::bf16);
  // Large enough to split over the two threads; odd sizes and row offsets.
  const int m = 200, n = 72, k = 96, a_row = 5, b_row = 3;
  for (const bool ta : {false, true}) {
    for (const bool tb : {false, true}) {
      CAPTURE(ta);
      CAPTURE(tb);
      const int a_rows = (ta ? k : m) + a_row + 2, a_cols = ta ? m : k;
      const int b_rows = (tb ? n : k) + b_row + 1, b_cols = tb ? k : n;
      const std::vector<float> a = random_floats(std::size_t(a_rows) * a_cols, 3 + ta);
      const std::vector<float> b = random_floats(std::size_t(b_rows) * b_cols, 5 + tb);
      // A padded stride for the rounding: the copy must read cols of each ld-long row.
      std::vector<float> a_padded(std::size_t(a_rows) * (a_cols + 3), NAN);
      for (int r = 0; r < a_rows; ++r)
        std::copy_n(a.begin() + std::ptrdiff_t(r) * a_cols, a_cols,
                    a_padded.begin() + std::ptrdiff_t(r) * (a_cols + 3));
      blas::Bf16Operand ra, rb;
      ra.round(a_padded.data(), a_rows, a_cols, a_cols + 3);
      rb.round(b.data(), b_rows, b_cols, b_cols);
      const std::vector<float> a_part = rows_of(a, a_cols, a_row, ta ? k : m);
      const std::vector<float> b_part = rows_of(b, b_cols, b_row, tb ? n : k);
      std::vector<float> c0 = random_floats(std::size_t(m) * n, 9), c1 = c0;
      blas::gemm(ta, tb, m, n, k, 0.5f, a_part.data(), a_cols, b_part.data(), b_cols, 1.0f,
                 c0.data(), n);
      blas::gemm_bf16(ta, tb, m, n, k, 0.5f, ra, a_row, rb, b_row, 1.0f, c1.data(), n);
      CHECK(c0 == c1);
      // and it is the bf16 product, not fp32's
      std::vector<float> fp32(c0.size(), 0.0f);
      {
        const ThreadScope one(1);
        std::vector<double> ref, scale;
        const Case s{ta, tb, m, n, k, 0};
        const Operands o{a_part, b_part, std::vector<float>(c0.size(), 0.0f), a_cols, b_cols, n};
        std::vector<float> c2 = o.c;
        blas::gemm_bf16(ta, tb, m, n, k, 1.0f, ra, a_row, rb, b_row, 0.0f, c2.data(), n);
        reference(s, o, 1.0f, 0.0f, true, ref, scale);
        CHECK(worst_error(s, o, c2, ref, scale) < 1e-5);
      }
    }
  }
}

TEST_CASE("bf16 gemm on rounded operands: a shape that does not fit is refused, named") {
  blas::Bf16Operand a, b;
  const std::vector<float> x(6 * 4, 1.0f);
  a.round(x.data(), 6, 4, 4);
  b.round(x.data(), 4, 6, 6);
  std::vector<float> c(36);
  blas::gemm_bf16(false, false, 6, 6, 4, 1.0f, a, 0, b, 0, 0.0f, c.data(), 6);
  CHECK(c[0] == 4.0f);
  CHECK_THROWS_WITH_AS(blas::gemm_bf16(false, false, 6, 6, 4, 1.0f, a, 1, b, 0, 0.0f, c.data(), 6),
                       doctest::Contains("gemm_bf16: expected"), std::invalid_argument);
  CHECK_THROWS_AS(blas::gemm_bf16(false, false, 6, 6, 5, 1.0f, a, 0, b, 0, 0.0f, c.data(), 6),
                  std::invalid_argument);
  CHECK_THROWS_WITH_AS(a.round(x.data(), 6, 4, 3), doctest::Contains("Bf16Operand::round"),
                       std::invalid_argument);
}

TEST_CASE("bf16 linear: operands rounded once give the bits of a rounding gemm per row chunk") {
  const ThreadScope threads(2);
  const blas::GemmPrecisionScope scope(GemmPrecision::bf16);
  const std::size_t rows = 300, in = 48, out = 80;
  const std::size_t chunks = detail::linear_chunks(rows);
  REQUIRE(chunks == 2);
  const std::vector<float> x = random_floats(rows * in, 21), dy = random_floats(rows * out, 22);
  const std::vector<float> w = random_floats(in * out, 23), dw0 = random_floats(in * out, 24);
  for (const bool transposed : {false, true}) {
    CAPTURE(transposed);
    const int ld_w = int(transposed ? in : out);
    std::vector<float> y(rows * out), dx(rows * in), dw = dw0, partial((chunks - 1) * in * out);
    detail::linear_forward_rows<float>(y.data(), x.data(), w.data(), nullptr, rows, in, out,
                                       transposed);
    detail::linear_backward_rows<float>(dx.data(), dw.data(), nullptr, dy.data(), x.data(),
                                        w.data(), rows, in, out, partial.data(), transposed,
                                        /*accumulate_dw=*/true);
    // One blas::gemm per chunk of rows, each rounding its own operands; dW's partials added in
    // chunk order.
    std::vector<float> y_ref(rows * out), dx_ref(rows * in), dw_ref = dw0;
    std::vector<float> part(in * out);
    for (std::size_t c = 0; c < chunks; ++c) {
      const std::size_t r0 = rows * c / chunks, r = rows * (c + 1) / chunks - r0;
      blas::gemm(false, transposed, int(r), int(out), int(in), 1.0f, &x[r0 * in], int(in), w.data(),
                 ld_w, 0.0f, &y_ref[r0 * out], int(out));
      blas::gemm(false, !transposed, int(r), int(in), int(out), 1.0f, &dy[r0 * out], int(out),
                 w.data(), ld_w, 0.0f, &dx_ref[r0 * in], int(in));
      float* target = c == 0 ? dw_ref.data() : part.data();
      if (transposed)
        blas::gemm(true, false, int(out), int(in), int(r), 1.0f, &dy[r0 * out], int(out),
                   &x[r0 * in], int(in), c == 0 ? 1.0f : 0.0f, target, int(in));
      else
        blas::gemm(true, false, int(in), int(out), int(r), 1.0f, &x[r0 * in], int(in),
                   &dy[r0 * out], int(out), c == 0 ? 1.0f : 0.0f, target, int(out));
      if (c > 0)
        for (std::size_t i = 0; i < part.size(); ++i) dw_ref[i] += part[i];
    }
    CHECK(y == y_ref);
    CHECK(dx == dx_ref);
    CHECK(dw == dw_ref);
  }
}

TEST_CASE(
    "bf16 linear with an OperandKeep: the same bits with x and W kept from forward to backward") {
  const ThreadScope threads(2);
  const std::size_t rows = 300, in = 48, out = 80, chunks = detail::linear_chunks(rows);
  const std::vector<float> x0 = random_floats(rows * in, 31), dy = random_floats(rows * out, 32);
  const std::vector<float> w0 = random_floats(in * out, 33), w2 = random_floats(in * out, 34);
  // One linear's forward and backward (dW assigned) without a keep, on copies of x and w.
  struct Result {
    std::vector<float> y, dx, dw;
  };
  const auto plain = [&](const std::vector<float>& x, const std::vector<float>& w) {
    Result r{std::vector<float>(rows * out), std::vector<float>(rows * in),
             std::vector<float>(in * out)};
    std::vector<float> partial((chunks - 1) * in * out);
    detail::linear_forward_rows<float>(r.y.data(), x.data(), w.data(), nullptr, rows, in, out);
    detail::linear_backward_rows<float>(r.dx.data(), r.dw.data(), nullptr, dy.data(), x.data(),
                                        w.data(), rows, in, out, partial.data());
    return r;
  };
  std::vector<float> x_new = x0, w_new = w0;
  for (float& v : x_new) v = -2 * v;
  for (float& v : w_new) v = 0.5f * v + 0.25f;
  for (const bool bf16 : {true, false}) {
    CAPTURE(bf16);
    const blas::GemmPrecisionScope scope(bf16 ? GemmPrecision::bf16 : GemmPrecision::fp32);
    const Result before = plain(x0, w0), after = plain(x_new, w_new), other_w = plain(x0, w2);
    OperandKeep keep;
    std::vector<float> x = x0, w = w0, y(rows * out), y2(rows * out), dx(rows * in);
    std::vector<float> dw(in * out), partial((chunks - 1) * in * out);
    detail::linear_forward_rows<float>(y.data(), x.data(), w.data(), nullptr, rows, in, out, false,
                                       &keep);
    CHECK(y == before.y);
    // A second projection of the same x with another W (a self-attention's k after q).
    detail::linear_forward_rows<float>(y2.data(), x.data(), w2.data(), nullptr, rows, in, out,
                                       false, &keep);
    CHECK(y2 == other_w.y);
    // Against the keep's contract, x and W change before the backward: under bf16 it still reads
    // the forward's roundings (so they were kept, not rounded again); in fp32 nothing is kept.
    x = x_new, w = w_new;
    detail::linear_backward_rows<float>(dx.data(), dw.data(), nullptr, dy.data(), x.data(),
                                        w.data(), rows, in, out, partial.data(), false, false,
                                        &keep);
    CHECK(dx == (bf16 ? before.dx : after.dx));
    CHECK(dw == (bf16 ? before.dw : after.dw));
    CHECK((dx != before.dx) == !bf16);  // the two cases differ
    // After clear() the new values are read.
    keep.clear();
    detail::linear_forward_rows<float>(y.data(), x.data(), w.data(), nullptr, rows, in, out, false,
                                       &keep);
    detail::linear_backward_rows<float>(dx.data(), dw.data(), nullptr, dy.data(), x.data(),
                                        w.data(), rows, in, out, partial.data(), false, false,
                                        &keep);
    CHECK(y == after.y);
    CHECK(dx == after.dx);
    CHECK(dw == after.dw);
    // The same address read as another shape is rounded as that shape.
    const std::size_t rows2 = rows / 2, in2 = 2 * in;
    std::vector<float> y3(rows2 * out), y3_ref(rows2 * out), w3 = random_floats(in2 * out, 35);
    detail::linear_forward_rows<float>(y3.data(), x.data(), w3.data(), nullptr, rows2, in2, out,
                                       false, &keep);
    detail::linear_forward_rows<float>(y3_ref.data(), x.data(), w3.data(), nullptr, rows2, in2,
                                       out);
    CHECK(y3 == y3_ref);
  }
}

TEST_CASE("bf16 linear: db summed while dy is rounded is each column's sum in row order") {
  // dy's rounding is split over the threads at 2 threads and 4,096 rows (and its sums then take a
  // second pass), not at 1 thread or 40 rows; each way db has the bits of the plain loop.
  const std::size_t in = 8, out = 24;
  for (const int threads : {1, 2}) {
    for (const std::size_t rows : {std::size_t(40), std::size_t(4096)}) {
      CAPTURE(threads);
      CAPTURE(rows);
      const ThreadScope scope_threads(threads);
      const std::vector<float> x = random_floats(rows * in, 41), w = random_floats(in * out, 42);
      std::vector<float> dy = random_floats(rows * out, 43);
      for (std::size_t r = 0; r < rows; r += 7) dy[r * out + r % out] *= 1e4f;  // order matters
      std::vector<float> ref(out, 0.0f);
      for (std::size_t r = 0; r < rows; ++r)
        for (std::size_t c = 0; c < out; ++c) ref[c] += dy[r * out + c];
      for (const bool bf16 : {true, false}) {
        CAPTURE(bf16);
        const blas::GemmPrecisionScope scope(bf16 ? GemmPrecision::bf16 : GemmPrecision::fp32);
        std::vector<float> dx(rows * in), dw(in * out), db(out, 7.0f);
        std::vector<float> partial((detail::linear_chunks(rows) - 1) * in * out);
        detail::linear_backward_rows<float>(dx.data(), dw.data(), db.data(), dy.data(), x.data(),
                                            w.data(), rows, in, out, partial.data());
        CHECK(db == ref);
      }
      // The operand's own sums, and its rounding unchanged by them.
      blas::Bf16Operand with, without;
      std::vector<float> sums(out, 7.0f);
      with.round(dy.data(), int(rows), int(out), int(out), sums.data());
      without.round(dy.data(), int(rows), int(out), int(out));
      CHECK(sums == ref);
      std::vector<float> c1(out * out), c2(out * out);
      blas::gemm_bf16(true, false, int(out), int(out), int(rows), 1.0f, with, 0, with, 0, 0.0f,
                      c1.data(), int(out));
      blas::gemm_bf16(true, false, int(out), int(out), int(rows), 1.0f, without, 0, without, 0,
                      0.0f, c2.data(), int(out));
      CHECK(c1 == c2);
    }
  }
}
