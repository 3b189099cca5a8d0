// ATTNLAB_HOST_DEVICE marks a function that runs on the host and, compiled by nvcc, in device code
// too: the dual numbers (dual.hpp), the built-in programs (programs.hpp) and a user's score and
// mask functors for the CUDA paths (attnlab/attention/device_program.hpp). Empty for the C++
// compiler, which also compiles the CUDA kernels for the CPU emulator.
#pragma once

// ATTNLAB_NO_EXEC_CHECK, on the line before a host-device template: nvcc then accepts its host-only
// instantiations (a score program called with the CPU's ProgramParams) calling host functions.
#if defined(__CUDACC__)
#define ATTNLAB_HOST_DEVICE __host__ __device__
#define ATTNLAB_NO_EXEC_CHECK _Pragma("nv_exec_check_disable")
#else
#define ATTNLAB_HOST_DEVICE
#define ATTNLAB_NO_EXEC_CHECK
#endif
