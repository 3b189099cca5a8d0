// Private to lib/backends/cuda: error checking of CUDA and cuBLAS calls, and the process's cuBLAS
// handle.
#pragma once

#include <cublas_v2.h>
#include <cuda_runtime.h>

#include "attnlab/cuda.hpp"

namespace attnlab::cuda::detail {

// Throw CudaError "file:line: call failed: <error string>".
[[noreturn]] void throw_cuda_error(const char* file, int line, const char* call, cudaError_t error);
[[noreturn]] void throw_cublas_error(const char* file, int line, const char* call,
                                     cublasStatus_t status);

// The process-wide cuBLAS handle on the default stream, created once on first use and never
// changed by anyone but gemm_strided_batched (runtime.cpp), which sets its math mode and calls it
// under one lock.
cublasHandle_t cublas_handle();

}  // namespace attnlab::cuda::detail

#define ATTNLAB_CUDA_CHECK(call)                                                            \
  do {                                                                                      \
    const cudaError_t attnlab_error_ = (call);                                              \
    if (attnlab_error_ != cudaSuccess) {                                                    \
      ::attnlab::cuda::detail::throw_cuda_error(__FILE__, __LINE__, #call, attnlab_error_); \
    }                                                                                       \
  } while (0)

#define ATTNLAB_CUBLAS_CHECK(call)                                                             \
  do {                                                                                         \
    const cublasStatus_t attnlab_status_ = (call);                                             \
    if (attnlab_status_ != CUBLAS_STATUS_SUCCESS) {                                            \
      ::attnlab::cuda::detail::throw_cublas_error(__FILE__, __LINE__, #call, attnlab_status_); \
    }                                                                                          \
  } while (0)

// After a kernel launch: a bad configuration surfaces here, with the launch's file and line.
#define ATTNLAB_CUDA_CHECK_LAUNCH() ATTNLAB_CUDA_CHECK(cudaGetLastError())
