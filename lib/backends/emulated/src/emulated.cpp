// The emulated device: the one launch glue of the CUDA backend
// (lib/backends/cuda/kernel_device_ops.hpp), compiled here by the C++ compiler over
// EmulatorRuntime, so the emulated tests run the GPU's own grids, block sizes and shared-memory
// sizes. The kernels run under the emulator of the CUDA thread model
// (attnlab/backends/cuda_emulator.hpp); the GEMMs through attnlab's CPU BLAS (a loop over the batch
// where cuBLAS runs a strided-batched GEMM). "Device" memory is host memory, filled with 0xFF bytes
// (NaN) when allocated, so that an output a kernel never wrote shows up. Because a kernel here
// could read host memory that a GPU cannot, every pointer given to a kernel or a GEMM must lie in a
// live allocation of this device (or be null): a host pointer throws std::logic_error, as it would
// fault on the GPU (cudaErrorIllegalAddress). Pointers::host_allowed lifts the rule.
//
// Compiled with -Wno-unknown-pragmas: the kernels carry nvcc's #pragma unroll.
#include "attnlab/backends/emulated.hpp"

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <functional>
#include <iterator>
#include <map>
#include <new>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <vector>

#include "attnlab/attention/params.hpp"
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

  void set_pointers(Pointers pointers) { pointers_ = pointers; }

  void* allocate(std::size_t bytes) {
    if (bytes == 0) return nullptr;
    void* p = ::operator new(bytes, kAlignment);
    std::memset(p, 0xFF, bytes);
    blocks_.emplace(address(p), bytes);
    return p;
  }
  void release(void* p) noexcept {
    if (p == nullptr) return;
    blocks_.erase(address(p));
    ::operator delete(p, kAlignment);
  }
  void upload(void* device_dst, const void* host_src, std::size_t bytes) {
    if (bytes == 0) return;
    check_device_range(device_dst, bytes, "upload", 0);
    std::memcpy(device_dst, host_src, bytes);
    uploaded_ += bytes;
  }
  void download(void* host_dst, const void* device_src, std::size_t bytes) {
    if (bytes == 0) return;
    check_device_range(device_src, bytes, "download", 1);
    std::memcpy(host_dst, device_src, bytes);
    downloaded_ += bytes;
  }
  void copy(void* device_dst, const void* device_src, std::size_t bytes) {
    if (bytes == 0) return;
    check_device_range(device_dst, bytes, "copy", 0);
    check_device_range(device_src, bytes, "copy", 1);
    std::memmove(device_dst, device_src, bytes);
  }
  void zero(void* device_dst, std::size_t bytes) {
    if (bytes == 0) return;
    check_device_range(device_dst, bytes, "zero", 0);
    std::memset(device_dst, 0, bytes);
  }
  void synchronize() {}

  template <class... Params, class... Args>
  void launch(void (*kernel)(Params...), dim3 grid, dim3 block, std::size_t shared_bytes,
              Args... args) {
    int index = 0;
    (check_device_pointer(args, "a kernel", index++), ...);
    emu::launch(kernel, grid, block, shared_bytes, args...);
  }

  // cuBLAS's strided-batched GEMM: one CPU GEMM per matrix.
  template <class T>
  void gemm(bool trans_a, bool trans_b, int m, int n, int k, T alpha, const T* a, int lda,
            long long stride_a, const T* b, int ldb, long long stride_b, T beta, T* c, int ldc,
            long long stride_c, int batch) {
    if (m == 0 || n == 0) return;
    check_device_pointer(a, "gemm", 0);
    check_device_pointer(b, "gemm", 1);
    check_device_pointer(c, "gemm", 2);
    for (int i = 0; i < batch; ++i) {
      blas::gemm<T>(trans_a, trans_b, m, n, k, alpha, a + i * stride_a, lda, b + i * stride_b, ldb,
                    beta, c + i * stride_c, ldc);
    }
  }

  // cublasGemmStridedBatchedEx with bf16 A and B: their exact float values through the fp32 gemm
  // (every product of two bf16 values is exact in fp32; only the order of the sums may differ).
  void gemm_bf16(bool trans_a, bool trans_b, int m, int n, int k, float alpha, const emu::Bf16* a,
                 int lda, long long stride_a, const emu::Bf16* b, int ldb, long long stride_b,
                 float beta, float* c, int ldc, long long stride_c, int batch) {
    gemm_of_copies([](emu::Bf16 x) { return emu::to_float(x); }, "gemm_bf16", trans_a, trans_b, m,
                   n, k, alpha, a, lda, stride_a, b, ldb, stride_b, beta, c, ldc, stride_c, batch);
  }
  // cuBLAS's TF32 tensor-op math: A and B rounded to TF32 (10 mantissa bits, to nearest even).
  void gemm_tf32(bool trans_a, bool trans_b, int m, int n, int k, float alpha, const float* a,
                 int lda, long long stride_a, const float* b, int ldb, long long stride_b,
                 float beta, float* c, int ldc, long long stride_c, int batch) {
    gemm_of_copies(to_tf32, "gemm_tf32", trans_a, trans_b, m, n, k, alpha, a, lda, stride_a, b, ldb,
                   stride_b, beta, c, ldc, stride_c, batch);
  }

  std::size_t shared_memory_limit() const { return kSharedMemoryLimit; }

  // Allocations not yet released (for leak tests).
  std::size_t live() const { return blocks_.size(); }
  Transfers transfers() const { return {uploaded_, downloaded_}; }

 private:
  static constexpr std::align_val_t kAlignment{64};

  static std::uintptr_t address(const void* p) { return reinterpret_cast<std::uintptr_t>(p); }

  // x rounded to TF32: the low 13 mantissa bits dropped, to nearest, ties to even (inf and NaN
  // kept).
  static float to_tf32(float x) {
    std::uint32_t bits = 0;
    std::memcpy(&bits, &x, sizeof bits);
    if ((bits & 0x7f800000u) != 0x7f800000u) {
      bits += 0xfffu + ((bits >> 13) & 1u);
      bits &= ~0x1fffu;
    }
    float out = 0;
    std::memcpy(&out, &bits, sizeof out);
    return out;
  }
  static std::size_t span(int rows, int cols, int ld, long long stride, int batch) {
    return cuda::precision::operand_span(rows, cols, ld, stride, batch);
  }
  // The fp32 GEMMs of float copies of A and B, convert(element) each, into device C.
  template <class Convert, class U>
  void gemm_of_copies(Convert convert, const char* op, bool trans_a, bool trans_b, int m, int n,
                      int k, float alpha, const U* a, int lda, long long stride_a, const U* b,
                      int ldb, long long stride_b, float beta, float* c, int ldc,
                      long long stride_c, int batch) {
    check_device_pointer(a, op, 0);
    check_device_pointer(b, op, 1);
    const auto copy = [&](const U* x, std::size_t count) {
      std::vector<float> out(count);
      for (std::size_t i = 0; i < count; ++i) out[i] = convert(x[i]);
      return out;
    };
    const std::vector<float> ac =
        copy(a, span(trans_a ? k : m, trans_a ? m : k, lda, stride_a, batch));
    const std::vector<float> bc =
        copy(b, span(trans_b ? n : k, trans_b ? k : n, ldb, stride_b, batch));
    gemm_host(trans_a, trans_b, m, n, k, alpha, ac.data(), lda, stride_a, bc.data(), ldb, stride_b,
              beta, c, ldc, stride_c, batch);
  }
  // The float GEMMs of host copies into device C.
  void gemm_host(bool trans_a, bool trans_b, int m, int n, int k, float alpha, const float* a,
                 int lda, long long stride_a, const float* b, int ldb, long long stride_b,
                 float beta, float* c, int ldc, long long stride_c, int batch) {
    if (m == 0 || n == 0) return;
    check_device_pointer(c, "gemm", 2);
    for (int i = 0; i < batch; ++i) {
      blas::gemm<float>(trans_a, trans_b, m, n, k, alpha, a + i * stride_a, lda, b + i * stride_b,
                        ldb, beta, c + i * stride_c, ldc);
    }
  }

  // [p, p + bytes) must lie in one live block: the rule a GPU enforces, where a host address
  // faults. bytes = 0 accepts a pointer just past a block's end.
  void check_device_range(const void* p, std::size_t bytes, const char* what, int index) const {
    if (pointers_ == Pointers::host_allowed) return;
    const std::uintptr_t start = address(p);
    auto it = blocks_.upper_bound(start);
    if (it != blocks_.begin()) {
      const auto& [base, size] = *std::prev(it);
      if (start - base <= size && bytes <= size - (start - base)) return;
    }
    const std::string extent = bytes == 0 ? "an address" : std::to_string(bytes) + " bytes";
    throw std::logic_error("emulated device: " + std::string(what) + "'s pointer argument " +
                           std::to_string(index) + " expected device memory (" + extent +
                           " inside one live allocation of this device), got memory outside them "
                           "(a GPU faults on a host address)");
  }

  // A kernel's or GEMM's pointer argument must be null or point into a live block, and so must
  // every pointer an AttentionParams argument carries. Other arguments are not pointers.
  template <class Arg>
  void check_device_pointer(const Arg& arg, const char* what, int index) const {
    if constexpr (std::is_pointer_v<Arg>) {
      if (arg != nullptr) check_device_range(arg, 0, what, index);
    } else if constexpr (std::is_same_v<Arg, AttentionParams<float>> ||
                         std::is_same_v<Arg, AttentionParams<double>>) {
      check_params_pointer(arg.q, what, index, "q");
      check_params_pointer(arg.k, what, index, "k");
      check_params_pointer(arg.v, what, index, "v");
      check_params_pointer(arg.scale, what, index, "scale");
      check_params_pointer(arg.key_mask, what, index, "key_mask");
      check_params_pointer(arg.alibi_slopes, what, index, "alibi_slopes");
      check_params_pointer(arg.bias, what, index, "bias");
      check_params_pointer(arg.dscores, what, index, "dscores");
    }
  }

  template <class P>
  void check_params_pointer(const P* p, const char* what, int index, const char* field) const {
    if (p == nullptr || pointers_ == Pointers::host_allowed) return;
    try {
      check_device_range(p, 0, what, index);
    } catch (const std::logic_error& e) {
      throw std::logic_error(std::string(e.what()) + " (AttentionParams::" + field + ")");
    }
  }

  std::map<std::uintptr_t, std::size_t, std::less<>> blocks_;  // live blocks: start -> bytes
  Pointers pointers_ = Pointers::device_only;
  std::size_t uploaded_ = 0, downloaded_ = 0;  // bytes copied in and out since the device was made
};

template <class T>
using EmulatedDeviceOps = cuda::KernelDeviceOps<T, EmulatorRuntime>;

}  // namespace

template <class T>
std::unique_ptr<DeviceOps<T>> make_device_ops(Pointers pointers) {
  auto ops = std::make_unique<EmulatedDeviceOps<T>>();
  ops->runtime().set_pointers(pointers);
  return ops;
}

namespace {
template <class T>
const EmulatorRuntime& runtime_of(const DeviceOps<T>& ops, const char* op) {
  const auto* emulated = dynamic_cast<const EmulatedDeviceOps<T>*>(&ops);
  if (emulated == nullptr) {
    throw std::invalid_argument(std::string(op) + ": ops expected an emulated device, got " +
                                ops.name());
  }
  return emulated->runtime();
}
}  // namespace

template <class T>
std::size_t live_allocations(const DeviceOps<T>& ops) {
  return runtime_of(ops, "emulated::live_allocations").live();
}

template <class T>
Transfers transfers(const DeviceOps<T>& ops) {
  return runtime_of(ops, "emulated::transfers").transfers();
}

template std::unique_ptr<DeviceOps<float>> make_device_ops<float>(Pointers);
template std::unique_ptr<DeviceOps<double>> make_device_ops<double>(Pointers);
template std::size_t live_allocations<float>(const DeviceOps<float>&);
template std::size_t live_allocations<double>(const DeviceOps<double>&);
template Transfers transfers<float>(const DeviceOps<float>&);
template Transfers transfers<double>(const DeviceOps<double>&);

}  // namespace attnlab::emulated
