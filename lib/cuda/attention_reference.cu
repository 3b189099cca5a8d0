// Reference GPU attention: cuBLAS strided-batched GEMMs for Q Kᵀ, P V and the four backward
// products, around two row kernels (masked scaled softmax, softmax backward). The readable
// definition that the fused path (attention_fused.cu) is tested against.
#include <cstddef>
#include <limits>
#include <stdexcept>
#include <string>

#include "attention_reference_kernels.cuh"
#include "attnlab/cuda.hpp"
#include "attnlab/cuda_attention.hpp"
#include "attnlab/cuda_math.hpp"
#include "check.hpp"

namespace attnlab::cuda {

namespace {

using namespace reference;

int as_int(std::size_t n, const char* what) {
  if (n > static_cast<std::size_t>(std::numeric_limits<int>::max())) {
    throw std::invalid_argument(std::string("cuda sdpa: ") + what + " too large for cuBLAS");
  }
  return static_cast<int>(n);
}

// One block per row: rows = B·H·Tq must fit the grid's x extent.
unsigned grid_of(std::size_t rows) {
  if (rows > static_cast<std::size_t>(std::numeric_limits<int>::max())) {
    throw std::invalid_argument("cuda sdpa: B*H*Tq = " + std::to_string(rows) + " rows, at most " +
                                std::to_string(std::numeric_limits<int>::max()));
  }
  return static_cast<unsigned>(rows);
}

// With dropout, P ⊙ M / (1 − p) in a new device array (dropout_rows over the rows of p); empty
// without dropout.
template <class T>
DeviceArray<T> dropped_weights(const T* p, const AttentionParams<T>& a, std::size_t rows) {
  DeviceArray<T> dropped;
  if (a.dropout_p == 0) return dropped;
  dropped = DeviceArray<T>(rows * a.Tk);
  dropout_rows<T><<<grid_of(rows), kRowThreads>>>(dropped.data(), p, a);
  ATTNLAB_CUDA_CHECK_LAUNCH();
  return dropped;
}

}  // namespace

// Grouped-query attention: query head h reads K/V head h / g (g = H / Hkv). The (b, h) slices of q
// that read K/V slice j are bh = j·g + r, so for each r in turn one strided-batched GEMM over the
// B·Hkv K/V slices covers them (q-side strides times g); dK and dV add over r (beta 1 after r = 0).
template <class T>
void sdpa_reference_forward(T* out, T* p, const AttentionParams<T>& a) {
  check_attention_params(a, "cuda::sdpa_reference_forward");
  const int m = as_int(a.Tq, "Tq"), n = as_int(a.Tk, "Tk"), d = as_int(a.D, "D"),
            dv = as_int(a.Dv, "Dv"), batch = as_int(a.B * a.Hkv, "B*Hkv");
  const std::size_t rows = a.B * a.H * a.Tq, g = a.group();
  if (rows == 0) return;
  const auto gl = static_cast<long long>(g);
  const long long sp = a.Tq * a.Tk, sq = a.Tq * a.D, sk = a.Tk * a.D, sv = a.Tk * a.Dv,
                  so = a.Tq * a.Dv;
  for (std::size_t r = 0; r < g; ++r) {
    // S = Q Kᵀ, unscaled (the scale is per head)        (Tq,D) x (D,Tk) -> (Tq,Tk), per (b,h)
    gemm_strided_batched<T>(false, true, m, n, d, T(1), a.q + r * sq, d, gl * sq, a.k, d, sk, T(0),
                            p + r * sp, n, gl * sp, batch);
  }
  masked_softmax_rows<T><<<grid_of(rows), kRowThreads>>>(p, a);
  ATTNLAB_CUDA_CHECK_LAUNCH();
  // With dropout, O = (P ⊙ M / (1 − p)) V from a temporary copy: p keeps the weights.
  const DeviceArray<T> dropped = dropped_weights(p, a, rows);
  const T* weights = a.dropout_p != 0 ? dropped.data() : p;
  for (std::size_t r = 0; r < g; ++r) {
    // O = P V                                            (Tq,Tk) x (Tk,Dv) -> (Tq,Dv)
    gemm_strided_batched<T>(false, false, m, dv, n, T(1), weights + r * sp, n, gl * sp, a.v, dv, sv,
                            T(0), out + r * so, dv, gl * so, batch);
  }
}

template <class T>
void sdpa_reference_backward(T* dq, T* dk, T* dv, T* ds, const T* dout, const T* p,
                             const AttentionParams<T>& a) {
  check_attention_params(a, "cuda::sdpa_reference_backward");
  const int m = as_int(a.Tq, "Tq"), n = as_int(a.Tk, "Tk"), d = as_int(a.D, "D"),
            dvw = as_int(a.Dv, "Dv"), batch = as_int(a.B * a.Hkv, "B*Hkv");
  const std::size_t rows = a.B * a.H * a.Tq, g = a.group();
  if (rows == 0) return;
  const auto gl = static_cast<long long>(g);
  const long long sp = a.Tq * a.Tk, sq = a.Tq * a.D, sk = a.Tk * a.D, sv = a.Tk * a.Dv,
                  so = a.Tq * a.Dv;
  // With dropout, dV = (P ⊙ M / (1 − p))ᵀ dO from a temporary copy, and dP ⊙= M / (1 − p).
  const DeviceArray<T> dropped = dropped_weights(p, a, rows);
  const T* weights = a.dropout_p != 0 ? dropped.data() : p;
  for (std::size_t r = 0; r < g; ++r) {
    const T beta = r == 0 ? T(0) : T(1);
    // dV (+)= Pᵀ dO                                      (Tk,Tq) x (Tq,Dv) -> (Tk,Dv)
    gemm_strided_batched<T>(true, false, n, dvw, m, T(1), weights + r * sp, n, gl * sp,
                            dout + r * so, dvw, gl * so, beta, dv, dvw, sv, batch);
    // dP = dO Vᵀ                                         (Tq,Dv) x (Dv,Tk) -> (Tq,Tk)
    gemm_strided_batched<T>(false, true, m, n, dvw, T(1), dout + r * so, dvw, gl * so, a.v, dvw, sv,
                            T(0), ds + r * sp, n, gl * sp, batch);
  }
  if (a.dropout_p != 0) {
    dropout_rows<T><<<grid_of(rows), kRowThreads>>>(ds, ds, a);
    ATTNLAB_CUDA_CHECK_LAUNCH();
  }
  // s_h · dS, dS = P ⊙ (dP − rowsum(dP ⊙ P)), in place; dS to a.dscores when set
  softmax_backward_rows<T>
      <<<grid_of(rows), kRowThreads>>>(ds, a.dscores, p, a.scale, a.H, a.Tq, a.Tk);
  ATTNLAB_CUDA_CHECK_LAUNCH();
  for (std::size_t r = 0; r < g; ++r) {
    const T beta = r == 0 ? T(0) : T(1);
    // dQ = dS K                                          (Tq,Tk) x (Tk,D) -> (Tq,D)
    gemm_strided_batched<T>(false, false, m, d, n, T(1), ds + r * sp, n, gl * sp, a.k, d, sk, T(0),
                            dq + r * sq, d, gl * sq, batch);
    // dK (+)= dSᵀ Q                                      (Tk,Tq) x (Tq,D) -> (Tk,D)
    gemm_strided_batched<T>(true, false, n, d, m, T(1), ds + r * sp, n, gl * sp, a.q + r * sq, d,
                            gl * sq, beta, dk, d, sk, batch);
  }
}

#define ATTNLAB_INSTANTIATE(T)                                                 \
  template void sdpa_reference_forward<T>(T*, T*, const AttentionParams<T>&);  \
  template void sdpa_reference_backward<T>(T*, T*, T*, T*, const T*, const T*, \
                                           const AttentionParams<T>&);
ATTNLAB_INSTANTIATE(float)
ATTNLAB_INSTANTIATE(double)
#undef ATTNLAB_INSTANTIATE

}  // namespace attnlab::cuda
