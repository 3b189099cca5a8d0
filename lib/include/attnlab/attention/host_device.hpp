// ATTNLAB_HOST_DEVICE marks a function that runs on the host and, compiled by nvcc, in device code
// too: the dual numbers (dual.hpp), the built-in programs (programs.hpp) and a user's score and
// mask functors for the CUDA paths (attnlab/attention/device_program.hpp). Empty for the C++
// compiler, which also compiles the CUDA kernels for the CPU emulator.
#pragma once

#if defined(__CUDACC__)
#define ATTNLAB_HOST_DEVICE __host__ __device__
#else
#define ATTNLAB_HOST_DEVICE
#endif
