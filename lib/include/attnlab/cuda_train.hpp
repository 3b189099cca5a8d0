// Training-step kernels on the GPU, on raw device pointers: the pieces of a transformer step beside
// attention (attnlab/cuda_attention.hpp). Each mirrors a CPU op and its contract:
//   embedding      attnlab/ops/embedding.hpp      (kNoToken = -1: zero row, no gradient)
//   layernorm      attnlab/ops/layernorm.hpp      (biased variance, eps inside the root)
//   rmsnorm        attnlab/ops/rmsnorm.hpp
//   gelu           attnlab/ops/gelu.hpp           (tanh approximation or exact)
//   linear         attnlab/ops/linear.hpp         (W stored (In, Out): y = x W + b; cuBLAS + bias)
//   cross-entropy  attnlab/ops/cross_entropy.hpp  (fused softmax, ignore index, mean over labelled)
//   adamw          attnlab/optim/adamw.hpp        (torch.optim.AdamW's order of operations)
//   sum_of_squares attnlab/optim/clip.hpp         (the global grad norm², accumulated in double)
// Rows are the flattened leading axes of row-major tensors. Every output is assigned (backward
// passes return fresh gradients; nothing is accumulated), every reduction runs in a fixed order
// (deterministic, no atomics). Asynchronous on the default stream; T = float or double. Without the
// CUDA backend every function throws CudaError. No CUDA type appears here.
#pragma once

#include <cstddef>
#include <cstdint>

#include "attnlab/cuda_math.hpp"

namespace attnlab::cuda {

// y (rows, C) = table[ids] with table (V, C); ids (rows,) in [0, V) or -1 (row of zeros).
template <class T>
void embedding_forward(T* y, const int* ids, const T* table, std::size_t rows, std::size_t C);

// dtable (V, C): row v = Σ of dy over the positions whose id is v, in position order; 0 for unused
// ids. dy (rows, C).
template <class T>
void embedding_backward(T* dtable, const T* dy, const int* ids, std::size_t rows, std::size_t V,
                        std::size_t C);

// y = γ ⊙ (x − μ) · rstd + β over rows of x (rows, C); saves mean and rstd (rows,).
template <class T>
void layernorm_forward(T* y, T* mean, T* rstd, const T* x, const T* gamma, const T* beta,
                       std::size_t rows, std::size_t C, T eps);

// dx (rows, C), dgamma (C,) = Σ_rows dy ⊙ x̂, dbeta (C,) = Σ_rows dy.
template <class T>
void layernorm_backward(T* dx, T* dgamma, T* dbeta, const T* dy, const T* x, const T* mean,
                        const T* rstd, const T* gamma, std::size_t rows, std::size_t C);

// y = γ ⊙ x · rstd, rstd = 1/√(mean(x²) + eps); saves rstd (rows,).
template <class T>
void rmsnorm_forward(T* y, T* rstd, const T* x, const T* gamma, std::size_t rows, std::size_t C,
                     T eps);

// dx (rows, C), dgamma (C,) = Σ_rows dy ⊙ x̂.
template <class T>
void rmsnorm_backward(T* dx, T* dgamma, const T* dy, const T* x, const T* rstd, const T* gamma,
                      std::size_t rows, std::size_t C);

// ---- elementwise, broadcast and head layout (the glue of a device-resident model) -------------

// y = a + b over n values (y may alias a or b).
template <class T>
void add(T* y, const T* a, const T* b, std::size_t n);

// x *= factor over n values (factor from the host).
template <class T>
void scale(T* x, T factor, std::size_t n);

// y = exp(x) over n values (y may alias x).
template <class T>
void exp_elements(T* y, const T* x, std::size_t n);

// y[r, c] += b[c] over y (rows, C), b (C,): the one launcher here that adds into its output.
template <class T>
void add_bias(T* y, const T* b, std::size_t rows, std::size_t C);

// db[c] = Σ_r dy[r, c] for dy (rows, C), rows in order; db (C,) is assigned (0 when rows = 0).
template <class T>
void column_sum(T* db, const T* dy, std::size_t rows, std::size_t C);

// out (B,H,T,D) = x (B,T,H·D) split into heads, and merge_heads its inverse: out (B,T,H·D) from
// x (B,H,T,D). out must not alias x.
template <class T>
void split_heads(T* out, const T* x, std::size_t B, std::size_t Tn, std::size_t H, std::size_t D);
template <class T>
void merge_heads(T* out, const T* x, std::size_t B, std::size_t Tn, std::size_t H, std::size_t D);

// out (H,) [h] = Σ_b Σ_i a[b, h, i] · c[b, h, i] for a, c (B, H, n): one block per head, each
// thread summing b in order then its strided share of i, then a block reduction (deterministic).
// out is 0 where B·n = 0.
template <class T>
void head_dot(T* out, const T* a, const T* c, std::size_t B, std::size_t H, std::size_t n);

// y = gelu(x) and dx = dy ⊙ gelu'(x), elementwise over n values.
template <class T>
void gelu_forward(T* y, const T* x, std::size_t n, bool exact);
template <class T>
void gelu_backward(T* dx, const T* dy, const T* x, std::size_t n, bool exact);
// y = max(x, 0) and dx = dy where x > 0 (else 0), elementwise over n values.
template <class T>
void relu_forward(T* y, const T* x, std::size_t n);
template <class T>
void relu_backward(T* dx, const T* dy, const T* x, std::size_t n);
// y = x ⊙ M / (1 − p) over n values, M from (key, stream) (attnlab/attention/dropout.hpp).
template <class T>
void dropout(T* y, const T* x, std::size_t n, double p, std::uint64_t key, std::uint32_t stream);

// y (rows, Out) = x (rows, In) · w (In, Out) + b (Out,); b may be null.
template <class T>
void linear_forward(T* y, const T* x, const T* w, const T* b, std::size_t rows, std::size_t in,
                    std::size_t out);

// dx = dy Wᵀ (skipped when dx is null), dw = xᵀ dy, db = Σ_rows dy (skipped when db is null).
template <class T>
void linear_backward(T* dx, T* dw, T* db, const T* dy, const T* x, const T* w, std::size_t rows,
                     std::size_t in, std::size_t out);

// Fused softmax cross-entropy over rows of logits (rows, V) with targets (rows,) in [0, V) or
// ignore_index. loss (1 value, device) = mean over labelled rows of −log softmax[target] (0 when
// none is labelled); dlogits (rows, V) = (softmax − onehot) / n on labelled rows, 0 elsewhere.
// row_loss (rows,) is scratch. Targets out of range are treated as unlabelled (the host API
// validates them).
template <class T>
void softmax_cross_entropy(T* loss, T* dlogits, T* row_loss, const T* logits, const int* targets,
                           std::size_t rows, std::size_t V, int ignore_index);

// One AdamW step over n values: param, m (exp_avg) and v (exp_avg_sq) updated in place from grad.
template <class T>
void adamw_update(T* param, T* m, T* v, const T* grad, std::size_t n,
                  const cuda_math::AdamWScalars<T>& scalars);

// One SGD step over n values (attnlab/optim/sgd.hpp, torch.optim.SGD with dampening 0), in place:
// g = grad + wd·p; buf = g on the first step, else momentum·buf + g; p −= lr·buf. buf (n,) is null
// when momentum is 0 (then p −= lr·g).
template <class T>
void sgd_update(T* param, T* buf, const T* grad, std::size_t n, T lr, T momentum, T weight_decay,
                bool first_step);

// The scalars of AdamW step t (1-based) for these options, formed in double as the CPU op does.
template <class T>
cuda_math::AdamWScalars<T> adamw_scalars(double lr, double beta1, double beta2, double eps,
                                         double weight_decay, std::size_t t);

// Σ x² over n values, accumulated in double: out (1 double, device). partial must hold
// sum_of_squares_scratch() doubles.
template <class T>
void sum_of_squares(double* out, double* partial, const T* x, std::size_t n);
std::size_t sum_of_squares_scratch();

}  // namespace attnlab::cuda
