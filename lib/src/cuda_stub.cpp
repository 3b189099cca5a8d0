// The CUDA host API of a build without the CUDA backend: queries answer "no", everything else
// throws CudaError. With the backend (ATTNLAB_HAS_CUDA) lib/cuda defines these instead.
#ifndef ATTNLAB_HAS_CUDA

#include <cstdint>
#include <string>

#include "attnlab/cuda.hpp"
#include "attnlab/cuda_attention.hpp"
#include "attnlab/cuda_train.hpp"

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

template <class T>
void sdpa_reference_forward(T*, T*, const AttentionParams<T>&) {
  not_built("cuda::sdpa_reference_forward");
}
template <class T>
void sdpa_reference_backward(T*, T*, T*, T*, const T*, const T*, const AttentionParams<T>&) {
  not_built("cuda::sdpa_reference_backward");
}
template <class T>
void sdpa_fused_forward(T*, T*, const AttentionParams<T>&) {
  not_built("cuda::sdpa_fused_forward");
}
template <class T>
void sdpa_fused_backward(T*, T*, T*, T*, const T*, const T*, const T*, const AttentionParams<T>&) {
  not_built("cuda::sdpa_fused_backward");
}
template <class T>
int sdpa_fused_tile_rows(std::size_t, std::size_t) {
  not_built("cuda::sdpa_fused_tile_rows");
}

template <class T>
void embedding_forward(T*, const int*, const T*, std::size_t, std::size_t) {
  not_built("cuda::embedding_forward");
}
template <class T>
void embedding_backward(T*, const T*, const int*, std::size_t, std::size_t, std::size_t) {
  not_built("cuda::embedding_backward");
}
template <class T>
void layernorm_forward(T*, T*, T*, const T*, const T*, const T*, std::size_t, std::size_t, T) {
  not_built("cuda::layernorm_forward");
}
template <class T>
void layernorm_backward(T*, T*, T*, const T*, const T*, const T*, const T*, const T*, std::size_t,
                        std::size_t) {
  not_built("cuda::layernorm_backward");
}
template <class T>
void rmsnorm_forward(T*, T*, const T*, const T*, std::size_t, std::size_t, T) {
  not_built("cuda::rmsnorm_forward");
}
template <class T>
void rmsnorm_backward(T*, T*, const T*, const T*, const T*, const T*, std::size_t, std::size_t) {
  not_built("cuda::rmsnorm_backward");
}
template <class T>
void add(T*, const T*, const T*, std::size_t) {
  not_built("cuda::add");
}
template <class T>
void scale(T*, T, std::size_t) {
  not_built("cuda::scale");
}
template <class T>
void exp_elements(T*, const T*, std::size_t) {
  not_built("cuda::exp_elements");
}
template <class T>
void add_bias(T*, const T*, std::size_t, std::size_t) {
  not_built("cuda::add_bias");
}
template <class T>
void column_sum(T*, const T*, std::size_t, std::size_t) {
  not_built("cuda::column_sum");
}
template <class T>
void split_heads(T*, const T*, std::size_t, std::size_t, std::size_t, std::size_t) {
  not_built("cuda::split_heads");
}
template <class T>
void merge_heads(T*, const T*, std::size_t, std::size_t, std::size_t, std::size_t) {
  not_built("cuda::merge_heads");
}
template <class T>
void head_dot(T*, const T*, const T*, std::size_t, std::size_t, std::size_t) {
  not_built("cuda::head_dot");
}
template <class T>
void sgd_update(T*, T*, const T*, std::size_t, T, T, T, bool) {
  not_built("cuda::sgd_update");
}
template <class T>
void gelu_forward(T*, const T*, std::size_t, bool) {
  not_built("cuda::gelu_forward");
}
template <class T>
void gelu_backward(T*, const T*, const T*, std::size_t, bool) {
  not_built("cuda::gelu_backward");
}
template <class T>
void relu_forward(T*, const T*, std::size_t) {
  not_built("cuda::relu_forward");
}
template <class T>
void relu_backward(T*, const T*, const T*, std::size_t) {
  not_built("cuda::relu_backward");
}
template <class T>
void dropout(T*, const T*, std::size_t, double, std::uint64_t, std::uint32_t) {
  not_built("cuda::dropout");
}
template <class T>
void linear_forward(T*, const T*, const T*, const T*, std::size_t, std::size_t, std::size_t) {
  not_built("cuda::linear_forward");
}
template <class T>
void linear_backward(T*, T*, T*, const T*, const T*, const T*, std::size_t, std::size_t,
                     std::size_t) {
  not_built("cuda::linear_backward");
}
template <class T>
void softmax_cross_entropy(T*, T*, T*, const T*, const int*, std::size_t, std::size_t, int) {
  not_built("cuda::softmax_cross_entropy");
}
template <class T>
void adamw_update(T*, T*, T*, const T*, std::size_t, const cuda_math::AdamWScalars<T>&) {
  not_built("cuda::adamw_update");
}
template <class T>
void sum_of_squares(double*, double*, const T*, std::size_t) {
  not_built("cuda::sum_of_squares");
}
std::size_t sum_of_squares_scratch() {
  not_built("cuda::sum_of_squares_scratch");
}

#define ATTNLAB_INSTANTIATE_CUDA_STUBS(T)                                                         \
  template void gemm_strided_batched<T>(bool, bool, int, int, int, T, const T*, int, long long,   \
                                        const T*, int, long long, T, T*, int, long long, int);    \
  template void sdpa_reference_forward<T>(T*, T*, const AttentionParams<T>&);                     \
  template void sdpa_reference_backward<T>(T*, T*, T*, T*, const T*, const T*,                    \
                                           const AttentionParams<T>&);                            \
  template void sdpa_fused_forward<T>(T*, T*, const AttentionParams<T>&);                         \
  template void sdpa_fused_backward<T>(T*, T*, T*, T*, const T*, const T*, const T*,              \
                                       const AttentionParams<T>&);                                \
  template int sdpa_fused_tile_rows<T>(std::size_t, std::size_t);                                 \
  template void add<T>(T*, const T*, const T*, std::size_t);                                      \
  template void scale<T>(T*, T, std::size_t);                                                     \
  template void exp_elements<T>(T*, const T*, std::size_t);                                       \
  template void add_bias<T>(T*, const T*, std::size_t, std::size_t);                              \
  template void column_sum<T>(T*, const T*, std::size_t, std::size_t);                            \
  template void split_heads<T>(T*, const T*, std::size_t, std::size_t, std::size_t, std::size_t); \
  template void merge_heads<T>(T*, const T*, std::size_t, std::size_t, std::size_t, std::size_t); \
  template void head_dot<T>(T*, const T*, const T*, std::size_t, std::size_t, std::size_t);       \
  template void sgd_update<T>(T*, T*, const T*, std::size_t, T, T, T, bool);                      \
  template void embedding_forward<T>(T*, const int*, const T*, std::size_t, std::size_t);         \
  template void embedding_backward<T>(T*, const T*, const int*, std::size_t, std::size_t,         \
                                      std::size_t);                                               \
  template void layernorm_forward<T>(T*, T*, T*, const T*, const T*, const T*, std::size_t,       \
                                     std::size_t, T);                                             \
  template void layernorm_backward<T>(T*, T*, T*, const T*, const T*, const T*, const T*,         \
                                      const T*, std::size_t, std::size_t);                        \
  template void rmsnorm_forward<T>(T*, T*, const T*, const T*, std::size_t, std::size_t, T);      \
  template void rmsnorm_backward<T>(T*, T*, const T*, const T*, const T*, const T*, std::size_t,  \
                                    std::size_t);                                                 \
  template void gelu_forward<T>(T*, const T*, std::size_t, bool);                                 \
  template void gelu_backward<T>(T*, const T*, const T*, std::size_t, bool);                      \
  template void relu_forward<T>(T*, const T*, std::size_t);                                       \
  template void relu_backward<T>(T*, const T*, const T*, std::size_t);                            \
  template void dropout<T>(T*, const T*, std::size_t, double, std::uint64_t, std::uint32_t);      \
  template void linear_forward<T>(T*, const T*, const T*, const T*, std::size_t, std::size_t,     \
                                  std::size_t);                                                   \
  template void linear_backward<T>(T*, T*, T*, const T*, const T*, const T*, std::size_t,         \
                                   std::size_t, std::size_t);                                     \
  template void softmax_cross_entropy<T>(T*, T*, T*, const T*, const int*, std::size_t,           \
                                         std::size_t, int);                                       \
  template void adamw_update<T>(T*, T*, T*, const T*, std::size_t,                                \
                                const cuda_math::AdamWScalars<T>&);                               \
  template void sum_of_squares<T>(double*, double*, const T*, std::size_t);
ATTNLAB_INSTANTIATE_CUDA_STUBS(float)
ATTNLAB_INSTANTIATE_CUDA_STUBS(double)
#undef ATTNLAB_INSTANTIATE_CUDA_STUBS

}  // namespace cuda
}  // namespace attnlab

#endif  // ATTNLAB_HAS_CUDA
