// The emulator's tensor-core operations (attnlab/backends/cuda_emulator.hpp, spelled as in
// lib/backends/cuda/device_compat.cuh): mma.sync m16n8k16 (bf16 and f16), ldmatrix (x1, x2, x4,
// with and without .trans), cp.async with its commit groups, and the 16-bit conversions. The
// expected values come from the PTX ISA's fragment layouts written out here, element by element,
// and from plain matrix products in double; a kernel that puts a value in the wrong register must
// get the wrong answer.
#include <doctest/doctest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

// clang-format off
#include "attnlab/backends/cuda_emulator.hpp"
#include "device_compat.cuh"
// clang-format on

namespace emu = attnlab::emu;

namespace {

constexpr unsigned kLanes = 32;

// ---- the PTX ISA's fragment layouts for mma.m16n8k16 (16-bit A and B, f32 C and D) -------------
// groupID g = lane / 4, threadID_in_group t = lane % 4; element i of a fragment sits in register
// i / 2, the even one in the low 16 bits.
struct At {
  unsigned row, col;
};
At a_element(unsigned lane, unsigned i) {  // a0..a7
  const unsigned g = lane / 4, t = lane % 4;
  return {(i < 2 || (i >= 4 && i < 6)) ? g : g + 8, i < 4 ? t * 2 + (i & 1) : t * 2 + (i & 1) + 8};
}
At b_element(unsigned lane, unsigned i) {  // b0..b3
  const unsigned g = lane / 4, t = lane % 4;
  return {i < 2 ? t * 2 + (i & 1) : t * 2 + (i & 1) + 8, g};
}
At c_element(unsigned lane, unsigned i) {  // c0..c3, d0..d3
  const unsigned g = lane / 4, t = lane % 4;
  return {i < 2 ? g : g + 8, t * 2 + (i & 1)};
}

std::uint16_t bits16(float x, bool bf16) {
  return bf16 ? emu::to_bf16(x).bits : emu::to_half(x).bits;
}
float value16(std::uint16_t bits, bool bf16) {
  return bf16 ? emu::to_float(emu::Bf16{bits}) : emu::to_float(emu::Half{bits});
}

// Random 16-bit matrices (values in [-2, 2], as bits) and a float C, for `warps` warps.
struct MmaProblem {
  bool bf16;
  unsigned warps;
  std::vector<std::uint16_t> a, b;  // per warp: A 16 x 16, B 16 x 8, row-major
  std::vector<float> c;             // per warp: 16 x 8
  double a_at(unsigned w, unsigned r, unsigned k) const {
    return value16(a[w * 256 + r * 16 + k], bf16);
  }
  double b_at(unsigned w, unsigned k, unsigned n) const {
    return value16(b[w * 128 + k * 8 + n], bf16);
  }
};

MmaProblem random_problem(bool bf16, unsigned warps, unsigned seed) {
  std::mt19937 gen(seed);
  std::uniform_real_distribution<float> u(-2.0f, 2.0f);
  MmaProblem p{bf16, warps, std::vector<std::uint16_t>(warps * 256),
               std::vector<std::uint16_t>(warps * 128), std::vector<float>(warps * 128)};
  for (auto& x : p.a) x = bits16(u(gen), bf16);
  for (auto& x : p.b) x = bits16(u(gen), bf16);
  for (auto& x : p.c) x = u(gen);
  return p;
}

// Each lane's registers as the PTX ISA lays them out; `swap_a` / `swap_b` exchange two registers,
// as a kernel with a wrong layout would.
struct LaneRegisters {
  std::vector<std::uint32_t> a, b;  // 4 and 2 per thread
  std::vector<float> c;             // 4 per thread
};
LaneRegisters pack(const MmaProblem& p, bool swap_a = false, bool swap_b = false) {
  const unsigned threads = p.warps * kLanes;
  LaneRegisters r{std::vector<std::uint32_t>(4 * threads, 0),
                  std::vector<std::uint32_t>(2 * threads, 0), std::vector<float>(4 * threads)};
  for (unsigned thread = 0; thread < threads; ++thread) {
    const unsigned w = thread / kLanes, lane = thread % kLanes;
    for (unsigned i = 0; i < 8; ++i) {
      const At e = a_element(lane, i);
      r.a[4 * thread + i / 2] |= std::uint32_t{p.a[w * 256 + e.row * 16 + e.col]} << (16 * (i % 2));
    }
    for (unsigned i = 0; i < 4; ++i) {
      const At e = b_element(lane, i);
      r.b[2 * thread + i / 2] |= std::uint32_t{p.b[w * 128 + e.row * 8 + e.col]} << (16 * (i % 2));
      const At f = c_element(lane, i);
      r.c[4 * thread + i] = p.c[w * 128 + f.row * 8 + f.col];
    }
    if (swap_a) std::swap(r.a[4 * thread + 1], r.a[4 * thread + 2]);
    if (swap_b) std::swap(r.b[2 * thread], r.b[2 * thread + 1]);
  }
  return r;
}

// d = A B + C, and again in place (d2 = A B + d2 with d2 = C first): the same bits.
template <bool Bf16>
__global__ void mma_kernel(const std::uint32_t* a, const std::uint32_t* b, const float* c, float* d,
                           float* d_in_place) {
  const unsigned t = threadIdx.x;
  const std::uint32_t ra[4] = {a[4 * t], a[4 * t + 1], a[4 * t + 2], a[4 * t + 3]};
  const std::uint32_t rb[2] = {b[2 * t], b[2 * t + 1]};
  const float rc[4] = {c[4 * t], c[4 * t + 1], c[4 * t + 2], c[4 * t + 3]};
  float rd[4], acc[4] = {rc[0], rc[1], rc[2], rc[3]};
  if constexpr (Bf16) {
    attnlab_mma_m16n8k16_bf16(rd, ra, rb, rc);
    attnlab_mma_m16n8k16_bf16(acc, ra, rb, acc);
  } else {
    attnlab_mma_m16n8k16_f16(rd, ra, rb, rc);
    attnlab_mma_m16n8k16_f16(acc, ra, rb, acc);
  }
  for (unsigned i = 0; i < 4; ++i) {
    d[4 * t + i] = rd[i];
    d_in_place[4 * t + i] = acc[i];
  }
}

struct MmaResult {
  std::vector<float> d, d_in_place;
};
MmaResult run_mma(const MmaProblem& p, const LaneRegisters& r) {
  const unsigned threads = p.warps * kLanes;
  MmaResult out{std::vector<float>(4 * threads, std::numeric_limits<float>::quiet_NaN()),
                std::vector<float>(4 * threads, std::numeric_limits<float>::quiet_NaN())};
  if (p.bf16) {
    emu::launch(mma_kernel<true>, dim3(1), dim3(threads), 0, r.a.data(), r.b.data(), r.c.data(),
                out.d.data(), out.d_in_place.data());
  } else {
    emu::launch(mma_kernel<false>, dim3(1), dim3(threads), 0, r.a.data(), r.b.data(), r.c.data(),
                out.d.data(), out.d_in_place.data());
  }
  return out;
}

// D's element (row, col) of warp w: in double, and in the emulator's stated order (fp32, C first,
// then k = 0..15).
double exact_d(const MmaProblem& p, unsigned w, unsigned row, unsigned col) {
  double sum = p.c[w * 128 + row * 8 + col];
  for (unsigned k = 0; k < 16; ++k) sum += p.a_at(w, row, k) * p.b_at(w, k, col);
  return sum;
}
float ordered_d(const MmaProblem& p, unsigned w, unsigned row, unsigned col) {
  float sum = p.c[w * 128 + row * 8 + col];
  for (unsigned k = 0; k < 16; ++k) {
    sum += static_cast<float>(p.a_at(w, row, k)) * static_cast<float>(p.b_at(w, k, col));
  }
  return sum;
}

// The largest |d - exact| over every lane's four output registers.
double max_error(const MmaProblem& p, const std::vector<float>& d) {
  double worst = 0;
  for (unsigned thread = 0; thread < p.warps * kLanes; ++thread) {
    for (unsigned i = 0; i < 4; ++i) {
      const At e = c_element(thread % kLanes, i);
      worst =
          std::max(worst, std::fabs(d[4 * thread + i] - exact_d(p, thread / kLanes, e.row, e.col)));
    }
  }
  return worst;
}

void check_mma(bool bf16) {
  // Two warps with different matrices: each warp's exchange is its own.
  for (unsigned seed : {1u, 2u, 3u}) {
    CAPTURE(seed);
    const MmaProblem p = random_problem(bf16, 2, seed);
    const MmaResult r = run_mma(p, pack(p));
    // Every lane's four output registers: within fp32 rounding of the exact product (|C| + the
    // sum of |A||B| is at most 66, so 16 roundings stay far below 1e-4), equal bit for bit to
    // the stated sum order, and the same when d is c.
    unsigned far = 0, not_ordered = 0, in_place_differs = 0;
    for (unsigned thread = 0; thread < 2 * kLanes; ++thread) {
      const unsigned w = thread / kLanes, lane = thread % kLanes;
      for (unsigned i = 0; i < 4; ++i) {
        const At e = c_element(lane, i);
        const float d = r.d[4 * thread + i];
        if (!(std::fabs(d - exact_d(p, w, e.row, e.col)) < 1e-4)) ++far;
        if (emu::float_bits(d) != emu::float_bits(ordered_d(p, w, e.row, e.col))) ++not_ordered;
        if (emu::float_bits(d) != emu::float_bits(r.d_in_place[4 * thread + i])) ++in_place_differs;
      }
    }
    CHECK(far == 0);
    CHECK(not_ordered == 0);
    CHECK(in_place_differs == 0);
  }
}

}  // namespace

TEST_CASE("cuda emulator: bf16 and fp16 conversions round to nearest even") {
  // bf16: against the nearer of the two bf16 neighbours, computed in double (ties: even).
  const auto bf16_reference = [](float x) -> std::uint16_t {
    const std::uint32_t u = emu::float_bits(x);
    const std::uint32_t down = u & 0xFFFF0000u, up = down + 0x10000u;
    const auto value = [](std::uint32_t bits) {
      if ((bits & 0x7FFFFFFFu) == 0x7F800000u)
        return std::copysign(std::ldexp(1.0, 128), double(emu::bits_float(bits)));
      return double(emu::bits_float(bits));
    };
    const double dd = std::fabs(double(x) - value(down)), du = std::fabs(double(x) - value(up));
    const bool take_up = du < dd || (du == dd && ((down >> 16) & 1u));
    return static_cast<std::uint16_t>((take_up ? up : down) >> 16);
  };
  // fp16: scaled to units of the half ulp at x's binade and rounded in double (ties: even).
  const auto half_reference = [](float x) -> double {
    const double a = std::fabs(double(x));
    if (a >= 65520.0) return std::copysign(std::numeric_limits<double>::infinity(), double(x));
    const int e = a < 0x1p-14 ? -14 : std::ilogb(a);
    const double ulp = std::ldexp(1.0, e - 10), q = a / ulp, f = std::floor(q);
    const double r = (q - f > 0.5 || (q - f == 0.5 && std::fmod(f, 2.0) != 0)) ? f + 1 : f;
    return std::copysign(r * ulp, double(x));
  };
  std::mt19937 gen(7);
  std::vector<float> xs = {0.0f,
                           -0.0f,
                           1.0f,
                           -1.5f,
                           65504.0f,
                           65519.99f,
                           65520.0f,
                           -70000.0f,
                           0x1p-24f,
                           0x1p-25f,
                           0x1.8p-25f,
                           0x1p-26f,
                           0x1p-14f,
                           0x1.ff8p-15f,
                           3.0e38f,
                           -std::numeric_limits<float>::max(),
                           std::numeric_limits<float>::infinity(),
                           std::numeric_limits<float>::denorm_min()};
  for (std::uint32_t m : {0x7FFFu, 0x8000u, 0x8001u, 0x18000u, 0x1000u, 0x3000u}) {
    xs.push_back(emu::bits_float(0x3F800000u | m));  // ties and near-ties of both formats at 1
    xs.push_back(emu::bits_float(0x7F7F0000u | m));  // near the bf16 overflow
  }
  for (int i = 0; i < 200000; ++i) {
    const float x = emu::bits_float(static_cast<std::uint32_t>(gen()));
    if (!std::isnan(x)) xs.push_back(x);
  }
  std::uniform_real_distribution<float> small(-70000.0f, 70000.0f);
  for (int i = 0; i < 100000; ++i) xs.push_back(small(gen) * (i % 2 ? 1.0f : 0x1p-20f));
  unsigned bf16_wrong = 0, half_wrong = 0;
  for (float x : xs) {
    if (emu::to_bf16(x).bits != bf16_reference(x)) ++bf16_wrong;
    const float h = emu::to_float(emu::to_half(x));
    if (double(h) != half_reference(x) || std::signbit(h) != std::signbit(x)) ++half_wrong;
#if defined(__FLT16_MAX__)
    // And against the compiler's own conversion, where it has one.
    const float compiler = static_cast<float>(static_cast<_Float16>(x));
    if (emu::float_bits(h) != emu::float_bits(compiler)) ++half_wrong;
#endif
  }
  CHECK(bf16_wrong == 0);
  CHECK(half_wrong == 0);
  // Every fp16 value converts to float and back unchanged; NaNs stay NaNs.
  for (std::uint32_t bits = 0; bits < 0x10000u; ++bits) {
    const float x = emu::to_float(emu::Half{static_cast<std::uint16_t>(bits)});
    if (std::isnan(x)) {
      CHECK(std::isnan(emu::to_float(emu::to_half(x))));
    } else if (emu::to_half(x).bits != bits) {
      CHECK(emu::to_half(x).bits == bits);
    }
  }
  CHECK(std::isnan(emu::to_float(emu::to_bf16(std::numeric_limits<float>::quiet_NaN()))));
  CHECK(std::isnan(emu::to_float(emu::to_bf16(emu::bits_float(0x7F800001u)))));  // signalling
  CHECK(emu::to_bf16(1.0f).bits == 0x3F80);
  CHECK(emu::to_half(1.0f).bits == 0x3C00);
  CHECK(attnlab_pack_bf16x2(1.0f, -2.0f) == 0xC0003F80u);  // lo in the low half
  CHECK(attnlab_pack_f16x2(1.0f, -2.0f) == 0xC0003C00u);
}

TEST_CASE("cuda emulator: mma m16n8k16 bf16 matches the matrix product in every lane") {
  check_mma(true);
}

TEST_CASE("cuda emulator: mma m16n8k16 f16 matches the matrix product in every lane") {
  check_mma(false);
}

TEST_CASE("cuda emulator: mma with a swapped register layout gives a wrong product") {
  for (bool bf16 : {true, false}) {
    CAPTURE(bf16);
    const MmaProblem p = random_problem(bf16, 1, 11);
    CHECK(max_error(p, run_mma(p, pack(p)).d) < 1e-4);  // the right layout, for contrast
    // A's registers 1 and 2 swapped: rows 8..15 of columns 0..7 taken for columns 8..15 of rows
    // 0..7. B's two registers swapped: k = 8..15 taken for k = 0..7.
    CHECK(max_error(p, run_mma(p, pack(p, true, false)).d) > 0.5);
    CHECK(max_error(p, run_mma(p, pack(p, false, true)).d) > 0.5);
  }
}

namespace {

// ---- ldmatrix -----------------------------------------------------------------------------------

// Each warp's shared rows: matrix m's row j lies at slot (8m + j) * 5 % 32 (a permutation), with a
// stride of 24 elements (48 bytes), so rows are neither in order nor adjacent.
constexpr unsigned kRowStride = 24, kWarpElements = 32 * kRowStride;
unsigned row_slot(unsigned m, unsigned j) {
  return (8 * m + j) * 5 % 32;
}

// Copies the image into shared memory, then each lane loads N matrices; lanes 8N and up give a
// null address, which ldmatrix must not use.
template <int N, bool Trans>
__global__ void ldmatrix_kernel(const std::uint16_t* image, std::uint32_t* out) {
  ATTNLAB_STATIC_SHARED(std::uint16_t, rows, 2 * kWarpElements);
  for (unsigned i = threadIdx.x; i < 2 * kWarpElements; i += blockDim.x) rows[i] = image[i];
  __syncthreads();
  const unsigned warp = threadIdx.x / kLanes, lane = threadIdx.x % kLanes;
  const std::uint16_t* row =
      lane < 8 * N ? rows + warp * kWarpElements + row_slot(lane / 8, lane % 8) * kRowStride
                   : nullptr;
  std::uint32_t r[N];
  if constexpr (N == 1) Trans ? attnlab_ldmatrix_x1_trans(r, row) : attnlab_ldmatrix_x1(r, row);
  if constexpr (N == 2) Trans ? attnlab_ldmatrix_x2_trans(r, row) : attnlab_ldmatrix_x2(r, row);
  if constexpr (N == 4) Trans ? attnlab_ldmatrix_x4_trans(r, row) : attnlab_ldmatrix_x4(r, row);
  for (int m = 0; m < N; ++m) out[threadIdx.x * N + m] = r[m];
}

template <int N, bool Trans>
void check_ldmatrix() {
  CAPTURE(N);
  CAPTURE(Trans);
  std::mt19937 gen(N + 10 * Trans);
  std::vector<std::uint16_t> image(2 * kWarpElements);
  for (auto& x : image) x = static_cast<std::uint16_t>(gen());
  std::vector<std::uint32_t> out(2 * kLanes * N, 0xDEADBEEFu);
  emu::launch(ldmatrix_kernel<N, Trans>, dim3(1), dim3(2 * kLanes), 0, image.data(), out.data());
  // Element (i, j) of matrix m of warp w.
  const auto at = [&](unsigned w, unsigned m, unsigned i, unsigned j) {
    return std::uint32_t{image[w * kWarpElements + row_slot(m, i) * kRowStride + j]};
  };
  unsigned wrong = 0;
  for (unsigned thread = 0; thread < 2 * kLanes; ++thread) {
    const unsigned w = thread / kLanes, t = thread % kLanes;
    for (unsigned m = 0; m < static_cast<unsigned>(N); ++m) {
      // Thread t: row t / 4, elements 2 (t % 4) and 2 (t % 4) + 1; .trans: of the transpose.
      const std::uint32_t expected =
          Trans ? at(w, m, 2 * (t % 4), t / 4) | at(w, m, 2 * (t % 4) + 1, t / 4) << 16
                : at(w, m, t / 4, 2 * (t % 4)) | at(w, m, t / 4, 2 * (t % 4) + 1) << 16;
      if (out[thread * N + m] != expected) ++wrong;
    }
  }
  CHECK(wrong == 0);
}

// ---- a warp's tile product: cp.async to shared memory, ldmatrix, mma --------------------------

// A 16 x 16 (row-major), B 16 x 8 given twice: as Bt (8 x 16, row-major: B's columns, like K in
// Q Kᵀ) and as B itself (16 x 8, row-major, like V in P V). Shared rows are padded to 24 elements.
// D = A B from Bt through ldmatrix.x2, and from B through ldmatrix.x2.trans.
__global__ void tile_product_kernel(const attnlab_bf16* a, const attnlab_bf16* bt,
                                    const attnlab_bf16* b, float* d_from_bt, float* d_from_b) {
  ATTNLAB_STATIC_SHARED(attnlab_bf16, a_s, 16 * kRowStride);
  ATTNLAB_STATIC_SHARED(attnlab_bf16, bt_s, 8 * kRowStride);
  ATTNLAB_STATIC_SHARED(attnlab_bf16, b_s, 16 * kRowStride);
  const unsigned lane = threadIdx.x;
  // 16-byte chunks: A has 32 (one per lane), Bt 16, B 16.
  attnlab_cp_async_16(a_s + (lane / 2) * kRowStride + (lane % 2) * 8, a + lane * 8);
  if (lane < 16) {
    attnlab_cp_async_16(bt_s + (lane / 2) * kRowStride + (lane % 2) * 8, bt + lane * 8);
    attnlab_cp_async_16(b_s + lane * kRowStride, b + lane * 8);
  }
  attnlab_cp_async_commit();
  attnlab_cp_async_wait<0>();
  __syncthreads();
  // A: matrices (rows 0-7, cols 0-7), (8-15, 0-7), (0-7, 8-15), (8-15, 8-15) = registers a0..a3.
  std::uint32_t ra[4], rb[2], rb_trans[2];
  attnlab_ldmatrix_x4(ra, a_s + (lane % 16) * kRowStride + (lane / 16) * 8);
  // Bt: matrices (n 0-7, k 0-7), (n 0-7, k 8-15); lanes 16-31's addresses unused.
  attnlab_ldmatrix_x2(rb, bt_s + (lane % 8) * kRowStride + (lane / 8 % 2) * 8);
  // B: matrices (k 0-7), (k 8-15), transposed.
  attnlab_ldmatrix_x2_trans(rb_trans, b_s + (lane % 16) * kRowStride);
  float zero[4] = {0, 0, 0, 0}, d1[4], d2[4];
  attnlab_mma_m16n8k16_bf16(d1, ra, rb, zero);
  attnlab_mma_m16n8k16_bf16(d2, ra, rb_trans, zero);
  const unsigned g = lane / 4, t = lane % 4;
  for (unsigned i = 0; i < 4; ++i) {
    const unsigned row = g + 8 * (i / 2), col = 2 * t + i % 2;
    d_from_bt[row * 8 + col] = d1[i];
    d_from_b[row * 8 + col] = d2[i];
  }
}

// ---- cp.async
// ------------------------------------------------------------------------------------

constexpr unsigned kCopyThreads = 64;

// Each thread copies 4 + 4, 8 and 16 bytes and a 16-byte chunk of which only 4 come from the source
// (zfill), waits, and reads them back; then reads a neighbour's 16 bytes after a barrier.
__global__ void cp_async_visible_kernel(const float* src, float* out) {
  ATTNLAB_STATIC_SHARED(float, s, kCopyThreads * 12);
  const unsigned t = threadIdx.x;
  float* mine = s + t * 12;
  const float* from = src + t * 12;
  attnlab_cp_async_4(mine, from);
  attnlab_cp_async_4(mine + 1, from + 1);
  attnlab_cp_async_8(mine + 2, from + 2);
  attnlab_cp_async_16(mine + 4, from + 4);
  attnlab_cp_async_16_zfill(mine + 8, from + 8, 4);
  attnlab_cp_async_commit();
  attnlab_cp_async_wait<0>();
  for (unsigned i = 0; i < 12; ++i) out[t * 16 + i] = mine[i];
  __syncthreads();
  const float* other = s + (t + 1) % kCopyThreads * 12 + 4;
  for (unsigned i = 0; i < 4; ++i) out[t * 16 + 12 + i] = other[i];
}

// Group 0: x; group 1: y; then z issued without a commit. Snapshots of the three 16-byte
// destinations after wait_group 1, wait_group 0 and wait_all.
__global__ void cp_async_groups_kernel(const float* src, float* out) {
  ATTNLAB_STATIC_SHARED(float, s, kCopyThreads * 12);
  const unsigned t = threadIdx.x;
  float* x = s + t * 12;
  const auto snapshot = [&](unsigned k) {
    for (unsigned i = 0; i < 12; ++i) out[(t * 3 + k) * 12 + i] = x[i];
  };
  attnlab_cp_async_16(x, src + t * 12);
  attnlab_cp_async_commit();
  attnlab_cp_async_16(x + 4, src + t * 12 + 4);
  attnlab_cp_async_commit();
  attnlab_cp_async_wait<1>();
  snapshot(0);  // x arrived, y pending
  attnlab_cp_async_16(x + 8, src + t * 12 + 8);
  attnlab_cp_async_wait<0>();
  snapshot(1);  // x and y arrived; z, never committed, pending
  attnlab_cp_async_wait_all();
  snapshot(2);  // all three
}

// The destination holds 1.0f (written and synchronised) when the copy is issued; the thread reads
// it before and after the wait.
__global__ void cp_async_early_read_kernel(const float* src, float* out) {
  ATTNLAB_STATIC_SHARED(float, s, kCopyThreads * 4);
  const unsigned t = threadIdx.x;
  for (unsigned i = 0; i < 4; ++i) s[t * 4 + i] = 1.0f;
  __syncthreads();
  attnlab_cp_async_16(s + t * 4, src + t * 4);
  attnlab_cp_async_commit();
  for (unsigned i = 0; i < 4; ++i) out[t * 8 + i] = s[t * 4 + i];  // a race on the hardware
  attnlab_cp_async_wait<0>();
  for (unsigned i = 0; i < 4; ++i) out[t * 8 + 4 + i] = s[t * 4 + i];
}

std::vector<float> iota_floats(std::size_t n) {
  std::vector<float> v(n);
  for (std::size_t i = 0; i < n; ++i) v[i] = 0.5f + static_cast<float>(i);
  return v;
}

bool poisoned(float x) {
  return emu::float_bits(x) == 0xFFFFFFFFu;
}

}  // namespace

TEST_CASE("cuda emulator: ldmatrix x1, x2 and x4 give the PTX fragment layout") {
  check_ldmatrix<1, false>();
  check_ldmatrix<2, false>();
  check_ldmatrix<4, false>();
}

TEST_CASE("cuda emulator: ldmatrix trans x1, x2 and x4 give the transposed fragment layout") {
  check_ldmatrix<1, true>();
  check_ldmatrix<2, true>();
  check_ldmatrix<4, true>();
}

TEST_CASE("cuda emulator: warp tile product through cp.async, ldmatrix and mma") {
  std::mt19937 gen(5);
  std::uniform_real_distribution<float> u(-2.0f, 2.0f);
  std::vector<attnlab_bf16> a(16 * 16), bt(8 * 16), b(16 * 8);
  for (auto& x : a) x = attnlab_float_to_bf16(u(gen));
  for (unsigned k = 0; k < 16; ++k) {
    for (unsigned n = 0; n < 8; ++n) bt[n * 16 + k] = b[k * 8 + n] = attnlab_float_to_bf16(u(gen));
  }
  std::vector<float> d_from_bt(16 * 8, std::numeric_limits<float>::quiet_NaN()),
      d_from_b = d_from_bt;
  emu::launch(tile_product_kernel, dim3(1), dim3(kLanes), 0,
              static_cast<const attnlab_bf16*>(a.data()),
              static_cast<const attnlab_bf16*>(bt.data()),
              static_cast<const attnlab_bf16*>(b.data()), d_from_bt.data(), d_from_b.data());
  unsigned far = 0, differ = 0;
  for (unsigned i = 0; i < 16; ++i) {
    for (unsigned n = 0; n < 8; ++n) {
      double exact = 0;
      for (unsigned k = 0; k < 16; ++k) {
        exact += double(attnlab_bf16_to_float(a[i * 16 + k])) * attnlab_bf16_to_float(b[k * 8 + n]);
      }
      if (!(std::fabs(d_from_bt[i * 8 + n] - exact) < 1e-4)) ++far;
      if (emu::float_bits(d_from_bt[i * 8 + n]) != emu::float_bits(d_from_b[i * 8 + n])) ++differ;
    }
  }
  CHECK(far == 0);
  CHECK(differ == 0);
}

TEST_CASE("cuda emulator: cp.async data is visible after wait_group") {
  const std::vector<float> src = iota_floats(kCopyThreads * 12);
  std::vector<float> out(kCopyThreads * 16, std::numeric_limits<float>::quiet_NaN());
  emu::launch(cp_async_visible_kernel, dim3(1), dim3(kCopyThreads), 0, src.data(), out.data());
  unsigned wrong = 0;
  for (unsigned t = 0; t < kCopyThreads; ++t) {
    for (unsigned i = 0; i < 9; ++i) wrong += out[t * 16 + i] != src[t * 12 + i];
    for (unsigned i = 9; i < 12; ++i) wrong += out[t * 16 + i] != 0.0f;  // zfill
    const unsigned next = (t + 1) % kCopyThreads;
    for (unsigned i = 0; i < 4; ++i) wrong += out[t * 16 + 12 + i] != src[next * 12 + 4 + i];
  }
  CHECK(wrong == 0);
}

TEST_CASE("cuda emulator: cp.async wait_group 1 leaves the newest group pending") {
  const std::vector<float> src = iota_floats(kCopyThreads * 12);
  std::vector<float> out(kCopyThreads * 36, 0.0f);
  emu::launch(cp_async_groups_kernel, dim3(1), dim3(kCopyThreads), 0, src.data(), out.data());
  unsigned wrong = 0;
  for (unsigned t = 0; t < kCopyThreads; ++t) {
    const auto arrived = [&](unsigned snapshot, unsigned part) {
      bool all = true;
      for (unsigned i = 0; i < 4; ++i) {
        all = all && out[(t * 3 + snapshot) * 12 + part * 4 + i] == src[t * 12 + part * 4 + i];
      }
      return all;
    };
    const auto pending = [&](unsigned snapshot, unsigned part) {
      bool all = true;
      for (unsigned i = 0; i < 4; ++i)
        all = all && poisoned(out[(t * 3 + snapshot) * 12 + part * 4 + i]);
      return all;
    };
    wrong += !(arrived(0, 0) && pending(0, 1));
    wrong += !(arrived(1, 0) && arrived(1, 1) && pending(1, 2));
    wrong += !(arrived(2, 0) && arrived(2, 1) && arrived(2, 2));
  }
  CHECK(wrong == 0);
}

TEST_CASE("cuda emulator: cp.async destination reads as poisoned bytes before the wait") {
  const std::vector<float> src = iota_floats(kCopyThreads * 4);
  std::vector<float> out(kCopyThreads * 8, 0.0f);
  emu::launch(cp_async_early_read_kernel, dim3(1), dim3(kCopyThreads), 0, src.data(), out.data());
  unsigned wrong = 0;
  for (unsigned t = 0; t < kCopyThreads; ++t) {
    for (unsigned i = 0; i < 4; ++i) {
      wrong += !poisoned(out[t * 8 + i]);  // neither the old 1.0f nor the new value: NaN
      wrong += out[t * 8 + 4 + i] != src[t * 4 + i];
    }
  }
  CHECK(wrong == 0);
}
