// Launch glue of the training-step kernels (train_kernels.cuh; contracts in
// attnlab/cuda_train.hpp).
#include <cstddef>
#include <limits>
#include <stdexcept>
#include <string>

#include "attnlab/cuda.hpp"
#include "attnlab/cuda_train.hpp"
#include "check.hpp"
#include "train_kernels.cuh"

namespace attnlab::cuda {

namespace {

using namespace train;

// One block per row: rows must fit the grid's x extent.
unsigned row_grid(std::size_t rows, const char* op) {
  if (rows > static_cast<std::size_t>(std::numeric_limits<int>::max())) {
    throw std::invalid_argument(std::string(op) + ": " + std::to_string(rows) + " rows, at most " +
                                std::to_string(std::numeric_limits<int>::max()));
  }
  return static_cast<unsigned>(rows);
}

unsigned column_blocks(std::size_t columns) {
  return static_cast<unsigned>(cm::tile_count(columns, kElementThreads));
}

int as_int(std::size_t n, const char* op) {
  if (n > static_cast<std::size_t>(std::numeric_limits<int>::max())) {
    throw std::invalid_argument(std::string(op) + ": extent " + std::to_string(n) +
                                " too large for cuBLAS");
  }
  return static_cast<int>(n);
}

}  // namespace

template <class T>
void embedding_forward(T* y, const int* ids, const T* table, std::size_t rows, std::size_t C) {
  if (rows == 0 || C == 0) return;
  embedding_forward_kernel<T>
      <<<row_grid(rows, "embedding_forward"), kRowThreads>>>(y, ids, table, C);
  ATTNLAB_CUDA_CHECK_LAUNCH();
}

template <class T>
void embedding_backward(T* dtable, const T* dy, const int* ids, std::size_t rows, std::size_t V,
                        std::size_t C) {
  if (V == 0 || C == 0) return;
  embedding_backward_kernel<T>
      <<<row_grid(V, "embedding_backward"), kRowThreads>>>(dtable, dy, ids, rows, C);
  ATTNLAB_CUDA_CHECK_LAUNCH();
}

template <class T>
void layernorm_forward(T* y, T* mean, T* rstd, const T* x, const T* gamma, const T* beta,
                       std::size_t rows, std::size_t C, T eps) {
  if (rows == 0 || C == 0) return;
  layernorm_forward_kernel<T>
      <<<row_grid(rows, "layernorm_forward"), kRowThreads>>>(y, mean, rstd, x, gamma, beta, C, eps);
  ATTNLAB_CUDA_CHECK_LAUNCH();
}

template <class T>
void layernorm_backward(T* dx, T* dgamma, T* dbeta, const T* dy, const T* x, const T* mean,
                        const T* rstd, const T* gamma, std::size_t rows, std::size_t C) {
  if (C == 0) return;
  if (rows > 0) {
    norm_backward_rows_kernel<T>
        <<<row_grid(rows, "layernorm_backward"), kRowThreads>>>(dx, dy, x, mean, rstd, gamma, C);
    ATTNLAB_CUDA_CHECK_LAUNCH();
  }
  norm_backward_columns_kernel<T>
      <<<column_blocks(C), kElementThreads>>>(dgamma, dbeta, dy, x, mean, rstd, rows, C);
  ATTNLAB_CUDA_CHECK_LAUNCH();
}

template <class T>
void rmsnorm_forward(T* y, T* rstd, const T* x, const T* gamma, std::size_t rows, std::size_t C,
                     T eps) {
  if (rows == 0 || C == 0) return;
  rmsnorm_forward_kernel<T>
      <<<row_grid(rows, "rmsnorm_forward"), kRowThreads>>>(y, rstd, x, gamma, C, eps);
  ATTNLAB_CUDA_CHECK_LAUNCH();
}

template <class T>
void rmsnorm_backward(T* dx, T* dgamma, const T* dy, const T* x, const T* rstd, const T* gamma,
                      std::size_t rows, std::size_t C) {
  if (C == 0) return;
  if (rows > 0) {
    norm_backward_rows_kernel<T><<<row_grid(rows, "rmsnorm_backward"), kRowThreads>>>(
        dx, dy, x, static_cast<const T*>(nullptr), rstd, gamma, C);
    ATTNLAB_CUDA_CHECK_LAUNCH();
  }
  norm_backward_columns_kernel<T><<<column_blocks(C), kElementThreads>>>(
      dgamma, static_cast<T*>(nullptr), dy, x, static_cast<const T*>(nullptr), rstd, rows, C);
  ATTNLAB_CUDA_CHECK_LAUNCH();
}

template <class T>
void add(T* y, const T* a, const T* b, std::size_t n) {
  if (n == 0) return;
  add_kernel<T><<<element_blocks(n), kElementThreads>>>(y, a, b, n);
  ATTNLAB_CUDA_CHECK_LAUNCH();
}

template <class T>
void scale(T* x, T factor, std::size_t n) {
  if (n == 0) return;
  scale_by_value_kernel<T><<<element_blocks(n), kElementThreads>>>(x, factor, n);
  ATTNLAB_CUDA_CHECK_LAUNCH();
}

template <class T>
void exp_elements(T* y, const T* x, std::size_t n) {
  if (n == 0) return;
  exp_kernel<T><<<element_blocks(n), kElementThreads>>>(y, x, n);
  ATTNLAB_CUDA_CHECK_LAUNCH();
}

template <class T>
void add_bias(T* y, const T* b, std::size_t rows, std::size_t C) {
  if (rows == 0 || C == 0) return;
  add_bias_kernel<T><<<element_blocks(rows * C), kElementThreads>>>(y, b, rows, C);
  ATTNLAB_CUDA_CHECK_LAUNCH();
}

template <class T>
void column_sum(T* db, const T* dy, std::size_t rows, std::size_t C) {
  if (C == 0) return;
  column_sum_kernel<T><<<column_blocks(C), kElementThreads>>>(db, dy, rows, C);
  ATTNLAB_CUDA_CHECK_LAUNCH();
}

template <class T>
void split_heads(T* out, const T* x, std::size_t B, std::size_t Tn, std::size_t H, std::size_t D) {
  const std::size_t n = B * Tn * H * D;
  if (n == 0) return;
  permute_heads_kernel<T><<<element_blocks(n), kElementThreads>>>(out, x, B, Tn, H, D, true);
  ATTNLAB_CUDA_CHECK_LAUNCH();
}

template <class T>
void merge_heads(T* out, const T* x, std::size_t B, std::size_t Tn, std::size_t H, std::size_t D) {
  const std::size_t n = B * Tn * H * D;
  if (n == 0) return;
  permute_heads_kernel<T><<<element_blocks(n), kElementThreads>>>(out, x, B, Tn, H, D, false);
  ATTNLAB_CUDA_CHECK_LAUNCH();
}

template <class T>
void head_dot(T* out, const T* a, const T* c, std::size_t B, std::size_t H, std::size_t n) {
  if (H == 0) return;
  head_dot_kernel<T><<<row_grid(H, "head_dot"), kRowThreads>>>(out, a, c, B, H, n);
  ATTNLAB_CUDA_CHECK_LAUNCH();
}

template <class T>
void gelu_forward(T* y, const T* x, std::size_t n, bool exact) {
  if (n == 0) return;
  gelu_forward_kernel<T><<<element_blocks(n), kElementThreads>>>(y, x, n, exact);
  ATTNLAB_CUDA_CHECK_LAUNCH();
}

template <class T>
void gelu_backward(T* dx, const T* dy, const T* x, std::size_t n, bool exact) {
  if (n == 0) return;
  gelu_backward_kernel<T><<<element_blocks(n), kElementThreads>>>(dx, dy, x, n, exact);
  ATTNLAB_CUDA_CHECK_LAUNCH();
}

template <class T>
void relu_forward(T* y, const T* x, std::size_t n) {
  if (n == 0) return;
  relu_forward_kernel<T><<<element_blocks(n), kElementThreads>>>(y, x, n);
  ATTNLAB_CUDA_CHECK_LAUNCH();
}

template <class T>
void relu_backward(T* dx, const T* dy, const T* x, std::size_t n) {
  if (n == 0) return;
  relu_backward_kernel<T><<<element_blocks(n), kElementThreads>>>(dx, dy, x, n);
  ATTNLAB_CUDA_CHECK_LAUNCH();
}

template <class T>
void dropout(T* y, const T* x, std::size_t n, double p, std::uint64_t key, std::uint32_t stream) {
  if (n == 0) return;
  dropout_kernel<T><<<element_blocks(n), kElementThreads>>>(y, x, n, p, key, stream);
  ATTNLAB_CUDA_CHECK_LAUNCH();
}

template <class T>
void linear_forward(T* y, const T* x, const T* w, const T* b, std::size_t rows, std::size_t in,
                    std::size_t out) {
  if (rows == 0 || out == 0) return;
  const int m = as_int(rows, "linear_forward"), k = as_int(in, "linear_forward"),
            n = as_int(out, "linear_forward");
  // y = x W                                               (rows,In) x (In,Out) -> (rows,Out)
  gemm_strided_batched<T>(false, false, m, n, k, T(1), x, k, 0, w, n, 0, T(0), y, n, 0, 1);
  if (b) {
    add_bias_kernel<T><<<element_blocks(rows * out), kElementThreads>>>(y, b, rows, out);
    ATTNLAB_CUDA_CHECK_LAUNCH();
  }
}

template <class T>
void linear_backward(T* dx, T* dw, T* db, const T* dy, const T* x, const T* w, std::size_t rows,
                     std::size_t in, std::size_t out) {
  const int m = as_int(rows, "linear_backward"), k = as_int(in, "linear_backward"),
            n = as_int(out, "linear_backward");
  // dx = dy Wᵀ                                            (rows,Out) x (Out,In) -> (rows,In)
  if (dx) gemm_strided_batched<T>(false, true, m, k, n, T(1), dy, n, 0, w, n, 0, T(0), dx, k, 0, 1);
  // dW = xᵀ dy                                            (In,rows) x (rows,Out) -> (In,Out)
  gemm_strided_batched<T>(true, false, k, n, m, T(1), x, k, 0, dy, n, 0, T(0), dw, n, 0, 1);
  if (db && out > 0) {
    column_sum_kernel<T><<<column_blocks(out), kElementThreads>>>(db, dy, rows, out);
    ATTNLAB_CUDA_CHECK_LAUNCH();
  }
}

template <class T>
void softmax_cross_entropy(T* loss, T* dlogits, T* row_loss, const T* logits, const int* targets,
                           std::size_t rows, std::size_t V, int ignore_index) {
  DeviceArray<T> inv_n(1);
  if (rows > 0 && V > 0) {
    cross_entropy_rows_kernel<T><<<row_grid(rows, "softmax_cross_entropy"), kRowThreads>>>(
        row_loss, dlogits, logits, targets, V, ignore_index);
    ATTNLAB_CUDA_CHECK_LAUNCH();
  }
  cross_entropy_mean_kernel<T>
      <<<1, kRowThreads>>>(loss, inv_n.data(), row_loss, targets, rows, V, ignore_index);
  ATTNLAB_CUDA_CHECK_LAUNCH();
  if (rows > 0 && V > 0) {
    scale_kernel<T><<<element_blocks(rows * V), kElementThreads>>>(dlogits, inv_n.data(), rows * V);
    ATTNLAB_CUDA_CHECK_LAUNCH();
  }
  synchronize();  // inv_n is freed on return
}

template <class T>
void adamw_update(T* param, T* m, T* v, const T* grad, std::size_t n,
                  const cuda_math::AdamWScalars<T>& scalars) {
  if (n == 0) return;
  adamw_kernel<T><<<element_blocks(n), kElementThreads>>>(param, m, v, grad, n, scalars);
  ATTNLAB_CUDA_CHECK_LAUNCH();
}

template <class T>
void sgd_update(T* param, T* buf, const T* grad, std::size_t n, T lr, T momentum, T weight_decay,
                bool first_step) {
  if (n == 0) return;
  sgd_kernel<T><<<element_blocks(n), kElementThreads>>>(param, buf, grad, n, lr, momentum,
                                                        weight_decay, first_step);
  ATTNLAB_CUDA_CHECK_LAUNCH();
}

std::size_t sum_of_squares_scratch() {
  return kSumBlocks;
}

template <class T>
void sum_of_squares(double* out, double* partial, const T* x, std::size_t n) {
  sum_of_squares_partial_kernel<T><<<kSumBlocks, kElementThreads>>>(partial, x, n);
  ATTNLAB_CUDA_CHECK_LAUNCH();
  sum_partials_kernel<double><<<1, kElementThreads>>>(out, partial, kSumBlocks);
  ATTNLAB_CUDA_CHECK_LAUNCH();
}

#define ATTNLAB_INSTANTIATE(T)                                                                    \
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
ATTNLAB_INSTANTIATE(float)
ATTNLAB_INSTANTIATE(double)
#undef ATTNLAB_INSTANTIATE

}  // namespace attnlab::cuda
