// Reference GPU attention: cuBLAS strided-batched GEMMs for Q Kᵀ, P V and the four backward
// products, around two row kernels (masked scaled softmax, softmax backward). The readable
// definition that the fused path (attention_fused.cu) is tested against.
#include <cstddef>
#include <limits>
#include <stdexcept>
#include <string>

#include "attnlab/cuda.hpp"
#include "attnlab/cuda_attention.hpp"
#include "attnlab/cuda_math.hpp"
#include "check.hpp"
#include "reduce.cuh"

namespace attnlab::cuda {

namespace {

namespace cm = cuda_math;
constexpr int kRowThreads = 256;

// One block per row (bh, i) of S (B,H,Tq,Tk): P = softmax(s_h · S) over the visible keys, in place.
// Writes every element: 0 at hidden positions and in rows with no visible key.
template <class T>
__global__ void __launch_bounds__(kRowThreads)
    masked_softmax_rows(T* scores, const T* scale, const unsigned char* key_mask, std::size_t H,
                        std::size_t Tq, std::size_t Tk, bool causal) {
  __shared__ T max_scratch[32], sum_scratch[32];
  const std::size_t row = blockIdx.x, bh = row / Tq, i = row % Tq;
  const std::size_t b = cm::batch_of(bh, H);
  const T s = scale[cm::head_of(bh, H)];
  T* x = scores + row * Tk;
  const auto visible = [&](std::size_t j) {
    return cm::key_visible(i, j, causal,
                           key_mask == nullptr || key_mask[cm::key_mask_offset(b, j, Tk)] != 0);
  };
  cm::OnlineSoftmax<T> state;
  for (std::size_t j = threadIdx.x; j < Tk; j += blockDim.x) {
    state.add(visible(j) ? s * x[j] : cm::negative_infinity<T>());
  }
  state = detail::block_merge(state, max_scratch, sum_scratch);
  const T inverse_sum = state.inverse_sum();
  for (std::size_t j = threadIdx.x; j < Tk; j += blockDim.x) {
    x[j] = visible(j) ? cm::exp_shifted(s * x[j], state.max) * inverse_sum : T(0);
  }
}

// One block per row: dS = s_h · P ⊙ (dP − rowsum(dP ⊙ P)), in place over dP.
template <class T>
__global__ void __launch_bounds__(kRowThreads)
    softmax_backward_rows(T* dp, const T* p, const T* scale, std::size_t H, std::size_t Tq,
                          std::size_t Tk) {
  __shared__ T scratch[32];
  const std::size_t row = blockIdx.x;
  const T s = scale[cm::head_of(row / Tq, H)];
  T* g = dp + row * Tk;
  const T* w = p + row * Tk;
  T dot = 0;
  for (std::size_t j = threadIdx.x; j < Tk; j += blockDim.x) dot += g[j] * w[j];
  dot = detail::block_sum(dot, scratch);
  for (std::size_t j = threadIdx.x; j < Tk; j += blockDim.x) {
    g[j] = s * cm::softmax_backward_element(w[j], g[j], dot);
  }
}

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
void sdpa_reference_forward(T* out, T* p, const SdpaDeviceArgs<T>& a) {
  const int m = as_int(a.Tq, "Tq"), n = as_int(a.Tk, "Tk"), d = as_int(a.D, "D"),
            dv = as_int(a.Dv, "Dv"), batch = as_int(a.B * a.H, "B*H");
  const std::size_t rows = a.B * a.H * a.Tq;
  if (rows == 0) return;
  // S = Q Kᵀ, unscaled (the scale is per head)          (Tq,D) x (D,Tk) -> (Tq,Tk), per (b,h)
  gemm_strided_batched<T>(false, true, m, n, d, T(1), a.q, d, a.Tq * a.D, a.k, d, a.Tk * a.D, T(0),
                          p, n, a.Tq * a.Tk, batch);
  masked_softmax_rows<T>
      <<<grid_of(rows), kRowThreads>>>(p, a.scale, a.key_mask, a.H, a.Tq, a.Tk, a.causal);
  ATTNLAB_CUDA_CHECK_LAUNCH();
  // O = P V                                              (Tq,Tk) x (Tk,Dv) -> (Tq,Dv)
  gemm_strided_batched<T>(false, false, m, dv, n, T(1), p, n, a.Tq * a.Tk, a.v, dv, a.Tk * a.Dv,
                          T(0), out, dv, a.Tq * a.Dv, batch);
}

template <class T>
void sdpa_reference_backward(T* dq, T* dk, T* dv, T* ds, const T* dout, const T* p,
                             const SdpaDeviceArgs<T>& a) {
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
  template void sdpa_reference_forward<T>(T*, T*, const SdpaDeviceArgs<T>&);   \
  template void sdpa_reference_backward<T>(T*, T*, T*, T*, const T*, const T*, \
                                           const SdpaDeviceArgs<T>&);
ATTNLAB_INSTANTIATE(float)
ATTNLAB_INSTANTIATE(double)
#undef ATTNLAB_INSTANTIATE

}  // namespace attnlab::cuda
