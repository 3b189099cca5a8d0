// The emulated device: the one launch glue of the CUDA backend
// (lib/backends/cuda/kernel_device_ops.hpp), compiled here by the C++ compiler over
// EmulatorRuntime, so the emulated tests run the GPU's own grids, block sizes and shared-memory
// sizes. The kernels run under the emulator of the CUDA thread model
// (attnlab/backends/cuda_emulator.hpp); the GEMMs through attnlab's CPU BLAS (a loop over the batch
// where cuBLAS runs a strided-batched GEMM). "Device" memory is host memory, filled with 0xFF bytes
// (NaN) when allocated, so that an output a kernel never wrote shows up.
//
// Compiled with -Wno-unknown-pragmas: the kernels carry nvcc's #pragma unroll.
#include "attnlab/backends/emulated.hpp"

#include <cstddef>
#include <cstring>
#include <new>
#include <stdexcept>
#include <string>

#include "attnlab/blas.hpp"

// clang-format off
#include "attnlab/backends/cuda_emulator.hpp"
#include "kernel_device_ops.hpp"
// clang-format on

namespace attnlab::emulated {

namespace {

class EmulatorRuntime {
 public:
  // The opt-in shared memory per block of an H100/H200 (227 KiB): check_fused and the fused tile
  // choice follow the device the CUDA path would most likely run on.
  static constexpr std::size_t kSharedMemoryLimit = 232448;
  // Grid-stride launches: the emulator's cost is per emulated thread, so few blocks of the GPU's
  // 256 threads, each thread taking many strides.
  static constexpr unsigned kMaxStrideBlocks = 8;
  static constexpr unsigned kSumBlocks = 8;

  std::string name() const { return "emulated (CPU)"; }

  void* allocate(std::size_t bytes) {
    if (bytes == 0) return nullptr;
    void* p = ::operator new(bytes, kAlignment);
    std::memset(p, 0xFF, bytes);
    ++live_;
    return p;
  }
  void release(void* p) noexcept {
    if (p == nullptr) return;
    ::operator delete(p, kAlignment);
    --live_;
  }
  void upload(void* device_dst, const void* host_src, std::size_t bytes) {
    if (bytes > 0) std::memcpy(device_dst, host_src, bytes);
  }
  void download(void* host_dst, const void* device_src, std::size_t bytes) {
    if (bytes > 0) std::memcpy(host_dst, device_src, bytes);
  }
  void copy(void* device_dst, const void* device_src, std::size_t bytes) {
    if (bytes > 0) std::memmove(device_dst, device_src, bytes);
  }
  void zero(void* device_dst, std::size_t bytes) {
    if (bytes > 0) std::memset(device_dst, 0, bytes);
  }
  void synchronize() {}

  template <class... Params, class... Args>
  void launch(void (*kernel)(Params...), dim3 grid, dim3 block, std::size_t shared_bytes,
              Args... args) {
    emu::launch(kernel, grid, block, shared_bytes, args...);
  }

  // cuBLAS's strided-batched GEMM: one CPU GEMM per matrix.
  template <class T>
  void gemm(bool trans_a, bool trans_b, int m, int n, int k, T alpha, const T* a, int lda,
            long long stride_a, const T* b, int ldb, long long stride_b, T beta, T* c, int ldc,
            long long stride_c, int batch) {
    if (m == 0 || n == 0) return;
    for (int i = 0; i < batch; ++i) {
      blas::gemm<T>(trans_a, trans_b, m, n, k, alpha, a + i * stride_a, lda, b + i * stride_b, ldb,
                    beta, c + i * stride_c, ldc);
    }
  }

  std::size_t shared_memory_limit() const { return kSharedMemoryLimit; }

  // Allocations not yet released (for leak tests).
  std::size_t live() const { return live_; }

 private:
  static constexpr std::align_val_t kAlignment{64};
  std::size_t live_ = 0;
};

template <class T>
using EmulatedDeviceOps = cuda::KernelDeviceOps<T, EmulatorRuntime>;

}  // namespace

template <class T>
std::unique_ptr<DeviceOps<T>> make_device_ops() {
  return std::make_unique<EmulatedDeviceOps<T>>();
}

template <class T>
std::size_t live_allocations(const DeviceOps<T>& ops) {
  const auto* emulated = dynamic_cast<const EmulatedDeviceOps<T>*>(&ops);
  if (emulated == nullptr) {
    throw std::invalid_argument(
        "emulated::live_allocations: ops expected an emulated device, got " + ops.name());
  }
  return emulated->runtime().live();
}

template std::unique_ptr<DeviceOps<float>> make_device_ops<float>();
template std::unique_ptr<DeviceOps<double>> make_device_ops<double>();
template std::size_t live_allocations<float>(const DeviceOps<float>&);
template std::size_t live_allocations<double>(const DeviceOps<double>&);

}  // namespace attnlab::emulated
