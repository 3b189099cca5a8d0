// Private to lib/backends/cuda: the few spellings that differ between nvcc and the CPU emulation of
// the CUDA thread model used by tests/backends/test_cuda_emulated.cpp
// (attnlab/backends/cuda_emulator.hpp). Under nvcc they are the plain CUDA declarations.
#pragma once

#if defined(__CUDACC__)

// The kernel's dynamic shared memory (size given at launch), as bytes aligned for double.
#define ATTNLAB_DYNAMIC_SHARED(name) extern __shared__ __align__(16) unsigned char name[]
// A fixed-size shared array of the block.
#define ATTNLAB_STATIC_SHARED(type, name, count) __shared__ type name[count]

#elif !defined(ATTNLAB_CUDA_EMULATION)
#error \
    "lib/backends/cuda kernels compile under nvcc, or on the CPU with attnlab/backends/cuda_emulator.hpp"
#endif
