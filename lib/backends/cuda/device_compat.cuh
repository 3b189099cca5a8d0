// Private to lib/backends/cuda: the few spellings that differ between nvcc and the CPU emulation of
// the CUDA thread model (attnlab/backends/cuda_emulator.hpp) that the emulated backend and the
// kernel tests (tests/backends/test_cuda_*.cpp) run. Under nvcc they are the plain CUDA
// declarations and inline PTX; under the emulator, calls into it.
//
// The tensor-core operations (sm_80 and later), one call each on both sides:
//   attnlab_bf16, attnlab_f16               16-bit storage types (__nv_bfloat16, __half)
//   attnlab_float_to_bf16 / _f16, attnlab_bf16_to_float / attnlab_f16_to_float
//                                           conversions, to nearest, ties to even
//   attnlab_pack_bf16x2 / _f16x2(lo, hi)    two floats rounded into one 32-bit register, lo in the
//                                           low 16 bits (the lower-indexed fragment element)
//   attnlab_mma_m16n8k16_bf16 / _f16(d, a, b, c)
//                                           mma.sync.aligned.m16n8k16.row.col.f32.{bf16,f16}.f32:
//                                           D = A B + C, per-lane fragments as in the PTX ISA
//   attnlab_ldmatrix_x1 / _x2 / _x4(r, row), and _trans
//                                           ldmatrix.sync.aligned.m8n8.x{1,2,4}{.trans}.shared.b16
//   attnlab_cp_async_4 / _8 / _16(dst, src), attnlab_cp_async_16_zfill(dst, src, src_bytes)
//                                           cp.async.{ca,cg}.shared.global (zfill: the bytes past
//                                           src_bytes are zero)
//   attnlab_cp_async_commit(), attnlab_cp_async_wait<N>(), attnlab_cp_async_wait_all()
//                                           cp.async.commit_group, wait_group N, wait_all
// The fragment layouts, and how the emulator performs each, are described at its definitions
// (attnlab::emu::mma_m16n8k16, ldmatrix, cp_async).
#pragma once

#include <cstdint>

#if defined(__CUDACC__)

#include <cuda_bf16.h>
#include <cuda_fp16.h>

// The kernel's dynamic shared memory (size given at launch), as bytes aligned for double.
#define ATTNLAB_DYNAMIC_SHARED(name) extern __shared__ __align__(16) unsigned char name[]
// A fixed-size shared array of the block.
#define ATTNLAB_STATIC_SHARED(type, name, count) __shared__ type name[count]
// #pragma unroll before a loop: nvcc's, which the C++ compiler does not know (-Wunknown-pragmas).
#define ATTNLAB_UNROLL _Pragma("unroll")

using attnlab_bf16 = __nv_bfloat16;
using attnlab_f16 = __half;

__host__ __device__ __forceinline__ attnlab_bf16 attnlab_float_to_bf16(float x) {
  return __float2bfloat16_rn(x);
}
__host__ __device__ __forceinline__ float attnlab_bf16_to_float(attnlab_bf16 x) {
  return __bfloat162float(x);
}
__host__ __device__ __forceinline__ attnlab_f16 attnlab_float_to_f16(float x) {
  return __float2half_rn(x);
}
__host__ __device__ __forceinline__ float attnlab_f16_to_float(attnlab_f16 x) {
  return __half2float(x);
}
__host__ __device__ __forceinline__ std::uint32_t attnlab_pack_bf16x2(float lo, float hi) {
  return std::uint32_t{__bfloat16_as_ushort(__float2bfloat16_rn(lo))} |
         std::uint32_t{__bfloat16_as_ushort(__float2bfloat16_rn(hi))} << 16;
}
__host__ __device__ __forceinline__ std::uint32_t attnlab_pack_f16x2(float lo, float hi) {
  return std::uint32_t{__half_as_ushort(__float2half_rn(lo))} |
         std::uint32_t{__half_as_ushort(__float2half_rn(hi))} << 16;
}

__device__ __forceinline__ void attnlab_mma_m16n8k16_bf16(float (&d)[4],
                                                          const std::uint32_t (&a)[4],
                                                          const std::uint32_t (&b)[2],
                                                          const float (&c)[4]) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, "
      "{%8, %9}, {%10, %11, %12, %13};\n"
      : "=f"(d[0]), "=f"(d[1]), "=f"(d[2]), "=f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]), "f"(c[0]), "f"(c[1]),
        "f"(c[2]), "f"(c[3]));
}
__device__ __forceinline__ void attnlab_mma_m16n8k16_f16(float (&d)[4], const std::uint32_t (&a)[4],
                                                         const std::uint32_t (&b)[2],
                                                         const float (&c)[4]) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, "
      "{%8, %9}, {%10, %11, %12, %13};\n"
      : "=f"(d[0]), "=f"(d[1]), "=f"(d[2]), "=f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]), "f"(c[0]), "f"(c[1]),
        "f"(c[2]), "f"(c[3]));
}

// The .shared window address of a generic pointer into shared memory.
__device__ __forceinline__ std::uint32_t attnlab_shared_address(const void* p) {
  return static_cast<std::uint32_t>(__cvta_generic_to_shared(p));
}

// "memory": the rows were written by ordinary stores (and cp.async) before a barrier.
__device__ __forceinline__ void attnlab_ldmatrix_x1(std::uint32_t (&r)[1], const void* row) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x1.shared.b16 {%0}, [%1];\n"
               : "=r"(r[0])
               : "r"(attnlab_shared_address(row))
               : "memory");
}
__device__ __forceinline__ void attnlab_ldmatrix_x2(std::uint32_t (&r)[2], const void* row) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x2.shared.b16 {%0, %1}, [%2];\n"
               : "=r"(r[0]), "=r"(r[1])
               : "r"(attnlab_shared_address(row))
               : "memory");
}
__device__ __forceinline__ void attnlab_ldmatrix_x4(std::uint32_t (&r)[4], const void* row) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(attnlab_shared_address(row))
               : "memory");
}
__device__ __forceinline__ void attnlab_ldmatrix_x1_trans(std::uint32_t (&r)[1], const void* row) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x1.trans.shared.b16 {%0}, [%1];\n"
               : "=r"(r[0])
               : "r"(attnlab_shared_address(row))
               : "memory");
}
__device__ __forceinline__ void attnlab_ldmatrix_x2_trans(std::uint32_t (&r)[2], const void* row) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x2.trans.shared.b16 {%0, %1}, [%2];\n"
               : "=r"(r[0]), "=r"(r[1])
               : "r"(attnlab_shared_address(row))
               : "memory");
}
__device__ __forceinline__ void attnlab_ldmatrix_x4_trans(std::uint32_t (&r)[4], const void* row) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(attnlab_shared_address(row))
               : "memory");
}

__device__ __forceinline__ void attnlab_cp_async_4(void* dst, const void* src) {
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4;\n" ::"r"(attnlab_shared_address(dst)),
               "l"(__cvta_generic_to_global(src))
               : "memory");
}
__device__ __forceinline__ void attnlab_cp_async_8(void* dst, const void* src) {
  asm volatile("cp.async.ca.shared.global [%0], [%1], 8;\n" ::"r"(attnlab_shared_address(dst)),
               "l"(__cvta_generic_to_global(src))
               : "memory");
}
__device__ __forceinline__ void attnlab_cp_async_16(void* dst, const void* src) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(attnlab_shared_address(dst)),
               "l"(__cvta_generic_to_global(src))
               : "memory");
}
__device__ __forceinline__ void attnlab_cp_async_16_zfill(void* dst, const void* src,
                                                          unsigned src_bytes) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(attnlab_shared_address(dst)),
               "l"(__cvta_generic_to_global(src)), "r"(src_bytes)
               : "memory");
}
__device__ __forceinline__ void attnlab_cp_async_commit() {
  asm volatile("cp.async.commit_group;\n" ::: "memory");
}
template <int N>
__device__ __forceinline__ void attnlab_cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
}
__device__ __forceinline__ void attnlab_cp_async_wait_all() {
  asm volatile("cp.async.wait_all;\n" ::: "memory");
}

#elif defined(ATTNLAB_CUDA_EMULATION)

// ATTNLAB_DYNAMIC_SHARED and ATTNLAB_STATIC_SHARED: defined by the emulator.
#define ATTNLAB_UNROLL

using attnlab_bf16 = ::attnlab::emu::Bf16;
using attnlab_f16 = ::attnlab::emu::Half;

inline attnlab_bf16 attnlab_float_to_bf16(float x) {
  return ::attnlab::emu::to_bf16(x);
}
inline float attnlab_bf16_to_float(attnlab_bf16 x) {
  return ::attnlab::emu::to_float(x);
}
inline attnlab_f16 attnlab_float_to_f16(float x) {
  return ::attnlab::emu::to_half(x);
}
inline float attnlab_f16_to_float(attnlab_f16 x) {
  return ::attnlab::emu::to_float(x);
}
inline std::uint32_t attnlab_pack_bf16x2(float lo, float hi) {
  return std::uint32_t{attnlab_float_to_bf16(lo).bits} |
         std::uint32_t{attnlab_float_to_bf16(hi).bits} << 16;
}
inline std::uint32_t attnlab_pack_f16x2(float lo, float hi) {
  return std::uint32_t{attnlab_float_to_f16(lo).bits} | std::uint32_t{attnlab_float_to_f16(hi).bits}
                                                            << 16;
}

inline void attnlab_mma_m16n8k16_bf16(float (&d)[4], const std::uint32_t (&a)[4],
                                      const std::uint32_t (&b)[2], const float (&c)[4]) {
  ::attnlab::emu::mma_m16n8k16< ::attnlab::emu::Bf16>(d, a, b, c);
}
inline void attnlab_mma_m16n8k16_f16(float (&d)[4], const std::uint32_t (&a)[4],
                                     const std::uint32_t (&b)[2], const float (&c)[4]) {
  ::attnlab::emu::mma_m16n8k16< ::attnlab::emu::Half>(d, a, b, c);
}

inline void attnlab_ldmatrix_x1(std::uint32_t (&r)[1], const void* row) {
  ::attnlab::emu::ldmatrix<1, false>(r, row);
}
inline void attnlab_ldmatrix_x2(std::uint32_t (&r)[2], const void* row) {
  ::attnlab::emu::ldmatrix<2, false>(r, row);
}
inline void attnlab_ldmatrix_x4(std::uint32_t (&r)[4], const void* row) {
  ::attnlab::emu::ldmatrix<4, false>(r, row);
}
inline void attnlab_ldmatrix_x1_trans(std::uint32_t (&r)[1], const void* row) {
  ::attnlab::emu::ldmatrix<1, true>(r, row);
}
inline void attnlab_ldmatrix_x2_trans(std::uint32_t (&r)[2], const void* row) {
  ::attnlab::emu::ldmatrix<2, true>(r, row);
}
inline void attnlab_ldmatrix_x4_trans(std::uint32_t (&r)[4], const void* row) {
  ::attnlab::emu::ldmatrix<4, true>(r, row);
}

inline void attnlab_cp_async_4(void* dst, const void* src) {
  ::attnlab::emu::cp_async(dst, src, 4, 4);
}
inline void attnlab_cp_async_8(void* dst, const void* src) {
  ::attnlab::emu::cp_async(dst, src, 8, 8);
}
inline void attnlab_cp_async_16(void* dst, const void* src) {
  ::attnlab::emu::cp_async(dst, src, 16, 16);
}
inline void attnlab_cp_async_16_zfill(void* dst, const void* src, unsigned src_bytes) {
  ::attnlab::emu::cp_async(dst, src, 16, src_bytes);
}
inline void attnlab_cp_async_commit() {
  ::attnlab::emu::cp_async_commit();
}
template <int N>
void attnlab_cp_async_wait() {
  static_assert(N >= 0);
  ::attnlab::emu::cp_async_wait(N);
}
inline void attnlab_cp_async_wait_all() {
  ::attnlab::emu::cp_async_commit();
  ::attnlab::emu::cp_async_wait(0);
}

#else
#error \
    "lib/backends/cuda kernels compile under nvcc, or on the CPU with attnlab/backends/cuda_emulator.hpp"
#endif
