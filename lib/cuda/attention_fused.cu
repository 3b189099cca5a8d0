// Launch glue of the fused GPU attention: tile selection by shared memory, grids, error checks.
// The kernels and their description are in attention_fused_kernels.cuh.
#include <algorithm>
#include <cstddef>
#include <stdexcept>
#include <string>

#include "attention_fused_kernels.cuh"
#include "attnlab/cuda.hpp"
#include "attnlab/cuda_attention.hpp"
#include "check.hpp"

namespace attnlab::cuda {

namespace {

using namespace fused;

// ---- launch glue ----------------------------------------------------------------------------

std::size_t shared_memory_limit() {
  int device = 0, bytes = 0;
  ATTNLAB_CUDA_CHECK(cudaGetDevice(&device));
  ATTNLAB_CUDA_CHECK(
      cudaDeviceGetAttribute(&bytes, cudaDevAttrMaxSharedMemoryPerBlockOptin, device));
  return static_cast<std::size_t>(bytes);
}

template <class T>
std::size_t most_smem(std::size_t D, std::size_t Dv, int tile) {
  const Geometry g(D, Dv, tile);
  return std::max(
      {forward_smem<T>(g, tile), key_pass_smem<T>(g, tile), query_pass_smem<T>(g, tile)});
}

template <class T>
void check_grid(const AttentionParams<T>& a, int tile) {
  const std::size_t tiles = cm::tile_count(std::max(a.Tq, a.Tk), tile);
  if (a.B * a.H > 65535 || tiles > 0x7fffffffu) {
    throw std::invalid_argument("cuda sdpa fused: B*H = " + std::to_string(a.B * a.H) +
                                " exceeds 65535 (grid y); use the reference path");
  }
}

// Launches kernel<<<grid, kThreads, smem>>> after raising its dynamic shared-memory limit.
template <class Kernel, class... Args>
void launch(Kernel kernel, dim3 grid, std::size_t smem, Args... args) {
  ATTNLAB_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                          static_cast<int>(smem)));
  kernel<<<grid, kThreads, smem>>>(args...);
  ATTNLAB_CUDA_CHECK_LAUNCH();
}

template <class T, int TILE>
void forward_with(T* out, T* lse, const AttentionParams<T>& a) {
  launch(fused_forward_kernel<T, TILE>, packed_query_grid(a, TILE),
         forward_smem<T>(Geometry(a.D, a.Dv, TILE), TILE), out, lse, a);
}

template <class T, int TILE>
void backward_with(T* dq, T* dk, T* dv, const T* dout, const T* lse, const T* row_dot,
                   const AttentionParams<T>& a) {
  const Geometry g(a.D, a.Dv, TILE);
  launch(fused_key_pass_kernel<T, TILE>, key_tile_grid(a, TILE), key_pass_smem<T>(g, TILE), dk, dv,
         dout, lse, row_dot, a);
  launch(fused_query_pass_kernel<T, TILE>, query_tile_grid(a, TILE), query_pass_smem<T>(g, TILE),
         dq, dout, lse, row_dot, a);
}

}  // namespace

template <class T>
int sdpa_fused_tile_rows(std::size_t D, std::size_t Dv) {
  const std::size_t limit = shared_memory_limit();
  if (most_smem<T>(D, Dv, 64) <= limit) return 64;
  if (most_smem<T>(D, Dv, 16) <= limit) return 16;
  throw std::invalid_argument("cuda sdpa fused: head dims D = " + std::to_string(D) +
                              ", Dv = " + std::to_string(Dv) + " need " +
                              std::to_string(most_smem<T>(D, Dv, 16)) +
                              " bytes of shared memory, the device has " + std::to_string(limit) +
                              "; use the reference path");
}

template <class T>
void sdpa_fused_forward(T* out, T* lse, const AttentionParams<T>& a) {
  check_attention_params(a, "cuda::sdpa_fused_forward");
  if (a.B * a.H * a.Tq == 0) return;
  const int tile = sdpa_fused_tile_rows<T>(a.D, a.Dv);
  check_grid(a, tile);
  if (tile == 64) {
    forward_with<T, 64>(out, lse, a);
  } else {
    forward_with<T, 16>(out, lse, a);
  }
}

template <class T>
void sdpa_fused_backward(T* dq, T* dk, T* dv, T* row_dot, const T* dout, const T* out, const T* lse,
                         const AttentionParams<T>& a) {
  check_attention_params(a, "cuda::sdpa_fused_backward");
  const std::size_t rows = a.B * a.H * a.Tq;
  if (rows == 0) return;
  const int tile = sdpa_fused_tile_rows<T>(a.D, a.Dv);
  check_grid(a, tile);
  // D = rowsum(dO ⊙ O), 8 rows (warps) per block
  row_dot_kernel<T><<<static_cast<unsigned>(cm::tile_count(rows, kRowDotRowsPerBlock)), kThreads>>>(
      row_dot, dout, out, rows, a.Dv);
  ATTNLAB_CUDA_CHECK_LAUNCH();
  if (tile == 64) {
    backward_with<T, 64>(dq, dk, dv, dout, lse, row_dot, a);
  } else {
    backward_with<T, 16>(dq, dk, dv, dout, lse, row_dot, a);
  }
}

#define ATTNLAB_INSTANTIATE(T)                                                       \
  template int sdpa_fused_tile_rows<T>(std::size_t, std::size_t);                    \
  template void sdpa_fused_forward<T>(T*, T*, const AttentionParams<T>&);            \
  template void sdpa_fused_backward<T>(T*, T*, T*, T*, const T*, const T*, const T*, \
                                       const AttentionParams<T>&);
ATTNLAB_INSTANTIATE(float)
ATTNLAB_INSTANTIATE(double)
#undef ATTNLAB_INSTANTIATE

}  // namespace attnlab::cuda
