// Private to the CPU backend (cpu_device_ops.cpp): the row kernels of DeviceOps that have no
// raw-pointer core among the ops, written with the ops' arithmetic (same formulas, same order of
// the sums, same row cut: ../parallel_rows.hpp) so results match the CPU Modules. Contracts are
// those of attnlab/device_ops.hpp; every output is assigned. `scratch` vectors hold the per-chunk
// partial sums of the column reductions (resized here, kept by the caller between calls).
#pragma once

#include <cstddef>
#include <vector>

namespace attnlab::cpu_backend {

template <class T>
void layernorm_forward(T* y, T* mean, T* rstd, const T* x, const T* gamma, const T* beta,
                       std::size_t rows, std::size_t C, T eps);
template <class T>
void layernorm_backward(T* dx, T* dgamma, T* dbeta, const T* dy, const T* x, const T* mean,
                        const T* rstd, const T* gamma, std::size_t rows, std::size_t C,
                        std::vector<T>& scratch);
template <class T>
void rmsnorm_forward(T* y, T* rstd, const T* x, const T* gamma, std::size_t rows, std::size_t C,
                     T eps);
template <class T>
void rmsnorm_backward(T* dx, T* dgamma, const T* dy, const T* x, const T* rstd, const T* gamma,
                      std::size_t rows, std::size_t C, std::vector<T>& scratch);

// loss[0] = mean over labelled rows of −log softmax[target] (row losses summed in double, in row
// order, as cross_entropy_forward does); dlogits = (softmax − onehot) / n, 0 on unlabelled rows.
template <class T>
void softmax_cross_entropy(T* loss, T* dlogits, const T* logits, const int* targets,
                           std::size_t rows, std::size_t V, int ignore_index,
                           std::vector<double>& row_loss);

template <class T>
void embedding_forward(T* y, const int* ids, const T* table, std::size_t rows, std::size_t C);
template <class T>
void embedding_backward(T* dtable, const T* dy, const int* ids, std::size_t rows, std::size_t V,
                        std::size_t C);

// (B,T,H·D) <-> (B,H,T,D).
template <class T>
void permute_heads(T* out, const T* x, std::size_t B, std::size_t Tn, std::size_t H, std::size_t D,
                   bool split);

}  // namespace attnlab::cpu_backend
