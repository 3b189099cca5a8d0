// Softmax cross-entropy (attnlab/ops/cross_entropy.hpp): the raw-pointer cores that the op pair
// (lib/src/ops/cross_entropy.cpp, where they are defined), the loss Module and the CPU backend's
// fused call (lib/backends/cpu) share; the CUDA kernels are lib/backends/cuda/cross_entropy.cuh,
// on the online softmax of attnlab/kernel_math.hpp. A row is labelled when its target is in [0, V)
// and is not ignore_index (the op validates targets first; the backend's contract treats
// out-of-range targets as unlabelled).
#pragma once

#include <cstddef>
#include <string>
#include <vector>

namespace attnlab::detail {

// p (rows, V) = softmax of every row of logits (p may be the buffer the backward writes into);
// row_loss (rows,) = −log p[target] and row_log_z (rows,) = log Z = logsumexp(logits row), in
// double on labelled rows, 0 elsewhere. Returns the number n of labelled rows; *loss (when not
// null) = the mean of row_loss over them and *z_term (when not null) = z_loss · the mean of
// log Z², each summed in row order (0 when none is labelled), so neither depends on the thread
// count.
template <class T>
std::size_t cross_entropy_forward_rows(T* loss, T* z_term, T* p, std::vector<double>& row_loss,
                                       std::vector<double>& row_log_z, const T* logits,
                                       const int* targets, std::size_t rows, std::size_t V,
                                       int ignore_index, double z_loss);

// dlogits (rows, V) = w · (p · (1 + 2 z_loss · log_z[r]) − onehot(target)) on labelled rows, 0
// elsewhere (assigns; dlogits may be p). w is dloss / n; log_z is the forward's row_log_z (read
// only when z_loss ≠ 0).
template <class T>
void cross_entropy_backward_rows(T* dlogits, const T* p, const int* targets, std::size_t rows,
                                 std::size_t V, int ignore_index, T w, const double* log_z,
                                 double z_loss);

// A real number for an error message ("%.6g").
std::string shown_number(double v);

}  // namespace attnlab::detail
