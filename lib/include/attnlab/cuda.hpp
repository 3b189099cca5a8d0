// Host API of the optional CUDA backend: device queries, a RAII device buffer, copies, and the
// row-major strided-batched GEMM on device pointers (cuBLAS). No CUDA type appears here, so this
// header compiles without the CUDA toolkit. When attnlab was built without CUDA every function
// exists: the queries answer false / 0, everything else throws CudaError("... attnlab was built
// without CUDA").
//
// Errors: every CUDA and cuBLAS call is checked; a failure throws CudaError whose message names the
// file, the line, the call and the runtime's error string.
#pragma once

#include <cstddef>
#include <cstdint>
#include <stdexcept>
#include <string>

namespace attnlab {

class CudaError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// True when the library was compiled with the CUDA backend (ATTNLAB_HAS_CUDA).
bool cuda_built();

// Number of usable CUDA devices: 0 without a driver, without a device, or without the backend.
// Never throws.
int cuda_device_count();

// True when the backend is built and at least one device is usable. Never throws.
bool cuda_available();

// "NVIDIA H200 (sm_90, 139 GiB)" for the current device; throws CudaError without one.
std::string cuda_device_name();

namespace cuda {

// Throws CudaError naming `op` unless cuda_available(): "op: attnlab was built without CUDA" or
// "op: no CUDA device is available (...)".
void require_device(const char* op);

// Waits for all work queued on the device; throws CudaError on an asynchronous kernel error.
void synchronize();

// Lets cuBLAS use TF32 tensor cores for the float GEMMs the CALLING thread issues (off by default:
// full fp32). A per-thread setting, like the CPU thread count (threads.hpp).
void set_allow_tf32(bool allow);
bool allow_tf32();

// Raw device memory, for owners that manage their own buffers (DeviceOps). device_allocate returns
// `bytes` of uninitialised device memory (nullptr for 0 bytes); device_release(nullptr) does
// nothing and never throws. The copies are synchronous with respect to the host; device_zero sets
// `bytes` bytes to 0. Each does nothing for 0 bytes.
void* device_allocate(std::size_t bytes);
void device_release(void* p) noexcept;
void copy_host_to_device(void* device_dst, const void* host_src, std::size_t bytes);
void copy_device_to_host(void* host_dst, const void* device_src, std::size_t bytes);
void copy_device_to_device(void* device_dst, const void* device_src, std::size_t bytes);
void device_zero(void* device_dst, std::size_t bytes);

// A device allocation of `bytes` bytes, freed on destruction. Move-only. The memory is NOT
// initialised: every kernel assigns all of its outputs; poison() fills it with NaN bit patterns
// (all bytes 0xFF) so that tests catch any element a kernel failed to write.
class DeviceBuffer {
 public:
  DeviceBuffer() = default;
  explicit DeviceBuffer(std::size_t bytes);
  ~DeviceBuffer();
  DeviceBuffer(DeviceBuffer&& other) noexcept;
  DeviceBuffer& operator=(DeviceBuffer&& other) noexcept;
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;

  void* data() const { return data_; }
  std::size_t bytes() const { return bytes_; }

  // Copies `bytes` bytes (<= bytes()) from host memory / to host memory; synchronous.
  void copy_from_host(const void* host, std::size_t bytes);
  void copy_to_host(void* host, std::size_t bytes) const;
  void poison();

 private:
  void* data_ = nullptr;
  std::size_t bytes_ = 0;
};

// A typed view of a DeviceBuffer: `count` elements of T.
template <class T>
class DeviceArray {
 public:
  DeviceArray() = default;
  explicit DeviceArray(std::size_t count) : buffer_(count * sizeof(T)), count_(count) {}
  DeviceArray(const T* host, std::size_t count) : DeviceArray(count) { upload(host); }

  T* data() const { return static_cast<T*>(buffer_.data()); }
  std::size_t size() const { return count_; }
  void upload(const T* host) { buffer_.copy_from_host(host, count_ * sizeof(T)); }
  void download(T* host) const { buffer_.copy_to_host(host, count_ * sizeof(T)); }
  void poison() { buffer_.poison(); }

 private:
  DeviceBuffer buffer_;
  std::size_t count_ = 0;
};

// C = alpha · op(A) op(B) + beta · C for `batch` row-major matrices on the device (cuBLAS
// strided-batched GEMM). Matrix i of X starts at X + i · stride_x; lda/ldb/ldc are row strides as
// stored. With beta = 0, C is assigned and its previous contents (even NaN) are ignored.
// Asynchronous; T = float or double.
template <class T>
void gemm_strided_batched(bool trans_a, bool trans_b, int m, int n, int k, T alpha, const T* a,
                          int lda, long long stride_a, const T* b, int ldb, long long stride_b,
                          T beta, T* c, int ldc, long long stride_c, int batch);

// The same contract with a and b in bfloat16 (their bits) and C in float: products of bf16 values
// summed in fp32 (cublasGemmStridedBatchedEx, CUBLAS_COMPUTE_32F). The GEMMs of a float backend in
// bf16 precision (DeviceOps::set_precision).
void gemm_strided_batched_bf16(bool trans_a, bool trans_b, int m, int n, int k, float alpha,
                               const std::uint16_t* a, int lda, long long stride_a,
                               const std::uint16_t* b, int ldb, long long stride_b, float beta,
                               float* c, int ldc, long long stride_c, int batch);

// gemm_strided_batched<float> on TF32 tensor cores (CUBLAS_COMPUTE_32F_FAST_TF32) whatever
// set_allow_tf32 says: a float backend in tf32 precision.
void gemm_strided_batched_tf32(bool trans_a, bool trans_b, int m, int n, int k, float alpha,
                               const float* a, int lda, long long stride_a, const float* b, int ldb,
                               long long stride_b, float beta, float* c, int ldc,
                               long long stride_c, int batch);

}  // namespace cuda
}  // namespace attnlab
