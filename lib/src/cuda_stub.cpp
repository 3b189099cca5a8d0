// The CUDA host API of a build without the CUDA backend: queries answer "no", everything else
// throws CudaError. With the backend (ATTNLAB_HAS_CUDA) lib/cuda defines these instead.
#ifndef ATTNLAB_HAS_CUDA

#include <string>

#include "attnlab/cuda.hpp"
#include "attnlab/cuda_attention.hpp"

namespace attnlab {

namespace {
[[noreturn]] void not_built(const char* op) {
  throw CudaError(std::string(op) +
                  ": attnlab was built without CUDA (configure with "
                  "-DATTNLAB_CUDA=ON on a machine with the CUDA toolkit)");
}
}  // namespace

bool cuda_built() {
  return false;
}
int cuda_device_count() {
  return 0;
}
bool cuda_available() {
  return false;
}
std::string cuda_device_name() {
  not_built("cuda_device_name");
}

namespace cuda {

void require_device(const char* op) {
  not_built(op);
}
void synchronize() {
  not_built("cuda::synchronize");
}
void set_allow_tf32(bool) {}
bool allow_tf32() {
  return false;
}

DeviceBuffer::DeviceBuffer(std::size_t) {
  not_built("DeviceBuffer");
}
DeviceBuffer::~DeviceBuffer() = default;
DeviceBuffer::DeviceBuffer(DeviceBuffer&& other) noexcept
    : data_(other.data_), bytes_(other.bytes_) {}
DeviceBuffer& DeviceBuffer::operator=(DeviceBuffer&&) noexcept {
  return *this;
}
void DeviceBuffer::copy_from_host(const void*, std::size_t) {
  not_built("DeviceBuffer");
}
void DeviceBuffer::copy_to_host(void*, std::size_t) const {
  not_built("DeviceBuffer");
}
void DeviceBuffer::poison() {
  not_built("DeviceBuffer");
}

template <class T>
void gemm_strided_batched(bool, bool, int, int, int, T, const T*, int, long long, const T*, int,
                          long long, T, T*, int, long long, int) {
  not_built("cuda::gemm_strided_batched");
}

template <class T>
void sdpa_reference_forward(T*, T*, const SdpaDeviceArgs<T>&) {
  not_built("cuda::sdpa_reference_forward");
}
template <class T>
void sdpa_reference_backward(T*, T*, T*, T*, const T*, const T*, const SdpaDeviceArgs<T>&) {
  not_built("cuda::sdpa_reference_backward");
}
template <class T>
void sdpa_fused_forward(T*, T*, const SdpaDeviceArgs<T>&) {
  not_built("cuda::sdpa_fused_forward");
}
template <class T>
void sdpa_fused_backward(T*, T*, T*, T*, const T*, const T*, const T*, const SdpaDeviceArgs<T>&) {
  not_built("cuda::sdpa_fused_backward");
}
template <class T>
int sdpa_fused_tile_rows(std::size_t, std::size_t) {
  not_built("cuda::sdpa_fused_tile_rows");
}

#define ATTNLAB_INSTANTIATE_CUDA_STUBS(T)                                                       \
  template void gemm_strided_batched<T>(bool, bool, int, int, int, T, const T*, int, long long, \
                                        const T*, int, long long, T, T*, int, long long, int);  \
  template void sdpa_reference_forward<T>(T*, T*, const SdpaDeviceArgs<T>&);                    \
  template void sdpa_reference_backward<T>(T*, T*, T*, T*, const T*, const T*,                  \
                                           const SdpaDeviceArgs<T>&);                           \
  template void sdpa_fused_forward<T>(T*, T*, const SdpaDeviceArgs<T>&);                        \
  template void sdpa_fused_backward<T>(T*, T*, T*, T*, const T*, const T*, const T*,            \
                                       const SdpaDeviceArgs<T>&);                               \
  template int sdpa_fused_tile_rows<T>(std::size_t, std::size_t);
ATTNLAB_INSTANTIATE_CUDA_STUBS(float)
ATTNLAB_INSTANTIATE_CUDA_STUBS(double)
#undef ATTNLAB_INSTANTIATE_CUDA_STUBS

}  // namespace cuda
}  // namespace attnlab

#endif  // ATTNLAB_HAS_CUDA
