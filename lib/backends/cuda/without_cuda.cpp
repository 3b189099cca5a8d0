// The CUDA host API of a build without the CUDA backend: queries answer "no", everything else
// throws CudaError. With the backend (ATTNLAB_HAS_CUDA) lib/backends/cuda defines these instead.
#ifndef ATTNLAB_HAS_CUDA

#include <cstdint>
#include <memory>
#include <string>

#include "attnlab/cuda.hpp"
#include "attnlab/device_ops.hpp"

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

void* device_allocate(std::size_t) {
  not_built("cuda::device_allocate");
}
void device_release(void*) noexcept {}
void copy_host_to_device(void*, const void*, std::size_t) {
  not_built("cuda::copy_host_to_device");
}
void copy_device_to_host(void*, const void*, std::size_t) {
  not_built("cuda::copy_device_to_host");
}
void copy_device_to_device(void*, const void*, std::size_t) {
  not_built("cuda::copy_device_to_device");
}
void device_zero(void*, std::size_t) {
  not_built("cuda::device_zero");
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

template void gemm_strided_batched<float>(bool, bool, int, int, int, float, const float*, int,
                                          long long, const float*, int, long long, float, float*,
                                          int, long long, int);
template void gemm_strided_batched<double>(bool, bool, int, int, int, double, const double*, int,
                                           long long, const double*, int, long long, double,
                                           double*, int, long long, int);

void gemm_strided_batched_bf16(bool, bool, int, int, int, float, const std::uint16_t*, int,
                               long long, const std::uint16_t*, int, long long, float, float*, int,
                               long long, int) {
  not_built("cuda::gemm_strided_batched_bf16");
}
void gemm_strided_batched_tf32(bool, bool, int, int, int, float, const float*, int, long long,
                               const float*, int, long long, float, float*, int, long long, int) {
  not_built("cuda::gemm_strided_batched_tf32");
}

}  // namespace cuda

// Without the backend there is no device to make: one function, not one stub per op.
template <class T>
std::unique_ptr<DeviceOps<T>> make_cuda_device_ops() {
  not_built("make_cuda_device_ops");
}
template std::unique_ptr<DeviceOps<float>> make_cuda_device_ops<float>();
template std::unique_ptr<DeviceOps<double>> make_cuda_device_ops<double>();

}  // namespace attnlab

#endif  // ATTNLAB_HAS_CUDA
