// The GPU tests' attention programs, compiled by nvcc as a user's program is (cuda_programs.cu
// includes attention_program_kernels.cuh): the launchers of test::CappedRelative, alone and with
// test::DocumentIds over ids in device memory. Only in a build with the CUDA backend, where
// tests/CMakeLists.txt defines ATTNLAB_TEST_GPU_PROGRAMS.
#pragma once

#include <cstdint>

#include "attnlab/attention/device_program.hpp"

namespace attnlab::test {

cuda::DevicePrograms gpu_capped_relative();
cuda::DevicePrograms gpu_capped_relative_documents(const std::int32_t* device_ids);

}  // namespace attnlab::test
