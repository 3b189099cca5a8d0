// The CUDA backend's DeviceOps (attnlab/device_ops.hpp): every operation forwards to the host
// launchers of attnlab/cuda.hpp, cuda_train.hpp and cuda_attention.hpp. Plain C++ in every build:
// without the CUDA backend those launchers throw CudaError, and make_cuda_device_ops() throws
// before making an instance. An instance keeps only its cache of freed device blocks (below); the
// one process-wide object under it, the cuBLAS handle, is guarded there (lib/cuda/runtime.cpp).
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>

#include "attnlab/cuda.hpp"
#include "attnlab/cuda_attention.hpp"
#include "attnlab/cuda_train.hpp"
#include "attnlab/device_ops.hpp"

namespace attnlab {

namespace {

template <class T>
class CudaDeviceOps final : public DeviceOps<T> {
 public:
  std::string name() const override { return "cuda: " + cuda_device_name(); }

  CudaDeviceOps() = default;
  CudaDeviceOps(const CudaDeviceOps&) = delete;
  CudaDeviceOps& operator=(const CudaDeviceOps&) = delete;
  ~CudaDeviceOps() override {
    for (auto& [bytes, p] : cached_) cuda::device_release(p);
  }

  // A caching allocator, as PyTorch's: the Modules' buffers are freed and allocated again every
  // step (an output the next layer still caches is not overwritten but replaced), and cudaFree
  // synchronises the device. Freed blocks are kept by size (rounded up to 512 bytes) and handed out
  // again; the device memory is returned when the backend is destroyed.
  void* allocate(std::size_t bytes) override {
    if (bytes == 0) return nullptr;
    bytes = (bytes + 511) / 512 * 512;
    std::lock_guard<std::mutex> lock(mutex_);
    void* p = nullptr;
    if (auto it = cached_.find(bytes); it != cached_.end()) {
      p = it->second;
      cached_.erase(it);
    } else {
      p = cuda::device_allocate(bytes);
    }
    live_[p] = bytes;
    return p;
  }
  void release(void* p) noexcept override {
    if (p == nullptr) return;
    std::lock_guard<std::mutex> lock(mutex_);
    auto it = live_.find(p);
    if (it == live_.end()) return;
    cached_.emplace(it->second, p);
    live_.erase(it);
  }
  void upload(void* device_dst, const void* host_src, std::size_t bytes) override {
    cuda::copy_host_to_device(device_dst, host_src, bytes);
  }
  void download(void* host_dst, const void* device_src, std::size_t bytes) override {
    cuda::copy_device_to_host(host_dst, device_src, bytes);
  }
  void copy(void* device_dst, const void* device_src, std::size_t bytes) override {
    cuda::copy_device_to_device(device_dst, device_src, bytes);
  }
  void zero(void* device_dst, std::size_t bytes) override { cuda::device_zero(device_dst, bytes); }

  void add(T* y, const T* a, const T* b, std::size_t n) override { cuda::add(y, a, b, n); }
  void scale(T* x, T factor, std::size_t n) override { cuda::scale(x, factor, n); }
  void exp(T* y, const T* x, std::size_t n) override { cuda::exp_elements(y, x, n); }
  void add_bias(T* y, const T* b, std::size_t rows, std::size_t C) override {
    cuda::add_bias(y, b, rows, C);
  }
  void column_sum(T* db, const T* dy, std::size_t rows, std::size_t C) override {
    cuda::column_sum(db, dy, rows, C);
  }

  void split_heads(T* out, const T* x, std::size_t B, std::size_t Tn, std::size_t H,
                   std::size_t D) override {
    cuda::split_heads(out, x, B, Tn, H, D);
  }
  void merge_heads(T* out, const T* x, std::size_t B, std::size_t Tn, std::size_t H,
                   std::size_t D) override {
    cuda::merge_heads(out, x, B, Tn, H, D);
  }
  void head_dot(T* out, const T* a, const T* c, std::size_t B, std::size_t H,
                std::size_t n) override {
    cuda::head_dot(out, a, c, B, H, n);
  }

  void embedding_forward(T* y, const int* ids, const T* table, std::size_t rows,
                         std::size_t C) override {
    cuda::embedding_forward(y, ids, table, rows, C);
  }
  void embedding_backward(T* dtable, const T* dy, const int* ids, std::size_t rows, std::size_t V,
                          std::size_t C) override {
    cuda::embedding_backward(dtable, dy, ids, rows, V, C);
  }
  void layernorm_forward(T* y, T* mean, T* rstd, const T* x, const T* gamma, const T* beta,
                         std::size_t rows, std::size_t C, T eps) override {
    cuda::layernorm_forward(y, mean, rstd, x, gamma, beta, rows, C, eps);
  }
  void layernorm_backward(T* dx, T* dgamma, T* dbeta, const T* dy, const T* x, const T* mean,
                          const T* rstd, const T* gamma, std::size_t rows, std::size_t C) override {
    cuda::layernorm_backward(dx, dgamma, dbeta, dy, x, mean, rstd, gamma, rows, C);
  }
  void rmsnorm_forward(T* y, T* rstd, const T* x, const T* gamma, std::size_t rows, std::size_t C,
                       T eps) override {
    cuda::rmsnorm_forward(y, rstd, x, gamma, rows, C, eps);
  }
  void rmsnorm_backward(T* dx, T* dgamma, const T* dy, const T* x, const T* rstd, const T* gamma,
                        std::size_t rows, std::size_t C) override {
    cuda::rmsnorm_backward(dx, dgamma, dy, x, rstd, gamma, rows, C);
  }
  void gelu_forward(T* y, const T* x, std::size_t n, bool exact) override {
    cuda::gelu_forward(y, x, n, exact);
  }
  void gelu_backward(T* dx, const T* dy, const T* x, std::size_t n, bool exact) override {
    cuda::gelu_backward(dx, dy, x, n, exact);
  }
  void relu_forward(T* y, const T* x, std::size_t n) override { cuda::relu_forward(y, x, n); }
  void relu_backward(T* dx, const T* dy, const T* x, std::size_t n) override {
    cuda::relu_backward(dx, dy, x, n);
  }
  void dropout(T* y, const T* x, std::size_t n, double p, std::uint64_t key,
               std::uint32_t stream) override {
    cuda::dropout(y, x, n, p, key, stream);
  }
  void linear_forward(T* y, const T* x, const T* w, const T* b, std::size_t rows, std::size_t in,
                      std::size_t out) override {
    cuda::linear_forward(y, x, w, b, rows, in, out);
  }
  void linear_backward(T* dx, T* dw, T* db, const T* dy, const T* x, const T* w, std::size_t rows,
                       std::size_t in, std::size_t out) override {
    cuda::linear_backward(dx, dw, db, dy, x, w, rows, in, out);
  }
  void softmax_cross_entropy(T* loss, T* dlogits, T* row_loss, const T* logits, const int* targets,
                             std::size_t rows, std::size_t V, int ignore_index) override {
    cuda::softmax_cross_entropy(loss, dlogits, row_loss, logits, targets, rows, V, ignore_index);
  }

  void sdpa_reference_forward(T* out, T* p, const AttentionParams<T>& args) override {
    cuda::sdpa_reference_forward(out, p, args);
  }
  void sdpa_reference_backward(T* dq, T* dk, T* dv, T* ds, const T* dout, const T* p,
                               const AttentionParams<T>& args) override {
    cuda::sdpa_reference_backward(dq, dk, dv, ds, dout, p, args);
  }
  void sdpa_fused_forward(T* out, T* lse, const AttentionParams<T>& args) override {
    cuda::sdpa_fused_forward(out, lse, args);
  }
  void sdpa_fused_backward(T* dq, T* dk, T* dv, T* row_dot, const T* dout, const T* out,
                           const T* lse, const AttentionParams<T>& args) override {
    cuda::sdpa_fused_backward(dq, dk, dv, row_dot, dout, out, lse, args);
  }
  void check_fused(std::size_t D, std::size_t Dv) override {
    (void)cuda::sdpa_fused_tile_rows<T>(D, Dv);
  }

  void adamw_update(T* param, T* m, T* v, const T* grad, std::size_t n,
                    const cuda_math::AdamWScalars<T>& scalars) override {
    cuda::adamw_update(param, m, v, grad, n, scalars);
  }
  void sgd_update(T* param, T* buf, const T* grad, std::size_t n, T lr, T momentum, T weight_decay,
                  bool first_step) override {
    cuda::sgd_update(param, buf, grad, n, lr, momentum, weight_decay, first_step);
  }
  void sum_of_squares(double* out, double* partial, const T* x, std::size_t n) override {
    cuda::sum_of_squares(out, partial, x, n);
  }
  std::size_t sum_of_squares_scratch() const override { return cuda::sum_of_squares_scratch(); }

  void synchronize() override { cuda::synchronize(); }

 private:
  std::mutex mutex_;
  std::unordered_multimap<std::size_t, void*> cached_;  // free blocks by size
  std::unordered_map<void*, std::size_t> live_;         // handed-out blocks and their sizes
};

}  // namespace

template <class T>
std::unique_ptr<DeviceOps<T>> make_cuda_device_ops() {
  cuda::require_device("make_cuda_device_ops");
  return std::make_unique<CudaDeviceOps<T>>();
}

template std::unique_ptr<DeviceOps<float>> make_cuda_device_ops<float>();
template std::unique_ptr<DeviceOps<double>> make_cuda_device_ops<double>();

}  // namespace attnlab
