// Part of the CUDA emulator (attnlab/backends/cuda_emulator.hpp, which includes this file at its
// end; include that one): 16-bit floating-point storage, the warp-collective matrix operations a
// tensor-core kernel uses (mma.sync m16n8k16, ldmatrix) with the PTX ISA's per-lane fragment
// layouts, and cp.async with its commit and wait groups.
#pragma once

#if !defined(ATTNLAB_CUDA_EMULATION)
#error "include attnlab/backends/cuda_emulator.hpp, which includes this file"
#endif

namespace attnlab::emu {
// ---- 16-bit floating-point storage

// bfloat16 and IEEE binary16 values, as bits: storage only (no arithmetic), like the 16-bit
// elements of a tensor-core fragment. Conversions from float round to nearest, ties to even (as
// __float2bfloat16_rn and __float2half_rn); overflow gives ±inf, a NaN stays a quiet NaN.
struct Bf16 {
  std::uint16_t bits;
};
struct Half {
  std::uint16_t bits;
};

inline std::uint32_t float_bits(float x) {
  std::uint32_t u;
  std::memcpy(&u, &x, sizeof u);
  return u;
}
inline float bits_float(std::uint32_t u) {
  float x;
  std::memcpy(&x, &u, sizeof x);
  return x;
}

inline Bf16 to_bf16(float x) {
  std::uint32_t u = float_bits(x);
  if ((u & 0x7FFFFFFFu) > 0x7F800000u) return Bf16{static_cast<std::uint16_t>((u >> 16) | 0x40u)};
  u += 0x7FFFu + ((u >> 16) & 1u);  // a carry into the exponent rounds up (to inf past the max)
  return Bf16{static_cast<std::uint16_t>(u >> 16)};
}
inline float to_float(Bf16 x) {
  return bits_float(std::uint32_t{x.bits} << 16);
}

inline Half to_half(float x) {
  const std::uint32_t u = float_bits(x);
  const auto sign = static_cast<std::uint16_t>((u >> 16) & 0x8000u);
  const std::uint32_t a = u & 0x7FFFFFFFu;
  if (a > 0x7F800000u) return Half{static_cast<std::uint16_t>(sign | 0x7E00u)};   // NaN
  if (a >= 0x477FF000u) return Half{static_cast<std::uint16_t>(sign | 0x7C00u)};  // >= 65520: inf
  std::uint32_t h, rest, halfway;
  if (a >= 0x38800000u) {  // 2^-14 and above: a normal half; the rounding may carry into inf
    h = (a >> 13) - (112u << 10);
    rest = a & 0x1FFFu;
    halfway = 0x1000u;
  } else {                                   // a subnormal half (or 0): in units of 2^-24
    const std::uint32_t exponent = a >> 23;  // biased; below 102 the value is under 2^-25
    if (exponent < 102) return Half{sign};
    const std::uint32_t mantissa = (a & 0x7FFFFFu) | 0x800000u, shift = 126 - exponent;
    h = mantissa >> shift;
    rest = mantissa & ((1u << shift) - 1);
    halfway = 1u << (shift - 1);
  }
  if (rest > halfway || (rest == halfway && (h & 1u))) ++h;
  return Half{static_cast<std::uint16_t>(sign | h)};
}
inline float to_float(Half x) {
  const std::uint32_t sign = std::uint32_t{x.bits & 0x8000u} << 16;
  const std::uint32_t exponent = (x.bits >> 10) & 0x1Fu, mantissa = x.bits & 0x3FFu;
  if (exponent == 0x1F) return bits_float(sign | 0x7F800000u | (mantissa << 13));
  if (exponent == 0) {
    const float magnitude = static_cast<float>(mantissa) * 0x1p-24f;  // exact
    return sign != 0 ? -magnitude : magnitude;
  }
  return bits_float(sign | ((exponent + 112) << 23) | (mantissa << 13));
}

// ---- warp-collective matrix operations

// The exchange behind mma and ldmatrix: every lane of the warp deposits `count` 32-bit words,
// waits for the whole warp, calls read(lanes) (lane l's words at lanes + l * kExchangeWords) and
// waits again, so that no lane deposits its next operands before every lane has read these. A lane
// that never reaches the operation leaves the warp waiting: a deadlock the fiber scheduler reports.
template <class Read>
void warp_collective(const std::uint32_t* words, std::size_t count, Read&& read) {
  const unsigned t = threadIdx.x, warp = t / kWarp;
  if ((warp + 1) * kWarp > blockDim.x) {
    fail("a warp-collective operation (mma, ldmatrix) in a warp of fewer than 32 threads");
  }
  std::uint32_t* lanes = current_block->warp_exchange.data() + warp * kWarp * kExchangeWords;
  std::memcpy(lanes + (t % kWarp) * kExchangeWords, words, count * sizeof(std::uint32_t));
  current_block->sync_warp(warp);
  read(static_cast<const std::uint32_t*>(lanes));
  current_block->sync_warp(warp);
}

// Element i (0..7) of a lane's 16-bit fragment: register i / 2, low half for even i.
inline std::uint16_t fragment_element(const std::uint32_t* registers, unsigned i) {
  return static_cast<std::uint16_t>(registers[i / 2] >> (16 * (i % 2)));
}

// mma.sync.aligned.m16n8k16.row.col.f32.<E>.<E>.f32 d, a, b, c: D = A B + C with A 16 x 16,
// B 16 x 8, C and D 16 x 8, E = Bf16 or Half. Each lane holds the fragments of the PTX ISA
// ("Matrix Fragments for mma.m16n8k16 with floating point type"); with groupID g = lane / 4 and
// threadID_in_group t = lane % 4:
//   a: 4 registers, elements a0..a7 (two per register, the lower index in the low 16 bits):
//      ai at row g + 8 * (i / 2 % 2), column 2t + i % 2 + 8 * (i / 4);
//   b: 2 registers, b0..b3: bi at row 2t + i % 2 + 8 * (i / 2), column g;
//   c, d: 4 floats, ci at row g + 8 * (i / 2), column 2t + i % 2.
// Every lane's registers go through the warp exchange, so a value in the wrong register lands in
// the wrong place of the product, as on the hardware. Each D element is summed in fp32: C first,
// then the 16 products in order of k, each added with one rounding. The products of two 16-bit
// values are exact in fp32 (barring bf16 overflow or underflow), so a fused multiply-add gives the
// same sums. (The tensor cores' own order and internal precision are not documented; a kernel's
// results may differ from the hardware's in the last bits.) d may be c.
template <class E>
void mma_m16n8k16(float (&d)[4], const std::uint32_t (&a)[4], const std::uint32_t (&b)[2],
                  const float (&c)[4]) {
  std::uint32_t mine[kExchangeWords];
  std::memcpy(mine, a, sizeof a);
  std::memcpy(mine + 4, b, sizeof b);
  std::memcpy(mine + 6, c, sizeof c);
  const unsigned lane = threadIdx.x % kWarp;
  float out[4];
  warp_collective(mine, kExchangeWords, [&](const std::uint32_t* lanes) {
    // This lane's 4 elements of D need rows g and g + 8 of A and columns 2t and 2t + 1 of B: each
    // is read from the lane and register that hold it by the layouts above (their inverse), not
    // decoded for the whole warp in every lane.
    const auto a_at = [&](unsigned row, unsigned k) {  // a_i of lane 4 (row % 8) + k % 8 / 2
      const std::uint32_t* regs = lanes + (4 * (row % 8) + k % 8 / 2) * kExchangeWords;
      return to_float(E{fragment_element(regs, k % 2 + 2 * (row / 8) + 4 * (k / 8))});
    };
    const auto b_at = [&](unsigned k, unsigned col) {  // b_i of lane 4 col + k % 8 / 2
      const std::uint32_t* regs = lanes + (4 * col + k % 8 / 2) * kExchangeWords + 4;
      return to_float(E{fragment_element(regs, k % 2 + 2 * (k / 8))});
    };
    const unsigned g = lane / 4, t = lane % 4;
    for (unsigned i = 0; i < 4; ++i) {
      const unsigned row = g + 8 * (i / 2), col = 2 * t + i % 2;
      float sum = bits_float(lanes[lane * kExchangeWords + 6 + i]);  // c_i is this lane's own
      for (unsigned k = 0; k < 16; ++k) sum += a_at(row, k) * b_at(k, col);
      out[i] = sum;
    }
  });
  std::memcpy(d, out, sizeof out);
}

// ldmatrix.sync.aligned.m8n8.x<N>{.trans}.shared.b16 r, [row]: loads N 8 x 8 matrices of 16-bit
// elements from shared memory. Lane 8m + j gives the address of row j of matrix m (16 bytes,
// 16-byte aligned, in the block's shared memory); the addresses of lanes 8N and up are not used
// (sm_80 and later). Lane l receives in r[m] the elements (l / 4, 2 (l % 4)) and
// (l / 4, 2 (l % 4) + 1) of matrix m, the first in the low 16 bits; with .trans the elements
// (2 (l % 4), l / 4) and (2 (l % 4) + 1, l / 4), i.e. the same fragment of the transposed matrix.
template <int N, bool Trans>
void ldmatrix(std::uint32_t (&r)[N], const void* row) {
  static_assert(N == 1 || N == 2 || N == 4);
  const unsigned lane = threadIdx.x % kWarp;
  if (lane < 8 * N) {
    if (reinterpret_cast<std::uintptr_t>(row) % 16 != 0)
      fail("ldmatrix: a row address not 16-byte aligned");
    if (!inside(current_block->dynamic_shared, row, 16) &&
        !inside(current_block->static_shared, row, 16)) {
      fail("ldmatrix: a row address outside the block's shared memory");
    }
  }
  std::uint32_t mine[2];
  const auto address = reinterpret_cast<std::uintptr_t>(row);
  mine[0] = static_cast<std::uint32_t>(address);
  mine[1] = static_cast<std::uint32_t>(static_cast<std::uint64_t>(address) >> 32);
  std::uint32_t out[N];
  warp_collective(mine, 2, [&](const std::uint32_t* lanes) {
    // Element (i, j) of matrix m.
    const auto element = [&](unsigned m, unsigned i, unsigned j) {
      const std::uint32_t* words = lanes + (8 * m + i) * kExchangeWords;
      const auto p = static_cast<std::uintptr_t>(words[0] | (std::uint64_t{words[1]} << 32));
      std::uint16_t value;
      std::memcpy(&value, reinterpret_cast<const unsigned char*>(p) + 2 * j, sizeof value);
      return std::uint32_t{value};
    };
    for (unsigned m = 0; m < static_cast<unsigned>(N); ++m) {
      const unsigned i = lane / 4, j = 2 * (lane % 4);
      out[m] = Trans ? element(m, j, i) | element(m, j + 1, i) << 16
                     : element(m, i, j) | element(m, i, j + 1) << 16;
    }
  });
  std::memcpy(r, out, sizeof out);
}

// ---- cp.async

// cp.async.{ca,cg}.shared.global [dst], [src], bytes{, src_bytes}: a copy of `bytes` (4, 8 or 16)
// bytes from global to shared memory, of which the bytes past src_bytes are zero. On the hardware
// it completes at some time before the thread's cp.async.wait_group that covers its group; here
// it is performed at that wait, in issue order, and until then its destination holds 0xFF bytes,
// written when the copy is issued. So a read of the destination before the wait (by this thread,
// or by another thread before this thread's wait and a barrier) sees NaN, whatever the shared
// memory held before: on the hardware it would see the old bytes, the new ones or a mix, and a
// stale tile from an earlier iteration would look plausible. Copies never waited for are dropped
// at the end of the block, with its shared memory.
inline void cp_async(void* dst, const void* src, std::size_t bytes, std::size_t src_bytes) {
  if (bytes != 4 && bytes != 8 && bytes != 16) fail("cp.async: a size other than 4, 8 or 16 bytes");
  if (src_bytes > bytes) fail("cp.async: a source size larger than the copy");
  if (reinterpret_cast<std::uintptr_t>(dst) % bytes != 0 ||
      (src_bytes > 0 && reinterpret_cast<std::uintptr_t>(src) % bytes != 0)) {
    fail("cp.async: an address not aligned to the copy's size");
  }
  if (!inside(current_block->dynamic_shared, dst, bytes) &&
      !inside(current_block->static_shared, dst, bytes)) {
    fail("cp.async: a destination outside the block's shared memory");
  }
  std::memset(dst, 0xFF, bytes);
  async_copies().pending.push_back({static_cast<unsigned char*>(dst),
                                    static_cast<const unsigned char*>(src), bytes, src_bytes,
                                    AsyncCopy::kUncommitted});
}

// cp.async.commit_group: the thread's copies issued since its last commit become its newest group
// (possibly empty).
inline void cp_async_commit() {
  AsyncCopies& state = async_copies();
  for (AsyncCopy& copy : state.pending) {
    if (copy.group == AsyncCopy::kUncommitted) copy.group = state.committed;
  }
  ++state.committed;
}

// cp.async.wait_group n: performs the thread's copies of every committed group but the newest n.
// Copies not yet committed stay pending (cp.async.wait_all commits them first).
inline void cp_async_wait(std::size_t n) {
  AsyncCopies& state = async_copies();
  const std::size_t done = state.committed > n ? state.committed - n : 0;
  std::size_t kept = 0;
  for (const AsyncCopy& copy : state.pending) {
    if (copy.group != AsyncCopy::kUncommitted && copy.group < done) {
      if (copy.src_bytes > 0) std::memcpy(copy.dst, copy.src, copy.src_bytes);
      std::memset(copy.dst + copy.src_bytes, 0, copy.bytes - copy.src_bytes);
    } else {
      state.pending[kept++] = copy;
    }
  }
  state.pending.resize(kept);
}

}  // namespace attnlab::emu
