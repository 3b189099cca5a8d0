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

}  // namespace

template <class T>
void sdpa_reference_forward(T* out, T* p, const AttentionParams<T>& a) {
  check_attention_params(a, "cuda::sdpa_reference_forward");
  const int m = as_int(a.Tq, "Tq"), n = as_int(a.Tk, "Tk"), d = as_int(a.D, "D"),
            dv = as_int(a.Dv, "Dv"), batch = as_int(a.B * a.H, "B*H");
  const std::size_t rows = a.B * a.H * a.Tq;
  if (rows == 0) return;
  // S = Q Kᵀ, unscaled (the scale is per head)          (Tq,D) x (D,Tk) -> (Tq,Tk), per (b,h)
  gemm_strided_batched<T>(false, true, m, n, d, T(1), a.q, d, a.Tq * a.D, a.k, d, a.Tk * a.D, T(0),
                          p, n, a.Tq * a.Tk, batch);
  masked_softmax_rows<T><<<grid_of(rows), kRowThreads>>>(p, a);
  ATTNLAB_CUDA_CHECK_LAUNCH();
  // O = P V                                              (Tq,Tk) x (Tk,Dv) -> (Tq,Dv)
  gemm_strided_batched<T>(false, false, m, dv, n, T(1), p, n, a.Tq * a.Tk, a.v, dv, a.Tk * a.Dv,
                          T(0), out, dv, a.Tq * a.Dv, batch);
}

template <class T>
void sdpa_reference_backward(T* dq, T* dk, T* dv, T* ds, const T* dout, const T* p,
                             const AttentionParams<T>& a) {
  check_attention_params(a, "cuda::sdpa_reference_backward");
  const int m = as_int(a.Tq, "Tq"), n = as_int(a.Tk, "Tk"), d = as_int(a.D, "D"),
            dvw = as_int(a.Dv, "Dv"), batch = as_int(a.B * a.H, "B*H");
  const std::size_t rows = a.B * a.H * a.Tq;
  if (rows == 0) return;
  const long long sp = a.Tq * a.Tk, sq = a.Tq * a.D, sk = a.Tk * a.D, sv = a.Tk * a.Dv,
                  so = a.Tq * a.Dv;
  // dV = Pᵀ dO                                           (Tk,Tq) x (Tq,Dv) -> (Tk,Dv)
  gemm_strided_batched<T>(true, false, n, dvw, m, T(1), p, n, sp, dout, dvw, so, T(0), dv, dvw, sv,
                          batch);
  // dP = dO Vᵀ                                           (Tq,Dv) x (Dv,Tk) -> (Tq,Tk)
  gemm_strided_batched<T>(false, true, m, n, dvw, T(1), dout, dvw, so, a.v, dvw, sv, T(0), ds, n,
                          sp, batch);
  // dS = s_h · P ⊙ (dP − rowsum(dP ⊙ P)), in place
  softmax_backward_rows<T><<<grid_of(rows), kRowThreads>>>(ds, p, a.scale, a.H, a.Tq, a.Tk);
  ATTNLAB_CUDA_CHECK_LAUNCH();
  // dQ = dS K                                            (Tq,Tk) x (Tk,D) -> (Tq,D)
  gemm_strided_batched<T>(false, false, m, d, n, T(1), ds, n, sp, a.k, d, sk, T(0), dq, d, sq,
                          batch);
  // dK = dSᵀ Q                                           (Tk,Tq) x (Tq,D) -> (Tk,D)
  gemm_strided_batched<T>(true, false, n, d, m, T(1), ds, n, sp, a.q, d, sq, T(0), dk, d, sk,
                          batch);
}

#define ATTNLAB_INSTANTIATE(T)                                                 \
  template void sdpa_reference_forward<T>(T*, T*, const AttentionParams<T>&);  \
  template void sdpa_reference_backward<T>(T*, T*, T*, T*, const T*, const T*, \
                                           const AttentionParams<T>&);
ATTNLAB_INSTANTIATE(float)
ATTNLAB_INSTANTIATE(double)
#undef ATTNLAB_INSTANTIATE

}  // namespace attnlab::cuda
