// The arithmetic of float GEMMs, without its name table (EnumTable<GemmPrecision> in
// attnlab/blas.hpp), so that device code compiled as C++17 by nvcc can name it.
#pragma once

namespace attnlab {

// fp32: as stored. bf16: A and B rounded to bfloat16 (to nearest, ties to even, as PyTorch's
// .bfloat16()), their products summed in fp32 into an fp32 C: the mixed precision of AMX and
// AVX512-BF16 units and of PyTorch's bf16 autocast. tf32: A and B rounded to TensorFloat-32 (8
// exponent and 10 mantissa bits, to nearest), fp32 sums: the tensor cores' fp32 mode, on a CUDA
// device only (DeviceOps::set_precision). Double GEMMs are always exact double.
enum class GemmPrecision { fp32, bf16, tf32 };

}  // namespace attnlab
