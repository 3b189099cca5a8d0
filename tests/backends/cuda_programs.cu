// The GPU tests' attention programs (gpu_programs.hpp), compiled by nvcc.
#include "gpu_programs.hpp"

#include "attention_program_kernels.cuh"
#include "program_functors.hpp"

namespace attnlab::test {

namespace {
// Types of their own: the emulated tests instantiate the kernels for the functors themselves.
struct GpuCappedRelative : CappedRelative {};
struct GpuDocumentIds : DocumentIds {};
}  // namespace

cuda::DevicePrograms gpu_capped_relative() {
  return cuda::device_program(GpuCappedRelative{});
}

cuda::DevicePrograms gpu_capped_relative_documents(const std::int32_t* device_ids) {
  GpuDocumentIds mask;
  mask.ids = device_ids;
  mask.causal = true;
  return cuda::device_program(GpuCappedRelative{}, mask);
}

}  // namespace attnlab::test
