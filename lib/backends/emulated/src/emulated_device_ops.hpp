// DeviceOps (attnlab/device_ops.hpp) on the CPU: the CUDA kernel sources of lib/cuda run under the
// emulator of the CUDA thread model (cuda_emulator.hpp) with the grids of the launch glue in
// lib/cuda/*.cu, and the GEMMs through attnlab's CPU BLAS (a loop over the batch where cuBLAS runs
// a strided-batched GEMM). "Device" memory is host memory, filled with 0xFF bytes (NaN) when
// allocated so that an output a kernel never wrote shows up. Private to the emulated backend:
// emulated.cpp alone includes it and instantiates it for float and double.
//
// Blocks are smaller than on the GPU (kBlock = 64 threads for the row and element kernels, which
// are written for any multiple of 32); the fused attention kernels need their 256 threads. Grids
// whose kernels stride over their range are kept short: the emulator's cost is per block.
//
// Compiled with -Wno-unknown-pragmas: the kernels carry nvcc's #pragma unroll.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstring>
#include <limits>
#include <new>
#include <stdexcept>
#include <string>
#include <vector>

#include "attnlab/blas.hpp"
#include "attnlab/cuda_train.hpp"
#include "attnlab/device_ops.hpp"

// clang-format off
#include "attnlab/backends/cuda_emulator.hpp"
#include "attention_fused_kernels.cuh"
#include "attention_reference_kernels.cuh"
#include "train_kernels.cuh"
// clang-format on

namespace attnlab::emulated {

namespace emu_train = attnlab::cuda::train;
namespace emu_fused = attnlab::cuda::fused;

template <class T>
class EmulatedDeviceOps final : public DeviceOps<T> {
 public:
  // Threads per block of the row and element kernels (256 on the GPU).
  static constexpr unsigned kBlock = 64;
  // The opt-in shared memory per block of an H100/H200 (227 KiB): check_fused and the fused tile
  // choice follow the device the CUDA path would most likely run on.
  static constexpr std::size_t kSharedMemoryLimit = 232448;

  EmulatedDeviceOps() = default;
  EmulatedDeviceOps(const EmulatedDeviceOps&) = delete;
  EmulatedDeviceOps& operator=(const EmulatedDeviceOps&) = delete;

  // Allocations not yet released (for leak tests).
  std::size_t live_allocations() const { return live_; }

  std::string name() const override { return "emulated (CPU)"; }

  // ---- memory -----------------------------------------------------------------------------------
  void* allocate(std::size_t bytes) override {
    if (bytes == 0) return nullptr;
    void* p = ::operator new(bytes, kAlignment);
    std::memset(p, 0xFF, bytes);
    ++live_;
    return p;
  }
  void release(void* p) noexcept override {
    if (p == nullptr) return;
    ::operator delete(p, kAlignment);
    --live_;
  }
  void upload(void* device_dst, const void* host_src, std::size_t bytes) override {
    if (bytes > 0) std::memcpy(device_dst, host_src, bytes);
  }
  void download(void* host_dst, const void* device_src, std::size_t bytes) override {
    if (bytes > 0) std::memcpy(host_dst, device_src, bytes);
  }
  void copy(void* device_dst, const void* device_src, std::size_t bytes) override {
    if (bytes > 0) std::memmove(device_dst, device_src, bytes);
  }
  void zero(void* device_dst, std::size_t bytes) override {
    if (bytes > 0) std::memset(device_dst, 0, bytes);
  }

  // ---- elementwise and broadcast -------------------------------------------------------------
  void add(T* y, const T* a, const T* b, std::size_t n) override {
    if (n > 0) emu::launch(emu_train::add_kernel<T>, element_grid(n), block(), 0, y, a, b, n);
  }
  void scale(T* x, T factor, std::size_t n) override {
    if (n > 0)
      emu::launch(emu_train::scale_by_value_kernel<T>, element_grid(n), block(), 0, x, factor, n);
  }
  void exp(T* y, const T* x, std::size_t n) override {
    if (n > 0) emu::launch(emu_train::exp_kernel<T>, element_grid(n), block(), 0, y, x, n);
  }
  void add_bias(T* y, const T* b, std::size_t rows, std::size_t C) override {
    if (rows > 0 && C > 0) {
      emu::launch(emu_train::add_bias_kernel<T>, element_grid(rows * C), block(), 0, y, b, rows, C);
    }
  }
  void column_sum(T* db, const T* dy, std::size_t rows, std::size_t C) override {
    if (C > 0)
      emu::launch(emu_train::column_sum_kernel<T>, column_grid(C), block(), 0, db, dy, rows, C);
  }

  // ---- heads --------------------------------------------------------------------------------
  void split_heads(T* out, const T* x, std::size_t B, std::size_t Tn, std::size_t H,
                   std::size_t D) override {
    const std::size_t n = B * Tn * H * D;
    if (n > 0) {
      emu::launch(emu_train::permute_heads_kernel<T>, element_grid(n), block(), 0, out, x, B, Tn, H,
                  D, true);
    }
  }
  void merge_heads(T* out, const T* x, std::size_t B, std::size_t Tn, std::size_t H,
                   std::size_t D) override {
    const std::size_t n = B * Tn * H * D;
    if (n > 0) {
      emu::launch(emu_train::permute_heads_kernel<T>, element_grid(n), block(), 0, out, x, B, Tn, H,
                  D, false);
    }
  }
  void head_dot(T* out, const T* a, const T* c, std::size_t B, std::size_t H,
                std::size_t n) override {
    if (H > 0)
      emu::launch(emu_train::head_dot_kernel<T>, row_grid(H), block(), 0, out, a, c, B, H, n);
  }

  // ---- layers -------------------------------------------------------------------------------
  void embedding_forward(T* y, const int* ids, const T* table, std::size_t rows,
                         std::size_t C) override {
    if (rows > 0 && C > 0) {
      emu::launch(emu_train::embedding_forward_kernel<T>, row_grid(rows), block(), 0, y, ids, table,
                  C);
    }
  }
  void embedding_backward(T* dtable, const T* dy, const int* ids, std::size_t rows, std::size_t V,
                          std::size_t C) override {
    if (V > 0 && C > 0) {
      emu::launch(emu_train::embedding_backward_kernel<T>, row_grid(V), block(), 0, dtable, dy, ids,
                  rows, C);
    }
  }
  void layernorm_forward(T* y, T* mean, T* rstd, const T* x, const T* gamma, const T* beta,
                         std::size_t rows, std::size_t C, T eps) override {
    if (rows > 0 && C > 0) {
      emu::launch(emu_train::layernorm_forward_kernel<T>, row_grid(rows), block(), 0, y, mean, rstd,
                  x, gamma, beta, C, eps);
    }
  }
  void layernorm_backward(T* dx, T* dgamma, T* dbeta, const T* dy, const T* x, const T* mean,
                          const T* rstd, const T* gamma, std::size_t rows, std::size_t C) override {
    if (C == 0) return;
    if (rows > 0) {
      emu::launch(emu_train::norm_backward_rows_kernel<T>, row_grid(rows), block(), 0, dx, dy, x,
                  mean, rstd, gamma, C);
    }
    emu::launch(emu_train::norm_backward_columns_kernel<T>, column_grid(C), block(), 0, dgamma,
                dbeta, dy, x, mean, rstd, rows, C);
  }
  void rmsnorm_forward(T* y, T* rstd, const T* x, const T* gamma, std::size_t rows, std::size_t C,
                       T eps) override {
    if (rows > 0 && C > 0) {
      emu::launch(emu_train::rmsnorm_forward_kernel<T>, row_grid(rows), block(), 0, y, rstd, x,
                  gamma, C, eps);
    }
  }
  void rmsnorm_backward(T* dx, T* dgamma, const T* dy, const T* x, const T* rstd, const T* gamma,
                        std::size_t rows, std::size_t C) override {
    if (C == 0) return;
    const T* no_mean = nullptr;
    if (rows > 0) {
      emu::launch(emu_train::norm_backward_rows_kernel<T>, row_grid(rows), block(), 0, dx, dy, x,
                  no_mean, rstd, gamma, C);
    }
    emu::launch(emu_train::norm_backward_columns_kernel<T>, column_grid(C), block(), 0, dgamma,
                static_cast<T*>(nullptr), dy, x, no_mean, rstd, rows, C);
  }
  void gelu_forward(T* y, const T* x, std::size_t n, bool exact) override {
    if (n > 0)
      emu::launch(emu_train::gelu_forward_kernel<T>, element_grid(n), block(), 0, y, x, n, exact);
  }
  void gelu_backward(T* dx, const T* dy, const T* x, std::size_t n, bool exact) override {
    if (n > 0) {
      emu::launch(emu_train::gelu_backward_kernel<T>, element_grid(n), block(), 0, dx, dy, x, n,
                  exact);
    }
  }
  void relu_forward(T* y, const T* x, std::size_t n) override {
    if (n > 0) emu::launch(emu_train::relu_forward_kernel<T>, element_grid(n), block(), 0, y, x, n);
  }
  void relu_backward(T* dx, const T* dy, const T* x, std::size_t n) override {
    if (n > 0) {
      emu::launch(emu_train::relu_backward_kernel<T>, element_grid(n), block(), 0, dx, dy, x, n);
    }
  }
  void dropout(T* y, const T* x, std::size_t n, double p, std::uint64_t key,
               std::uint32_t stream) override {
    if (n > 0) {
      emu::launch(emu_train::dropout_kernel<T>, element_grid(n), block(), 0, y, x, n, p, key,
                  stream);
    }
  }
  void linear_forward(T* y, const T* x, const T* w, const T* b, std::size_t rows, std::size_t in,
                      std::size_t out) override {
    if (rows == 0 || out == 0) return;
    const int m = as_int(rows), k = as_int(in), n = as_int(out);
    // y = x W                                               (rows,In) x (In,Out) -> (rows,Out)
    gemm_batched(false, false, m, n, k, x, k, 0, w, n, 0, y, n, 0, 1);
    if (b) add_bias(y, b, rows, out);
  }
  void linear_backward(T* dx, T* dw, T* db, const T* dy, const T* x, const T* w, std::size_t rows,
                       std::size_t in, std::size_t out) override {
    const int m = as_int(rows), k = as_int(in), n = as_int(out);
    // dx = dy Wᵀ                                            (rows,Out) x (Out,In) -> (rows,In)
    if (dx) gemm_batched(false, true, m, k, n, dy, n, 0, w, n, 0, dx, k, 0, 1);
    // dW = xᵀ dy                                            (In,rows) x (rows,Out) -> (In,Out)
    gemm_batched(true, false, k, n, m, x, k, 0, dy, n, 0, dw, n, 0, 1);
    if (db && out > 0) column_sum(db, dy, rows, out);
  }
  void softmax_cross_entropy(T* loss, T* dlogits, T* row_loss, const T* logits, const int* targets,
                             std::size_t rows, std::size_t V, int ignore_index) override {
    T inv_n = T(0);  // device scratch of the CUDA path
    if (rows > 0 && V > 0) {
      emu::launch(emu_train::cross_entropy_rows_kernel<T>, row_grid(rows), block(), 0, row_loss,
                  dlogits, logits, targets, V, ignore_index);
    }
    emu::launch(emu_train::cross_entropy_mean_kernel<T>, dim3(1), block(), 0, loss, &inv_n,
                static_cast<const T*>(row_loss), targets, rows, V, ignore_index);
    if (rows > 0 && V > 0) {
      emu::launch(emu_train::scale_kernel<T>, element_grid(rows * V), block(), 0, dlogits,
                  static_cast<const T*>(&inv_n), rows * V);
    }
  }

  // ---- attention ----------------------------------------------------------------------------
  // attention_reference.cu's orchestration, with BLAS for cuBLAS: per group member r, one batched
  // GEMM over the B·Hkv K/V slices; dK and dV add over r.
  void sdpa_reference_forward(T* out, T* p, const AttentionParams<T>& a) override {
    check_attention_params(a, "emulated sdpa_reference_forward");
    const std::size_t rows = a.B * a.H * a.Tq, g = a.group();
    if (rows == 0) return;
    const int m = as_int(a.Tq), n = as_int(a.Tk), d = as_int(a.D), dv = as_int(a.Dv),
              batch = as_int(a.B * a.Hkv);
    const std::size_t sp = a.Tq * a.Tk, sq = a.Tq * a.D, sk = a.Tk * a.D, sv = a.Tk * a.Dv,
                      so = a.Tq * a.Dv;
    for (std::size_t r = 0; r < g; ++r) {
      // S = Q Kᵀ, unscaled (the scale is per head)        (Tq,D) x (D,Tk) -> (Tq,Tk), per (b,h)
      gemm_batched(false, true, m, n, d, a.q + r * sq, d, g * sq, a.k, d, sk, p + r * sp, n, g * sp,
                   batch);
    }
    emu::launch(cuda::reference::masked_softmax_rows<T>, row_grid(rows), block(), 0, p, a);
    // With dropout, O = (P ⊙ M / (1 − p)) V from a temporary copy: p keeps the weights.
    std::vector<T> dropped(a.dropout_p != 0 ? rows * a.Tk : 0);
    if (a.dropout_p != 0) {
      emu::launch(cuda::reference::dropout_rows<T>, row_grid(rows), block(), 0, dropped.data(),
                  static_cast<const T*>(p), a);
    }
    const T* weights = a.dropout_p != 0 ? dropped.data() : p;
    for (std::size_t r = 0; r < g; ++r) {
      // O = P V                                            (Tq,Tk) x (Tk,Dv) -> (Tq,Dv)
      gemm_batched(false, false, m, dv, n, weights + r * sp, n, g * sp, a.v, dv, sv, out + r * so,
                   dv, g * so, batch);
    }
  }
  void sdpa_reference_backward(T* dq, T* dk, T* dv, T* ds, const T* dout, const T* p,
                               const AttentionParams<T>& a) override {
    check_attention_params(a, "emulated sdpa_reference_backward");
    const std::size_t rows = a.B * a.H * a.Tq, g = a.group();
    if (rows == 0) return;
    const int m = as_int(a.Tq), n = as_int(a.Tk), d = as_int(a.D), dvw = as_int(a.Dv),
              batch = as_int(a.B * a.Hkv);
    const std::size_t sp = a.Tq * a.Tk, sq = a.Tq * a.D, sk = a.Tk * a.D, sv = a.Tk * a.Dv,
                      so = a.Tq * a.Dv;
    // With dropout, dV = (P ⊙ M / (1 − p))ᵀ dO from a temporary copy, and dP ⊙= M / (1 − p).
    std::vector<T> dropped(a.dropout_p != 0 ? rows * a.Tk : 0);
    if (a.dropout_p != 0) {
      emu::launch(cuda::reference::dropout_rows<T>, row_grid(rows), block(), 0, dropped.data(), p,
                  a);
    }
    const T* weights = a.dropout_p != 0 ? dropped.data() : p;
    for (std::size_t r = 0; r < g; ++r) {
      const T beta = r == 0 ? T(0) : T(1);
      // dV (+)= Pᵀ dO                                      (Tk,Tq) x (Tq,Dv) -> (Tk,Dv)
      gemm_batched(true, false, n, dvw, m, weights + r * sp, n, g * sp, dout + r * so, dvw, g * so,
                   dv, dvw, sv, batch, beta);
      // dP = dO Vᵀ                                         (Tq,Dv) x (Dv,Tk) -> (Tq,Tk)
      gemm_batched(false, true, m, n, dvw, dout + r * so, dvw, g * so, a.v, dvw, sv, ds + r * sp, n,
                   g * sp, batch);
    }
    if (a.dropout_p != 0) {
      emu::launch(cuda::reference::dropout_rows<T>, row_grid(rows), block(), 0, ds,
                  static_cast<const T*>(ds), a);
    }
    // s_h · dS, dS = P ⊙ (dP − rowsum(dP ⊙ P)), in place; dS to a.dscores when set
    emu::launch(cuda::reference::softmax_backward_rows<T>, row_grid(rows), block(), 0, ds,
                a.dscores, p, a.scale, a.H, a.Tq, a.Tk);
    for (std::size_t r = 0; r < g; ++r) {
      const T beta = r == 0 ? T(0) : T(1);
      // dQ = dS K                                          (Tq,Tk) x (Tk,D) -> (Tq,D)
      gemm_batched(false, false, m, d, n, static_cast<const T*>(ds + r * sp), n, g * sp, a.k, d, sk,
                   dq + r * sq, d, g * sq, batch);
      // dK (+)= dSᵀ Q                                      (Tk,Tq) x (Tq,D) -> (Tk,D)
      gemm_batched(true, false, n, d, m, static_cast<const T*>(ds + r * sp), n, g * sp,
                   a.q + r * sq, d, g * sq, dk, d, sk, batch, beta);
    }
  }
  void sdpa_fused_forward(T* out, T* lse, const AttentionParams<T>& a) override {
    check_attention_params(a, "emulated sdpa_fused_forward");
    if (a.B * a.H * a.Tq == 0) return;
    if (tile_rows(a.D, a.Dv) == 64) {
      fused_forward<64>(out, lse, a);
    } else {
      fused_forward<16>(out, lse, a);
    }
  }
  void sdpa_fused_backward(T* dq, T* dk, T* dv, T* row_dot, const T* dout, const T* out,
                           const T* lse, const AttentionParams<T>& a) override {
    check_attention_params(a, "emulated sdpa_fused_backward");
    const std::size_t rows = a.B * a.H * a.Tq;
    if (rows == 0) return;
    const int tile = tile_rows(a.D, a.Dv);
    // D = rowsum(dO ⊙ O), one warp per row
    emu::launch(
        emu_fused::row_dot_kernel<T>,
        dim3(static_cast<unsigned>(cuda_math::tile_count(rows, emu_fused::kRowDotRowsPerBlock))),
        dim3(emu_fused::kThreads), 0, row_dot, dout, out, rows, a.Dv);
    if (tile == 64) {
      fused_backward<64>(dq, dk, dv, dout, lse, row_dot, a);
    } else {
      fused_backward<16>(dq, dk, dv, dout, lse, row_dot, a);
    }
  }
  void check_fused(std::size_t D, std::size_t Dv) override { (void)tile_rows(D, Dv); }

  // ---- optimizers and norms ------------------------------------------------------------------
  void adamw_update(T* param, T* m, T* v, const T* grad, std::size_t n,
                    const cuda_math::AdamWScalars<T>& scalars) override {
    if (n > 0) {
      emu::launch(emu_train::adamw_kernel<T>, element_grid(n), block(), 0, param, m, v, grad, n,
                  scalars);
    }
  }
  void sgd_update(T* param, T* buf, const T* grad, std::size_t n, T lr, T momentum, T weight_decay,
                  bool first_step) override {
    if (n > 0) {
      emu::launch(emu_train::sgd_kernel<T>, element_grid(n), block(), 0, param, buf, grad, n, lr,
                  momentum, weight_decay, first_step);
    }
  }
  // partial[0 .. blocks) then their sum: the same two kernels with fewer partial blocks than the
  // GPU's kSumBlocks (each emulated block costs), at least 16 values per thread.
  void sum_of_squares(double* out, double* partial, const T* x, std::size_t n) override {
    const auto blocks = static_cast<unsigned>(
        std::clamp<std::size_t>(cuda_math::tile_count(n, 16 * kBlock), 1, emu_train::kSumBlocks));
    emu::launch(emu_train::sum_of_squares_partial_kernel<T>, dim3(blocks), block(), 0, partial, x,
                n);
    emu::launch(emu_train::sum_partials_kernel<double>, dim3(1), block(), 0, out,
                static_cast<const double*>(partial), std::size_t{blocks});
  }
  std::size_t sum_of_squares_scratch() const override { return emu_train::kSumBlocks; }

  void synchronize() override {}

 private:
  static constexpr std::align_val_t kAlignment{64};

  static dim3 block() { return dim3(kBlock); }
  // The launch glue's grids (train.cu), for kBlock-thread blocks: one block per row; columns one
  // thread each; elementwise kernels stride, so their grid is the GPU's (256-thread blocks) one.
  static dim3 row_grid(std::size_t rows) { return dim3(static_cast<unsigned>(rows)); }
  static dim3 column_grid(std::size_t columns) {
    return dim3(static_cast<unsigned>(cuda_math::tile_count(columns, kBlock)));
  }
  static dim3 element_grid(std::size_t n) { return dim3(emu_train::element_blocks(n)); }

  static int as_int(std::size_t n) {
    if (n > static_cast<std::size_t>(std::numeric_limits<int>::max())) {
      throw std::invalid_argument("emulated device ops: extent " + std::to_string(n) +
                                  " too large for a GEMM");
    }
    return static_cast<int>(n);
  }

  // cuBLAS's strided-batched GEMM with alpha = 1, beta = 0: one CPU GEMM per matrix.
  static void gemm_batched(bool trans_a, bool trans_b, int m, int n, int k, const T* a, int lda,
                           std::size_t stride_a, const T* b, int ldb, std::size_t stride_b, T* c,
                           int ldc, std::size_t stride_c, int batch, T beta = T(0)) {
    if (m == 0 || n == 0) return;
    for (int i = 0; i < batch; ++i) {
      const auto bi = static_cast<std::size_t>(i);
      blas::gemm<T>(trans_a, trans_b, m, n, k, T(1), a + bi * stride_a, lda, b + bi * stride_b, ldb,
                    beta, c + bi * stride_c, ldc);
    }
  }

  // sdpa_fused_tile_rows (attention_fused.cu) against kSharedMemoryLimit.
  static std::size_t most_smem(std::size_t D, std::size_t Dv, int tile) {
    const emu_fused::Geometry g(D, Dv, tile);
    return std::max({emu_fused::forward_smem<T>(g, tile), emu_fused::key_pass_smem<T>(g, tile),
                     emu_fused::query_pass_smem<T>(g, tile)});
  }
  static int tile_rows(std::size_t D, std::size_t Dv) {
    if (most_smem(D, Dv, 64) <= kSharedMemoryLimit) return 64;
    if (most_smem(D, Dv, 16) <= kSharedMemoryLimit) return 16;
    throw std::invalid_argument("emulated sdpa fused: head dims D = " + std::to_string(D) +
                                ", Dv = " + std::to_string(Dv) + " need " +
                                std::to_string(most_smem(D, Dv, 16)) +
                                " bytes of shared memory, the device has " +
                                std::to_string(kSharedMemoryLimit) + "; use the reference path");
  }

  template <int TILE>
  static void fused_forward(T* out, T* lse, const AttentionParams<T>& a) {
    const emu_fused::Geometry g(a.D, a.Dv, TILE);
    emu::launch(emu_fused::fused_forward_kernel<T, TILE>, emu_fused::packed_query_grid(a, TILE),
                dim3(emu_fused::kThreads), emu_fused::forward_smem<T>(g, TILE), out, lse, a);
  }
  template <int TILE>
  static void fused_backward(T* dq, T* dk, T* dv, const T* dout, const T* lse, const T* row_dot,
                             const AttentionParams<T>& a) {
    const emu_fused::Geometry g(a.D, a.Dv, TILE);
    emu::launch(emu_fused::fused_key_pass_kernel<T, TILE>, emu_fused::key_tile_grid(a, TILE),
                dim3(emu_fused::kThreads), emu_fused::key_pass_smem<T>(g, TILE), dk, dv, dout, lse,
                row_dot, a);
    emu::launch(emu_fused::fused_query_pass_kernel<T, TILE>, emu_fused::query_tile_grid(a, TILE),
                dim3(emu_fused::kThreads), emu_fused::query_pass_smem<T>(g, TILE), dq, dout, lse,
                row_dot, a);
  }

  std::size_t live_ = 0;
};

}  // namespace attnlab::emulated
