// Device queries, DeviceBuffer, error reporting, the cuBLAS handle and the row-major GEMM.
#include <cstdint>
#include <mutex>
#include <string>

#include "attnlab/cuda.hpp"
#include "check.hpp"

namespace attnlab {

namespace cuda::detail {

void throw_cuda_error(const char* file, int line, const char* call, cudaError_t error) {
  throw CudaError(std::string(file) + ":" + std::to_string(line) + ": " + call +
                  " failed: " + cudaGetErrorName(error) + ": " + cudaGetErrorString(error));
}

void throw_cublas_error(const char* file, int line, const char* call, cublasStatus_t status) {
  throw CudaError(std::string(file) + ":" + std::to_string(line) + ": " + call +
                  " failed: " + cublasGetStatusName(status) + ": " + cublasGetStatusString(status));
}

namespace {
// The calling thread's TF32 setting (set_allow_tf32), like the CPU thread count (threads.hpp).
thread_local bool t_allow_tf32 = false;

// Held while the shared cuBLAS handle is configured and called.
std::mutex& gemm_mutex() {
  static std::mutex mutex;
  return mutex;
}
}  // namespace

cublasHandle_t cublas_handle() {
  // Made once (thread-safe static initialisation) and never destroyed: at process exit the CUDA
  // runtime may already be gone.
  static const cublasHandle_t handle = [] {
    cublasHandle_t h = nullptr;
    ATTNLAB_CUBLAS_CHECK(cublasCreate(&h));
    return h;
  }();
  return handle;
}

}  // namespace cuda::detail

bool cuda_built() {
  return true;
}

int cuda_device_count() {
  // Probed once: without a driver the static runtime answers cudaErrorInsufficientDriver or
  // cudaErrorNoDevice, which means "no device", not a failure.
  static const int count = [] {
    int n = 0;
    if (cudaGetDeviceCount(&n) != cudaSuccess) {
      (void)cudaGetLastError();  // clear the sticky-free error so later calls start clean
      return 0;
    }
    return n;
  }();
  return count;
}

bool cuda_available() {
  return cuda_device_count() > 0;
}

std::string cuda_device_name() {
  cuda::require_device("cuda_device_name");
  int device = 0;
  ATTNLAB_CUDA_CHECK(cudaGetDevice(&device));
  cudaDeviceProp prop{};
  ATTNLAB_CUDA_CHECK(cudaGetDeviceProperties(&prop, device));
  const auto gib = static_cast<double>(prop.totalGlobalMem) / (1024.0 * 1024.0 * 1024.0);
  return std::string(prop.name) + " (sm_" + std::to_string(prop.major) +
         std::to_string(prop.minor) + ", " + std::to_string(static_cast<int>(gib + 0.5)) + " GiB)";
}

namespace cuda {

void require_device(const char* op) {
  if (!cuda_available()) {
    throw CudaError(std::string(op) +
                    ": no CUDA device is available (no driver, or no GPU on this machine)");
  }
}

void synchronize() {
  ATTNLAB_CUDA_CHECK(cudaDeviceSynchronize());
}

void set_allow_tf32(bool allow) {
  detail::t_allow_tf32 = allow;
}
bool allow_tf32() {
  return detail::t_allow_tf32;
}

void* device_allocate(std::size_t bytes) {
  require_device("device_allocate");
  void* p = nullptr;
  if (bytes > 0) ATTNLAB_CUDA_CHECK(cudaMalloc(&p, bytes));
  return p;
}

void device_release(void* p) noexcept {
  if (p) (void)cudaFree(p);  // noexcept: an error here would surface at the next checked call
}

void copy_host_to_device(void* device_dst, const void* host_src, std::size_t bytes) {
  if (bytes > 0) {
    ATTNLAB_CUDA_CHECK(cudaMemcpy(device_dst, host_src, bytes, cudaMemcpyHostToDevice));
  }
}

void copy_device_to_host(void* host_dst, const void* device_src, std::size_t bytes) {
  if (bytes > 0) {
    ATTNLAB_CUDA_CHECK(cudaMemcpy(host_dst, device_src, bytes, cudaMemcpyDeviceToHost));
  }
}

void copy_device_to_device(void* device_dst, const void* device_src, std::size_t bytes) {
  if (bytes > 0) {
    ATTNLAB_CUDA_CHECK(cudaMemcpy(device_dst, device_src, bytes, cudaMemcpyDeviceToDevice));
  }
}

void device_zero(void* device_dst, std::size_t bytes) {
  if (bytes > 0) ATTNLAB_CUDA_CHECK(cudaMemset(device_dst, 0, bytes));
}

DeviceBuffer::DeviceBuffer(std::size_t bytes) : bytes_(bytes) {
  require_device("DeviceBuffer");
  if (bytes > 0) ATTNLAB_CUDA_CHECK(cudaMalloc(&data_, bytes));
}

DeviceBuffer::~DeviceBuffer() {
  if (data_) (void)cudaFree(data_);  // a destructor must not throw
}

DeviceBuffer::DeviceBuffer(DeviceBuffer&& other) noexcept
    : data_(other.data_), bytes_(other.bytes_) {
  other.data_ = nullptr;
  other.bytes_ = 0;
}

DeviceBuffer& DeviceBuffer::operator=(DeviceBuffer&& other) noexcept {
  if (this != &other) {
    if (data_) (void)cudaFree(data_);
    data_ = other.data_;
    bytes_ = other.bytes_;
    other.data_ = nullptr;
    other.bytes_ = 0;
  }
  return *this;
}

void DeviceBuffer::copy_from_host(const void* host, std::size_t bytes) {
  if (bytes > bytes_) {
    throw CudaError("DeviceBuffer::copy_from_host: " + std::to_string(bytes) +
                    " bytes into a buffer of " + std::to_string(bytes_));
  }
  if (bytes > 0) ATTNLAB_CUDA_CHECK(cudaMemcpy(data_, host, bytes, cudaMemcpyHostToDevice));
}

void DeviceBuffer::copy_to_host(void* host, std::size_t bytes) const {
  if (bytes > bytes_) {
    throw CudaError("DeviceBuffer::copy_to_host: " + std::to_string(bytes) +
                    " bytes from a buffer of " + std::to_string(bytes_));
  }
  if (bytes > 0) ATTNLAB_CUDA_CHECK(cudaMemcpy(host, data_, bytes, cudaMemcpyDeviceToHost));
}

void DeviceBuffer::poison() {
  if (bytes_ > 0) ATTNLAB_CUDA_CHECK(cudaMemset(data_, 0xFF, bytes_));
}

namespace {
// Row-major C = op(A) op(B) is column-major Cᵀ = op(B)ᵀ op(A)ᵀ: swap the operands and m, n.
cublasOperation_t op_of(bool trans) {
  return trans ? CUBLAS_OP_T : CUBLAS_OP_N;
}

cublasStatus_t gemm_batched(cublasHandle_t h, cublasOperation_t ta, cublasOperation_t tb, int m,
                            int n, int k, const float* alpha, const float* a, int lda, long long sa,
                            const float* b, int ldb, long long sb, const float* beta, float* c,
                            int ldc, long long sc, int batch) {
  return cublasSgemmStridedBatched(h, ta, tb, m, n, k, alpha, a, lda, sa, b, ldb, sb, beta, c, ldc,
                                   sc, batch);
}
cublasStatus_t gemm_batched(cublasHandle_t h, cublasOperation_t ta, cublasOperation_t tb, int m,
                            int n, int k, const double* alpha, const double* a, int lda,
                            long long sa, const double* b, int ldb, long long sb,
                            const double* beta, double* c, int ldc, long long sc, int batch) {
  return cublasDgemmStridedBatched(h, ta, tb, m, n, k, alpha, a, lda, sa, b, ldb, sb, beta, c, ldc,
                                   sc, batch);
}
}  // namespace

template <class T>
void gemm_strided_batched(bool trans_a, bool trans_b, int m, int n, int k, T alpha, const T* a,
                          int lda, long long stride_a, const T* b, int ldb, long long stride_b,
                          T beta, T* c, int ldc, long long stride_c, int batch) {
  if (m == 0 || n == 0 || batch == 0) return;
  const cublasHandle_t handle = detail::cublas_handle();
  // The handle is shared by the host threads: setting its math mode and enqueueing the GEMM (which
  // reads it) is one critical section, so each thread's GEMM runs with that thread's TF32 setting.
  const std::lock_guard<std::mutex> lock(detail::gemm_mutex());
  ATTNLAB_CUBLAS_CHECK(
      cublasSetMathMode(handle, allow_tf32() ? CUBLAS_TF32_TENSOR_OP_MATH : CUBLAS_DEFAULT_MATH));
  //                     column-major: Cᵀ (n, m) = op(B)ᵀ (n, k) · op(A)ᵀ (k, m)
  ATTNLAB_CUBLAS_CHECK(gemm_batched(handle, op_of(trans_b), op_of(trans_a), n, m, k, &alpha, b, ldb,
                                    stride_b, a, lda, stride_a, &beta, c, ldc, stride_c, batch));
}

namespace {
// cublasGemmStridedBatchedEx with A and B of `type`, fp32 C, under the handle's lock: the
// row-major contract of gemm_strided_batched.
void gemm_ex(cudaDataType type, cublasComputeType_t compute, bool trans_a, bool trans_b, int m,
             int n, int k, float alpha, const void* a, int lda, long long stride_a, const void* b,
             int ldb, long long stride_b, float beta, float* c, int ldc, long long stride_c,
             int batch) {
  if (m == 0 || n == 0 || batch == 0) return;
  const cublasHandle_t handle = detail::cublas_handle();
  const std::lock_guard<std::mutex> lock(detail::gemm_mutex());
  ATTNLAB_CUBLAS_CHECK(cublasSetMathMode(handle, CUBLAS_DEFAULT_MATH));
  ATTNLAB_CUBLAS_CHECK(cublasGemmStridedBatchedEx(
      handle, op_of(trans_b), op_of(trans_a), n, m, k, &alpha, b, type, ldb, stride_b, a, type, lda,
      stride_a, &beta, c, CUDA_R_32F, ldc, stride_c, batch, compute, CUBLAS_GEMM_DEFAULT));
}
}  // namespace

void gemm_strided_batched_bf16(bool trans_a, bool trans_b, int m, int n, int k, float alpha,
                               const std::uint16_t* a, int lda, long long stride_a,
                               const std::uint16_t* b, int ldb, long long stride_b, float beta,
                               float* c, int ldc, long long stride_c, int batch) {
  gemm_ex(CUDA_R_16BF, CUBLAS_COMPUTE_32F, trans_a, trans_b, m, n, k, alpha, a, lda, stride_a, b,
          ldb, stride_b, beta, c, ldc, stride_c, batch);
}

void gemm_strided_batched_tf32(bool trans_a, bool trans_b, int m, int n, int k, float alpha,
                               const float* a, int lda, long long stride_a, const float* b, int ldb,
                               long long stride_b, float beta, float* c, int ldc,
                               long long stride_c, int batch) {
  gemm_ex(CUDA_R_32F, CUBLAS_COMPUTE_32F_FAST_TF32, trans_a, trans_b, m, n, k, alpha, a, lda,
          stride_a, b, ldb, stride_b, beta, c, ldc, stride_c, batch);
}

template void gemm_strided_batched<float>(bool, bool, int, int, int, float, const float*, int,
                                          long long, const float*, int, long long, float, float*,
                                          int, long long, int);
template void gemm_strided_batched<double>(bool, bool, int, int, int, double, const double*, int,
                                           long long, const double*, int, long long, double,
                                           double*, int, long long, int);

}  // namespace cuda
}  // namespace attnlab
