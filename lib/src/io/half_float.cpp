// IEEE binary16 and bfloat16 from and to float (attnlab/io/safetensors.hpp): what F16 and BF16
// tensors are stored as, rounded to nearest even as PyTorch's .half() and .bfloat16().
#include <cstdint>
#include <cstring>

#include "attnlab/io/safetensors.hpp"

namespace attnlab {

namespace {
std::uint32_t bits_of(float f) {
  std::uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}
float float_of(std::uint32_t u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}
}  // namespace

// binary16 after F. Giesen's float_to_half_fast3_rtne (public domain): normals by integer rounding
// (add 0xfff plus the lowest kept bit), subnormals by adding a magic float whose exponent leaves
// exactly the 10 bits of a subnormal half to the FPU's own round-to-nearest-even.
std::uint16_t float_to_f16(float value) {
  constexpr std::uint32_t kInfinity = 255u << 23, kHalfMax = (127u + 16) << 23;
  constexpr std::uint32_t kDenormMagic = ((127u - 15) + (23 - 10) + 1) << 23;
  std::uint32_t u = bits_of(value);
  const std::uint32_t sign = u & 0x80000000u;
  u ^= sign;
  std::uint16_t out;
  if (u >= kHalfMax) {  // overflow to inf (65536 and beyond), or inf / NaN
    out = u > kInfinity ? 0x7e00 : 0x7c00;
  } else if (u < (113u << 23)) {  // below 2^-14: a subnormal half or zero
    out = static_cast<std::uint16_t>(bits_of(float_of(u) + float_of(kDenormMagic)) - kDenormMagic);
  } else {
    const std::uint32_t odd = (u >> 13) & 1u;
    u += (static_cast<std::uint32_t>(15 - 127) << 23) + 0xfffu + odd;  // rebias and round
    out = static_cast<std::uint16_t>(u >> 13);  // a carry into the exponent may give inf
  }
  return static_cast<std::uint16_t>(out | (sign >> 16));
}

float f16_to_float(std::uint16_t bits) {
  const std::uint32_t exponent = bits & 0x7c00u, mantissa = bits & 0x3ffu;
  const std::uint32_t sign = static_cast<std::uint32_t>(bits & 0x8000u) << 16;
  if (exponent == 0x7c00u) return float_of(sign | 0x7f800000u | (mantissa << 13));  // inf, NaN
  if (exponent == 0) {  // zero or subnormal: mantissa · 2^-24, exact in float
    const float magnitude = static_cast<float>(mantissa) * float_of(103u << 23);  // 2^-24
    return float_of(sign | bits_of(magnitude));
  }
  return float_of(sign | ((exponent + ((127u - 15) << 10)) << 13) | (mantissa << 13));
}

std::uint16_t float_to_bf16(float value) {
  const std::uint32_t u = bits_of(value);
  if ((u & 0x7fffffffu) > 0x7f800000u) {  // NaN: keep it a quiet NaN
    return static_cast<std::uint16_t>((u >> 16) | 0x0040u);
  }
  const std::uint32_t odd = (u >> 16) & 1u;
  return static_cast<std::uint16_t>((u + 0x7fffu + odd) >> 16);  // ties to even; may round to inf
}

float bf16_to_float(std::uint16_t bits) {
  return float_of(static_cast<std::uint32_t>(bits) << 16);
}

}  // namespace attnlab
