// The one launch glue of the device kernels: DeviceOps (attnlab/device_ops.hpp) written once over
// the kernels of this folder (one .cuh per family: elementwise, norms, embedding, cross_entropy,
// optimizers, rope, attention_*_kernels), with every grid, block
// size, shared-memory size and argument list stated here and nowhere else. It is compiled twice:
//   by nvcc in cuda_device_ops.cu, with CudaRuntime (cudaMalloc with a caching allocator, <<<>>>
//   launches, cuBLAS), for the CUDA backend;
//   by the C++ compiler in lib/backends/emulated/src/emulated.cpp, with EmulatorRuntime (host
//   memory, the emulator of the CUDA thread model, attnlab's CPU BLAS), for the emulated device.
// So the emulated tests run the GPU's own launch code, grid for grid.
//
// A Runtime provides: name(); allocate/release/upload/download/copy/zero/synchronize (the
// DeviceMemory half); launch(kernel, grid, block, shared_bytes, args...); gemm<T>(...) with
// gemm_strided_batched's contract (attnlab/cuda.hpp: row-major, alpha, beta, strides per batch);
// shared_memory_limit() (opt-in bytes per block); kMaxStrideBlocks and kSumBlocks, the grid of the
// grid-stride kernels and the number of partial sums of sum_of_squares. Those two are the only
// launch sizes a runtime chooses, as CUDA code sizes grid-stride launches to the device: the GPU
// takes 1024 and 256, the emulator (whose cost is per emulated thread) a few blocks, so its tests
// run every grid-stride loop through many strides. Block sizes, shared memory and every other grid
// are the same on both.
//
// Include after the kernel headers' prerequisites: under nvcc nothing, on the CPU the emulator
// (attnlab/backends/cuda_emulator.hpp) first. The kernels carry nvcc's #pragma unroll.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <memory>
#include <stdexcept>
#include <string>
#include <type_traits>

#include "attention_fused_kernels.cuh"
#include "attention_program_kernels.cuh"
#include "attention_reference_kernels.cuh"
#include "attnlab/attention/programs.hpp"
#include "attnlab/device_ops.hpp"
#include "cross_entropy.cuh"
#include "elementwise.cuh"
#include "embedding.cuh"
#include "mixed_precision.hpp"
#include "norms.cuh"
#include "optimizers.cuh"
#include "rope.cuh"

namespace attnlab::cuda {

template <class T, class Runtime>
class KernelDeviceOps final : public DeviceOps<T> {
 public:
  KernelDeviceOps() = default;
  KernelDeviceOps(const KernelDeviceOps&) = delete;
  KernelDeviceOps& operator=(const KernelDeviceOps&) = delete;

  Runtime& runtime() { return rt_; }
  const Runtime& runtime() const { return rt_; }

  std::string name() const override { return rt_.name(); }

  // ---- precision (mixed_precision.hpp): bf16 and tf32 for float; double stays exact ------------
  void set_precision(GemmPrecision precision) override {
    if constexpr (std::is_same_v<T, float>) {
      precision_ = precision;
    } else {
      DeviceOps<T>::set_precision(precision);
    }
  }
  GemmPrecision precision() const override { return precision_; }
  bool fused_preferred(std::size_t D, std::size_t Dv) const override {
    return precision_ == GemmPrecision::bf16 && precision::tensor_core_dims(D, Dv);
  }

  // ---- memory -----------------------------------------------------------------------------------
  void* allocate(std::size_t bytes) override { return rt_.allocate(bytes); }
  void release(void* p) noexcept override { rt_.release(p); }
  void upload(void* device_dst, const void* host_src, std::size_t bytes) override {
    rt_.upload(device_dst, host_src, bytes);
  }
  void download(void* host_dst, const void* device_src, std::size_t bytes) override {
    rt_.download(host_dst, device_src, bytes);
  }
  void copy(void* device_dst, const void* device_src, std::size_t bytes) override {
    rt_.copy(device_dst, device_src, bytes);
  }
  void zero(void* device_dst, std::size_t bytes) override { rt_.zero(device_dst, bytes); }
  void synchronize() override { rt_.synchronize(); }

  // ---- elementwise and broadcast: grid-stride kernels ----------------------------------------
  void add(T* y, const T* a, const T* b, std::size_t n) override {
    if (n > 0) elements(kernels::add_kernel<T>, n, y, a, b, n);
  }
  void scale(T* x, T factor, std::size_t n) override {
    if (n > 0) elements(kernels::scale_by_value_kernel<T>, n, x, factor, n);
  }
  void exp(T* y, const T* x, std::size_t n) override {
    if (n > 0) elements(kernels::exp_kernel<T>, n, y, x, n);
  }
  void add_bias(T* y, const T* b, std::size_t rows, std::size_t C) override {
    if (rows > 0 && C > 0) elements(kernels::add_bias_kernel<T>, rows * C, y, b, rows, C);
  }
  void column_sum(T* db, const T* dy, std::size_t rows, std::size_t C) override {
    if (C > 0) columns(kernels::column_sum_kernel<T>, C, db, dy, rows, C);
  }

  // ---- heads ----------------------------------------------------------------------------------
  void split_heads(T* out, const T* x, std::size_t B, std::size_t Tn, std::size_t H,
                   std::size_t D) override {
    const std::size_t n = B * Tn * H * D;
    if (n > 0) elements(kernels::permute_heads_kernel<T>, n, out, x, B, Tn, H, D, true);
  }
  void merge_heads(T* out, const T* x, std::size_t B, std::size_t Tn, std::size_t H,
                   std::size_t D) override {
    const std::size_t n = B * Tn * H * D;
    if (n > 0) elements(kernels::permute_heads_kernel<T>, n, out, x, B, Tn, H, D, false);
  }
  void head_dot(T* out, const T* a, const T* c, std::size_t B, std::size_t H,
                std::size_t n) override {
    if (H > 0) per_row(kernels::head_dot_kernel<T>, H, n, "head_dot", out, a, c, B, H, n);
  }

  // ---- layers: one block per row, columns one thread each -----------------------------------
  void embedding_forward(T* y, const int* ids, const T* table, std::size_t rows,
                         std::size_t C) override {
    if (rows > 0 && C > 0) {
      per_row(kernels::embedding_forward_kernel<T>, rows, C, "embedding_forward", y, ids, table, C);
    }
  }
  void embedding_backward(T* dtable, const T* dy, const int* ids, std::size_t rows, std::size_t V,
                          std::size_t C) override {
    if (V > 0 && C > 0) {
      per_row(kernels::embedding_backward_kernel<T>, V, C, "embedding_backward", dtable, dy, ids,
              rows, C);
    }
  }
  void layernorm_forward(T* y, T* mean, T* rstd, const T* x, const T* gamma, const T* beta,
                         std::size_t rows, std::size_t C, T eps) override {
    if (rows > 0 && C > 0) {
      per_row(kernels::layernorm_forward_kernel<T>, rows, C, "layernorm_forward", y, mean, rstd, x,
              gamma, beta, C, eps);
    }
  }
  void layernorm_backward(T* dx, T* dgamma, T* dbeta, const T* dy, const T* x, const T* mean,
                          const T* rstd, const T* gamma, std::size_t rows, std::size_t C) override {
    if (C == 0) return;
    if (rows > 0) {
      per_row(kernels::norm_backward_rows_kernel<T>, rows, C, "layernorm_backward", dx, dy, x, mean,
              rstd, gamma, C);
    }
    columns(kernels::norm_backward_columns_kernel<T>, C, dgamma, dbeta, dy, x, mean, rstd, rows, C);
  }
  void rmsnorm_forward(T* y, T* rstd, const T* x, const T* gamma, std::size_t rows, std::size_t C,
                       T eps) override {
    if (rows > 0 && C > 0) {
      per_row(kernels::rmsnorm_forward_kernel<T>, rows, C, "rmsnorm_forward", y, rstd, x, gamma, C,
              eps);
    }
  }
  void rmsnorm_backward(T* dx, T* dgamma, const T* dy, const T* x, const T* rstd, const T* gamma,
                        std::size_t rows, std::size_t C) override {
    if (C == 0) return;
    const T* no_mean = nullptr;  // RMSNorm: x̂ = x · rstd, no mean(g) term
    if (rows > 0) {
      per_row(kernels::norm_backward_rows_kernel<T>, rows, C, "rmsnorm_backward", dx, dy, x,
              no_mean, rstd, gamma, C);
    }
    columns(kernels::norm_backward_columns_kernel<T>, C, dgamma, static_cast<T*>(nullptr), dy, x,
            no_mean, rstd, rows, C);
  }
  void gelu_forward(T* y, const T* x, std::size_t n, bool exact) override {
    if (n > 0) elements(kernels::gelu_forward_kernel<T>, n, y, x, n, exact);
  }
  void gelu_backward(T* dx, const T* dy, const T* x, std::size_t n, bool exact) override {
    if (n > 0) elements(kernels::gelu_backward_kernel<T>, n, dx, dy, x, n, exact);
  }
  void relu_forward(T* y, const T* x, std::size_t n) override {
    if (n > 0) elements(kernels::relu_forward_kernel<T>, n, y, x, n, false);
  }
  void relu_backward(T* dx, const T* dy, const T* x, std::size_t n) override {
    if (n > 0) elements(kernels::relu_backward_kernel<T>, n, dx, dy, x, n, false);
  }
  void relu_squared_forward(T* y, const T* x, std::size_t n) override {
    if (n > 0) elements(kernels::relu_forward_kernel<T>, n, y, x, n, true);
  }
  void relu_squared_backward(T* dx, const T* dy, const T* x, std::size_t n) override {
    if (n > 0) elements(kernels::relu_backward_kernel<T>, n, dx, dy, x, n, true);
  }
  void swiglu_forward(T* y, const T* h, std::size_t rows, std::size_t F) override {
    if (rows * F > 0) elements(kernels::swiglu_forward_kernel<T>, rows * F, y, h, rows * F, F);
  }
  void swiglu_backward(T* dh, const T* dy, const T* h, std::size_t rows, std::size_t F) override {
    if (rows * F > 0) {
      elements(kernels::swiglu_backward_kernel<T>, rows * F, dh, dy, h, rows * F, F);
    }
  }
  void softcap_forward(T* y, const T* x, std::size_t n, T cap) override {
    if (n > 0) elements(kernels::softcap_forward_kernel<T>, n, y, x, n, cap);
  }
  void softcap_backward(T* dx, const T* dy, const T* y, std::size_t n, T cap) override {
    if (n > 0) elements(kernels::softcap_backward_kernel<T>, n, dx, dy, y, n, cap);
  }
  void rope(T* x, const T* cos, const T* sin, const kernel_math::RopeShape& shape) override {
    const std::size_t pairs = shape.slices * shape.Tn * (shape.rot / 2);
    if (pairs > 0) elements(kernels::rope_kernel<T>, pairs, x, cos, sin, shape, pairs);
  }
  void dropout(T* y, const T* x, std::size_t n, double p, std::uint64_t key,
               std::uint32_t stream) override {
    if (n > 0) elements(kernels::dropout_kernel<T>, n, y, x, n, p, key, stream);
  }
  // With w_transposed, W (and dW) are stored (Out,In): the same GEMMs with W's transpose flag
  // flipped and its leading dimension In, and dW as dyᵀ x. Nothing is kept in an OperandKeep: each
  // GEMM rounds its own operands (mixed_precision.hpp).
  void linear_forward(T* y, const T* x, const T* w, const T* b, std::size_t rows, std::size_t in,
                      std::size_t out, bool w_transposed, OperandKeep* /*keep*/) override {
    if (rows == 0 || out == 0) return;
    const int m = as_int(rows, "linear_forward"), k = as_int(in, "linear_forward"),
              n = as_int(out, "linear_forward");
    // y = x W                                               (rows,In) x (In,Out) -> (rows,Out)
    gemm_at_precision(false, w_transposed, m, n, k, T(1), x, k, 0, w, w_transposed ? k : n, 0, T(0),
                      y, n, 0, 1);
    if (b) add_bias(y, b, rows, out);
  }
  void linear_backward(T* dx, T* dw, T* db, const T* dy, const T* x, const T* w, std::size_t rows,
                       std::size_t in, std::size_t out, bool w_transposed, bool accumulate_dw,
                       OperandKeep* /*keep*/) override {
    const int m = as_int(rows, "linear_backward"), k = as_int(in, "linear_backward"),
              n = as_int(out, "linear_backward");
    const T beta = accumulate_dw ? T(1) : T(0);
    // dx = dy Wᵀ                                            (rows,Out) x (Out,In) -> (rows,In)
    if (dx) {
      gemm_at_precision(false, !w_transposed, m, k, n, T(1), dy, n, 0, w, w_transposed ? k : n, 0,
                        T(0), dx, k, 0, 1);
    }
    if (w_transposed) {  // dW = dyᵀ x                       (Out,rows) x (rows,In) -> (Out,In)
      gemm_at_precision(true, false, n, k, m, T(1), dy, n, 0, x, k, 0, beta, dw, k, 0, 1);
    } else {  // dW = xᵀ dy                                  (In,rows) x (rows,Out) -> (In,Out)
      gemm_at_precision(true, false, k, n, m, T(1), x, k, 0, dy, n, 0, beta, dw, n, 0, 1);
    }
    if (db && out > 0) column_sum(db, dy, rows, out);
  }
  void softmax_cross_entropy(T* loss, T* dlogits, T* row_loss, const T* logits, const int* targets,
                             std::size_t rows, std::size_t V, int ignore_index, T z_loss) override {
    Scratch<T> inv_n(rt_, 1);  // 1 / #labelled, written by the mean kernel
    if (rows > 0 && V > 0) {
      per_row(kernels::cross_entropy_rows_kernel<T>, rows, V, "softmax_cross_entropy", row_loss,
              dlogits, logits, targets, rows, V, ignore_index, z_loss);
    }
    rt_.launch(kernels::cross_entropy_mean_kernel<T>, dim3(1),
               dim3(detail::row_threads(rows, kernels::kRowThreads)), 0, loss, inv_n.data,
               static_cast<const T*>(row_loss), targets, rows, V, ignore_index);
    if (rows > 0 && V > 0) {
      elements(kernels::scale_kernel<T>, rows * V, dlogits, static_cast<const T*>(inv_n.data),
               rows * V);
    }
  }

  // ---- attention: the reference path --------------------------------------------------------
  // Grouped-query attention: query head h reads K/V head h / g (g = H / Hkv). The (b, h) slices of
  // q that read K/V slice j are bh = j·g + r, so for each r in turn one strided-batched GEMM over
  // the B·Hkv K/V slices covers them (q-side strides times g); dK and dV add over r (beta 1 after
  // r = 0).
  void sdpa_reference_forward(T* out, T* p, const AttentionParams<T>& a) override {
    reference_forward(out, p, a, nullptr);
  }
  void sdpa_reference_backward(T* dq, T* dk, T* dv, T* ds, const T* dout, const T* p,
                               const AttentionParams<T>& a) override {
    reference_backward(dq, dk, dv, ds, dout, p, a, nullptr);
  }
  void sdpa_reference_program_forward(T* out, T* p, const AttentionParams<T>& a,
                                      const ReferenceRows<T>& rows) override {
    reference_forward(out, p, a, &rows);
  }
  void sdpa_reference_program_backward(T* dq, T* dk, T* dv, T* ds, const T* dout, const T* p,
                                       const AttentionParams<T>& a,
                                       const ReferenceRows<T>& rows) override {
    reference_backward(dq, dk, dv, ds, dout, p, a, &rows);
  }

  // Packed documents' mask as a program of this file's compiler (attention_program_kernels.cuh).
  std::shared_ptr<const DevicePrograms> document_mask_program(const std::int32_t* ids,
                                                              std::size_t length) override {
    return std::make_shared<const DevicePrograms>(
        device_program(fused::NoScore{}, attention::masks::DocumentIds{ids, length, true, true}));
  }

  // ---- attention: the fused path (attention_fused_kernels.cuh) ------------------------------
  void sdpa_fused_forward(T* out, T* lse, const AttentionParams<T>& a) override {
    check_attention_params(a, "sdpa_fused_forward");
    if (a.B * a.H * a.Tq == 0) return;
    if constexpr (std::is_same_v<T, float>) {
      if (precision::tensor_cores(precision_, a)) return precision::tc_forward(rt_, out, lse, a);
    }
    const int tile = tile_rows(a.D, a.Dv);
    check_fused_grid(a, tile);
    if (tile == 64) {
      fused_forward<64>(out, lse, a);
    } else {
      fused_forward<16>(out, lse, a);
    }
  }
  void sdpa_fused_backward(T* dq, T* dk, T* dv, T* row_dot, const T* dout, const T* out,
                           const T* lse, const AttentionParams<T>& a) override {
    check_attention_params(a, "sdpa_fused_backward");
    const std::size_t rows = a.B * a.H * a.Tq;
    if (rows == 0) return;
    if constexpr (std::is_same_v<T, float>) {
      if (precision::tensor_cores(precision_, a)) {
        return precision::tc_backward(rt_, dq, dk, dv, row_dot, dout, out, lse, a);
      }
    }
    const int tile = tile_rows(a.D, a.Dv);
    check_fused_grid(a, tile);
    // D = rowsum(dO ⊙ O), one warp per row
    rt_.launch(
        fused::row_dot_kernel<T>,
        dim3(static_cast<unsigned>(kernel_math::tile_count(rows, fused::kRowDotRowsPerBlock))),
        dim3(fused::kThreads), 0, row_dot, dout, out, rows, a.Dv);
    if (tile == 64) {
      fused_backward<64>(dq, dk, dv, dout, lse, static_cast<const T*>(row_dot), a);
    } else {
      fused_backward<16>(dq, dk, dv, dout, lse, static_cast<const T*>(row_dot), a);
    }
  }
  void check_fused(std::size_t D, std::size_t Dv) override { (void)tile_rows(D, Dv); }

  // ---- optimizers and norms ------------------------------------------------------------------
  void adamw_update(T* param, T* m, T* v, const T* grad, std::size_t n,
                    const kernel_math::AdamWScalars<T>& scalars) override {
    if (n > 0) elements(kernels::adamw_kernel<T>, n, param, m, v, grad, n, scalars);
  }
  void sgd_update(T* param, T* buf, const T* grad, std::size_t n, T lr, T momentum, T weight_decay,
                  bool first_step) override {
    if (n > 0) {
      elements(kernels::sgd_kernel<T>, n, param, buf, grad, n, lr, momentum, weight_decay,
               first_step);
    }
  }
  // Runtime::kSumBlocks partial sums, then their sum in one block: a fixed order, no atomics.
  void sum_of_squares(double* out, double* partial, const T* x, std::size_t n) override {
    rt_.launch(kernels::sum_of_squares_partial_kernel<T>, dim3(Runtime::kSumBlocks),
               dim3(kernels::kElementThreads), 0, partial, x, n);
    rt_.launch(kernels::sum_partials_kernel<double>, dim3(1), dim3(kernels::kElementThreads), 0,
               out, static_cast<const double*>(partial), std::size_t{Runtime::kSumBlocks});
  }
  std::size_t sum_of_squares_scratch() const override { return Runtime::kSumBlocks; }

  // ---- Muon ------------------------------------------------------------------------------------
  void gemm(bool trans_a, bool trans_b, std::size_t m, std::size_t n, std::size_t k, T alpha,
            const T* a, std::size_t lda, const T* b, std::size_t ldb, T beta, T* c,
            std::size_t ldc) override {
    gemm_at_precision(trans_a, trans_b, as_int(m, "gemm"), as_int(n, "gemm"), as_int(k, "gemm"),
                      alpha, a, as_int(lda, "gemm"), 0, b, as_int(ldb, "gemm"), 0, beta, c,
                      as_int(ldc, "gemm"), 0, 1);
  }
  void muon_momentum(T* u, T* m, const T* g, std::size_t n, T beta, T one_minus_beta,
                     bool nesterov) override {
    if (n > 0)
      elements(kernels::muon_momentum_kernel<T>, n, u, m, g, n, beta, one_minus_beta, nesterov);
  }
  void divide_by_norm(T* x, const double* sum_of_squares, std::size_t n, T eps) override {
    if (n > 0) elements(kernels::divide_by_norm_kernel<T>, n, x, sum_of_squares, n, eps);
  }
  void axpby(T* y, const T* x, std::size_t n, T a, T b) override {
    if (n > 0) elements(kernels::axpby_kernel<T>, n, y, x, n, a, b);
  }

 private:
  // Device scratch for the length of one call, released on return (after the queued work: the
  // runtimes' release is stream-ordered or synchronous).
  template <class U>
  struct Scratch {
    Runtime& rt;
    U* data;
    Scratch(Runtime& r, std::size_t n)
        : rt(r), data(n ? static_cast<U*>(r.allocate(n * sizeof(U))) : nullptr) {}
    ~Scratch() { rt.release(data); }
    Scratch(const Scratch&) = delete;
    Scratch& operator=(const Scratch&) = delete;
  };

  // The GEMM extents and strides of one attention call.
  struct Gemm {
    int m, n, d, dv, batch;
    long long g, sp, sq, sk, sv, so;
    explicit Gemm(const AttentionParams<T>& a)
        : m(as_int(a.Tq, "sdpa: Tq")),
          n(as_int(a.Tk, "sdpa: Tk")),
          d(as_int(a.D, "sdpa: D")),
          dv(as_int(a.Dv, "sdpa: Dv")),
          batch(as_int(a.B * a.Hkv, "sdpa: B*Hkv")),
          g(static_cast<long long>(a.group())),
          sp(static_cast<long long>(a.Tq * a.Tk)),
          sq(static_cast<long long>(a.Tq * a.D)),
          sk(static_cast<long long>(a.Tk * a.D)),
          sv(static_cast<long long>(a.Tk * a.Dv)),
          so(static_cast<long long>(a.Tq * a.Dv)) {}
  };

  static int as_int(std::size_t n, const char* op) {
    if (n > static_cast<std::size_t>(std::numeric_limits<int>::max())) {
      throw std::invalid_argument(std::string(op) + ": extent " + std::to_string(n) +
                                  " too large for a GEMM");
    }
    return static_cast<int>(n);
  }

  // Elementwise kernels stride over n with at most Runtime::kMaxStrideBlocks blocks.
  template <class Kernel, class... Args>
  void elements(Kernel kernel, std::size_t n, Args... args) {
    rt_.launch(kernel, dim3(kernels::element_blocks(n, Runtime::kMaxStrideBlocks)),
               dim3(kernels::kElementThreads), 0, args...);
  }
  // Column reductions: one thread per column.
  template <class Kernel, class... Args>
  void columns(Kernel kernel, std::size_t C, Args... args) {
    rt_.launch(kernel,
               dim3(static_cast<unsigned>(kernel_math::tile_count(C, kernels::kElementThreads))),
               dim3(kernels::kElementThreads), 0, args...);
  }
  // Row kernels: one block per row; rows must fit the grid's x extent.
  // The reference path; rows: an attention program's row kernels in place of the built-in rule's.
  void reference_forward(T* out, T* p, const AttentionParams<T>& a,
                         const ReferenceRows<T>* program) {
    check_attention_params(a, "sdpa_reference_forward");
    const std::size_t rows = a.B * a.H * a.Tq, g = a.group();
    if (rows == 0) return;
    const Gemm s(a);
    for (std::size_t r = 0; r < g; ++r) {
      // S = Q Kᵀ, unscaled (the scale is per head)        (Tq,D) x (D,Tk) -> (Tq,Tk), per (b,h)
      gemm_at_precision(false, true, s.m, s.n, s.d, T(1), a.q + r * s.sq, s.d, s.g * s.sq, a.k, s.d,
                        s.sk, T(0), p + r * s.sp, s.n, s.g * s.sp, s.batch);
    }
    if (program != nullptr) {
      program->softmax(program->context, p, a);
    } else {
      per_row(reference::masked_softmax_rows<T>, rows, a.Tk, "sdpa_reference_forward", p, a);
    }
    // With dropout, O = (P ⊙ M / (1 − p)) V from a temporary copy: p keeps the weights.
    Scratch<T> dropped(rt_, a.dropout_p != 0 ? rows * a.Tk : 0);
    if (a.dropout_p != 0) {
      per_row(reference::dropout_rows<T>, rows, a.Tk, "sdpa_reference_forward", dropped.data,
              static_cast<const T*>(p), a);
    }
    const T* weights = a.dropout_p != 0 ? dropped.data : p;
    for (std::size_t r = 0; r < g; ++r) {
      // O = P V                                            (Tq,Tk) x (Tk,Dv) -> (Tq,Dv)
      gemm_at_precision(false, false, s.m, s.dv, s.n, T(1), weights + r * s.sp, s.n, s.g * s.sp,
                        a.v, s.dv, s.sv, T(0), out + r * s.so, s.dv, s.g * s.so, s.batch);
    }
  }
  void reference_backward(T* dq, T* dk, T* dv, T* ds, const T* dout, const T* p,
                          const AttentionParams<T>& a, const ReferenceRows<T>* program) {
    check_attention_params(a, "sdpa_reference_backward");
    const std::size_t rows = a.B * a.H * a.Tq, g = a.group();
    if (rows == 0) return;
    const Gemm s(a);
    // With dropout, dV = (P ⊙ M / (1 − p))ᵀ dO from a temporary copy, and dP ⊙= M / (1 − p).
    Scratch<T> dropped(rt_, a.dropout_p != 0 ? rows * a.Tk : 0);
    if (a.dropout_p != 0) {
      per_row(reference::dropout_rows<T>, rows, a.Tk, "sdpa_reference_backward", dropped.data, p,
              a);
    }
    const T* weights = a.dropout_p != 0 ? dropped.data : p;
    for (std::size_t r = 0; r < g; ++r) {
      const T beta = r == 0 ? T(0) : T(1);
      // dV (+)= Pᵀ dO                                      (Tk,Tq) x (Tq,Dv) -> (Tk,Dv)
      gemm_at_precision(true, false, s.n, s.dv, s.m, T(1), weights + r * s.sp, s.n, s.g * s.sp,
                        dout + r * s.so, s.dv, s.g * s.so, beta, dv, s.dv, s.sv, s.batch);
      // dP = dO Vᵀ                                         (Tq,Dv) x (Dv,Tk) -> (Tq,Tk)
      gemm_at_precision(false, true, s.m, s.n, s.dv, T(1), dout + r * s.so, s.dv, s.g * s.so, a.v,
                        s.dv, s.sv, T(0), ds + r * s.sp, s.n, s.g * s.sp, s.batch);
    }
    if (a.dropout_p != 0) {
      per_row(reference::dropout_rows<T>, rows, a.Tk, "sdpa_reference_backward", ds,
              static_cast<const T*>(ds), a);
    }
    // With a softcap or a program, the backward needs U = s · Q Kᵀ again: Q Kᵀ, unscaled, once
    // more
    const bool need_dots = a.softcap != 0 || program != nullptr;
    Scratch<T> dots(rt_, need_dots ? rows * a.Tk : 0);
    for (std::size_t r = 0; need_dots && r < g; ++r) {
      gemm_at_precision(false, true, s.m, s.n, s.d, T(1), a.q + r * s.sq, s.d, s.g * s.sq, a.k, s.d,
                        s.sk, T(0), dots.data + r * s.sp, s.n, s.g * s.sp, s.batch);
    }
    // s_h · dS (⊙ the cap's slope), dS = P ⊙ (dP − rowsum(dP ⊙ P)), in place; dS to a.dscores
    if (program != nullptr) {
      program->backward(program->context, ds, p, dots.data, a);
    } else {
      per_row(reference::softmax_backward_rows<T>, rows, a.Tk, "sdpa_reference_backward", ds,
              a.dscores, p, static_cast<const T*>(dots.data), a);
    }
    for (std::size_t r = 0; r < g; ++r) {
      const T beta = r == 0 ? T(0) : T(1);
      const T* dsr = ds + r * s.sp;
      // dQ = dS K                                          (Tq,Tk) x (Tk,D) -> (Tq,D)
      gemm_at_precision(false, false, s.m, s.d, s.n, T(1), dsr, s.n, s.g * s.sp, a.k, s.d, s.sk,
                        T(0), dq + r * s.sq, s.d, s.g * s.sq, s.batch);
      // dK (+)= dSᵀ Q                                      (Tk,Tq) x (Tq,D) -> (Tk,D)
      gemm_at_precision(true, false, s.n, s.d, s.m, T(1), dsr, s.n, s.g * s.sp, a.q + r * s.sq, s.d,
                        s.g * s.sq, beta, dk, s.d, s.sk, s.batch);
    }
  }

  template <class Kernel, class... Args>
  void per_row(Kernel kernel, std::size_t rows, std::size_t width, const char* op, Args... args) {
    if (rows > static_cast<std::size_t>(std::numeric_limits<int>::max())) {
      throw std::invalid_argument(std::string(op) + ": " + std::to_string(rows) +
                                  " rows, at most " +
                                  std::to_string(std::numeric_limits<int>::max()));
    }
    rt_.launch(kernel, dim3(static_cast<unsigned>(rows)),
               dim3(detail::row_threads(width, kernels::kRowThreads)), 0, args...);
  }

  // The fused kernels' shared memory for tile rows `tile`, and the largest tile that fits.
  static std::size_t most_smem(std::size_t D, std::size_t Dv, int tile) {
    const fused::Geometry g(D, Dv, tile);
    return std::max({fused::forward_smem<T>(g, tile), fused::key_pass_smem<T>(g, tile),
                     fused::query_pass_smem<T>(g, tile)});
  }
  int tile_rows(std::size_t D, std::size_t Dv) {
    const std::size_t limit = rt_.shared_memory_limit();
    if (most_smem(D, Dv, 64) <= limit) return 64;
    if (most_smem(D, Dv, 16) <= limit) return 16;
    throw std::invalid_argument("sdpa fused: head dims D = " + std::to_string(D) +
                                ", Dv = " + std::to_string(Dv) + " need " +
                                std::to_string(most_smem(D, Dv, 16)) +
                                " bytes of shared memory, the device has " + std::to_string(limit) +
                                "; use the reference path");
  }
  static void check_fused_grid(const AttentionParams<T>& a, int tile) {
    const std::size_t tiles = kernel_math::tile_count(std::max(a.Tq, a.Tk), tile);
    if (a.B * a.H > 65535 || tiles > 0x7fffffffu) {
      throw std::invalid_argument("sdpa fused: B*H = " + std::to_string(a.B * a.H) +
                                  " exceeds 65535 (grid y); use the reference path");
    }
  }
  template <int TILE>
  void fused_forward(T* out, T* lse, const AttentionParams<T>& a) {
    const fused::Geometry g(a.D, a.Dv, TILE);
    rt_.launch(fused::fused_forward_kernel<T, TILE>, fused::packed_query_grid(a, TILE),
               dim3(fused::kThreads), fused::forward_smem<T>(g, TILE), out, lse, a);
  }
  template <int TILE>
  void fused_backward(T* dq, T* dk, T* dv, const T* dout, const T* lse, const T* row_dot,
                      const AttentionParams<T>& a) {
    const fused::Geometry g(a.D, a.Dv, TILE);
    rt_.launch(fused::fused_key_pass_kernel<T, TILE>, fused::key_tile_grid(a, TILE),
               dim3(fused::kThreads), fused::key_pass_smem<T>(g, TILE), dk, dv, dout, lse, row_dot,
               a);
    rt_.launch(fused::fused_query_pass_kernel<T, TILE>, fused::query_tile_grid(a, TILE),
               dim3(fused::kThreads), fused::query_pass_smem<T>(g, TILE), dq, dout, lse, row_dot,
               a);
  }

  // Runtime::gemm<T> at this backend's precision.
  void gemm_at_precision(bool trans_a, bool trans_b, int m, int n, int k, T alpha, const T* a,
                         int lda, long long stride_a, const T* b, int ldb, long long stride_b,
                         T beta, T* c, int ldc, long long stride_c, int batch) {
    if constexpr (std::is_same_v<T, float>) {
      precision::gemm(rt_, precision_, trans_a, trans_b, m, n, k, alpha, a, lda, stride_a, b, ldb,
                      stride_b, beta, c, ldc, stride_c, batch);
    } else {
      rt_.template gemm<T>(trans_a, trans_b, m, n, k, alpha, a, lda, stride_a, b, ldb, stride_b,
                           beta, c, ldc, stride_c, batch);
    }
  }

  Runtime rt_;
  GemmPrecision precision_ = GemmPrecision::fp32;
};

}  // namespace attnlab::cuda
