// The CUDA backend's DeviceOps (attnlab/device_ops.hpp): the one launch glue
// (kernel_device_ops.hpp) compiled by nvcc over CudaRuntime below. An instance keeps only its cache
// of freed device blocks; the one process-wide object under it, the cuBLAS handle, is guarded in
// runtime.cpp.
#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>

#include "attnlab/cuda.hpp"
#include "check.hpp"
#include "kernel_device_ops.hpp"

namespace attnlab {

namespace cuda {

namespace {

class CudaRuntime {
 public:
  static constexpr unsigned kMaxStrideBlocks = kernels::kMaxElementBlocks;
  static constexpr unsigned kSumBlocks = kernels::kSumBlocks;

  CudaRuntime() = default;
  CudaRuntime(const CudaRuntime&) = delete;
  CudaRuntime& operator=(const CudaRuntime&) = delete;
  ~CudaRuntime() {
    for (auto& [bytes, p] : cached_) device_release(p);
  }

  std::string name() const { return "cuda: " + cuda_device_name(); }

  // A caching allocator, as PyTorch's: the Modules' buffers are freed and allocated again every
  // step (an output the next layer still caches is not overwritten but replaced), and cudaFree
  // synchronises the device. Freed blocks are kept by size (rounded up to 512 bytes) and handed
  // out again; a block released while kernels that use it are queued is only reused by work
  // queued after them on the same (default) stream. The memory is returned when the backend is
  // destroyed.
  void* allocate(std::size_t bytes) {
    if (bytes == 0) return nullptr;
    bytes = (bytes + 511) / 512 * 512;
    std::lock_guard<std::mutex> lock(mutex_);
    void* p = nullptr;
    if (auto it = cached_.find(bytes); it != cached_.end()) {
      p = it->second;
      cached_.erase(it);
    } else {
      p = device_allocate(bytes);
    }
    live_[p] = bytes;
    return p;
  }
  void release(void* p) noexcept {
    if (p == nullptr) return;
    std::lock_guard<std::mutex> lock(mutex_);
    auto it = live_.find(p);
    if (it == live_.end()) return;
    cached_.emplace(it->second, p);
    live_.erase(it);
  }
  void upload(void* device_dst, const void* host_src, std::size_t bytes) {
    copy_host_to_device(device_dst, host_src, bytes);
  }
  void download(void* host_dst, const void* device_src, std::size_t bytes) {
    copy_device_to_host(host_dst, device_src, bytes);
  }
  void copy(void* device_dst, const void* device_src, std::size_t bytes) {
    copy_device_to_device(device_dst, device_src, bytes);
  }
  void zero(void* device_dst, std::size_t bytes) { device_zero(device_dst, bytes); }
  void synchronize() { cuda::synchronize(); }

  // kernel<<<grid, block, shared_bytes>>>(args...) on the default stream, after raising the
  // kernel's dynamic shared-memory limit when it takes any.
  template <class... Params, class... Args>
  void launch(void (*kernel)(Params...), dim3 grid, dim3 block, std::size_t shared_bytes,
              Args... args) {
    if (shared_bytes > 0) {
      ATTNLAB_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                              static_cast<int>(shared_bytes)));
    }
    kernel<<<grid, block, shared_bytes>>>(args...);
    ATTNLAB_CUDA_CHECK_LAUNCH();
  }

  template <class T>
  void gemm(bool trans_a, bool trans_b, int m, int n, int k, T alpha, const T* a, int lda,
            long long stride_a, const T* b, int ldb, long long stride_b, T beta, T* c, int ldc,
            long long stride_c, int batch) {
    gemm_strided_batched<T>(trans_a, trans_b, m, n, k, alpha, a, lda, stride_a, b, ldb, stride_b,
                            beta, c, ldc, stride_c, batch);
  }

  void gemm_bf16(bool trans_a, bool trans_b, int m, int n, int k, float alpha,
                 const attnlab_bf16* a, int lda, long long stride_a, const attnlab_bf16* b, int ldb,
                 long long stride_b, float beta, float* c, int ldc, long long stride_c, int batch) {
    gemm_strided_batched_bf16(
        trans_a, trans_b, m, n, k, alpha, reinterpret_cast<const std::uint16_t*>(a), lda, stride_a,
        reinterpret_cast<const std::uint16_t*>(b), ldb, stride_b, beta, c, ldc, stride_c, batch);
  }
  void gemm_tf32(bool trans_a, bool trans_b, int m, int n, int k, float alpha, const float* a,
                 int lda, long long stride_a, const float* b, int ldb, long long stride_b,
                 float beta, float* c, int ldc, long long stride_c, int batch) {
    gemm_strided_batched_tf32(trans_a, trans_b, m, n, k, alpha, a, lda, stride_a, b, ldb, stride_b,
                              beta, c, ldc, stride_c, batch);
  }

  // The opt-in shared memory per block of the current device.
  std::size_t shared_memory_limit() const {
    int device = 0, bytes = 0;
    ATTNLAB_CUDA_CHECK(cudaGetDevice(&device));
    ATTNLAB_CUDA_CHECK(
        cudaDeviceGetAttribute(&bytes, cudaDevAttrMaxSharedMemoryPerBlockOptin, device));
    return static_cast<std::size_t>(bytes);
  }

 private:
  std::mutex mutex_;
  std::unordered_multimap<std::size_t, void*> cached_;  // free blocks by size
  std::unordered_map<void*, std::size_t> live_;         // handed-out blocks and their sizes
};

}  // namespace

}  // namespace cuda

template <class T>
std::unique_ptr<DeviceOps<T>> make_cuda_device_ops() {
  cuda::require_device("make_cuda_device_ops");
  return std::make_unique<cuda::KernelDeviceOps<T, cuda::CudaRuntime>>();
}

template std::unique_ptr<DeviceOps<float>> make_cuda_device_ops<float>();
template std::unique_ptr<DeviceOps<double>> make_cuda_device_ops<double>();

}  // namespace attnlab
