// The fused GPU attention kernels for one attention program, and the launchers that the host op
// calls (attnlab/attention/device_program.hpp): include this header in the translation unit that
// knows the program's functors, and call attnlab::cuda::device_program(score, mask).
//   nvcc:     a .cu file; the launchers use <<<>>> and the device's opt-in shared memory.
//   emulator: a .cpp file that includes attnlab/backends/cuda_emulator.hpp first; the launchers
//             run the same kernels on the CPU (emu::launch).
// The kernels are the fused path's own (attention_fused_kernels.cuh) with the program's hooks: the
// mask program evaluated on partial tiles only and empty tiles skipped (the block mask), f(u) at
// visible keys, dS ⊙ ∂f/∂u in both backward passes, and Σ dS·∂f/∂θ per dK/dV block (one row per
// block, see DeviceProgramArgs::grad_rows). The reference path's two row kernels (between its
// GEMMs, attention_reference_kernels.cuh) with the same hooks: the mask program at every key, and
// Σ dS·∂f/∂θ per query row. Raw pointers only.
#pragma once

#include <algorithm>
#include <cstddef>
#include <limits>
#include <memory>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <utility>

#include "attention_fused_kernels.cuh"
#include "attention_reference_kernels.cuh"
#include "attnlab/attention/device_program.hpp"

namespace attnlab::cuda {

namespace fused {

template <class T, int TILE, class P>
__global__ void __launch_bounds__(kThreads)
    program_forward_kernel(T* out, T* lse, AttentionParams<T> a, ProgramRun<T, P> run) {
  fused_forward_body<T, TILE, P>(out, lse, a, run);
}
template <class T, int TILE, class P>
__global__ void __launch_bounds__(kThreads)
    program_key_pass_kernel(T* dk, T* dv, const T* dout, const T* lse, const T* row_dot,
                            AttentionParams<T> a, ProgramRun<T, P> run) {
  fused_key_pass_body<T, TILE, P>(dk, dv, dout, lse, row_dot, a, run);
}
template <class T, int TILE, class P>
__global__ void __launch_bounds__(kThreads)
    program_query_pass_kernel(T* dq, const T* dout, const T* lse, const T* row_dot,
                              AttentionParams<T> a, ProgramRun<T, P> run) {
  fused_query_pass_body<T, TILE, P>(dq, dout, lse, row_dot, a, run);
}

}  // namespace fused

namespace reference {

// One block per row (bh, i) of S (B,H,Tq,Tk), the unscaled dots Q Kᵀ: masked_softmax_rows with the
// program. Each thread keeps the final scores of its keys in place between the two passes, so the
// programs run once per element.
template <class T, class P>
__global__ void __launch_bounds__(kRowThreads)
    program_softmax_rows(T* scores, AttentionParams<T> a, fused::ProgramRun<T, P> run) {
  ATTNLAB_STATIC_SHARED(T, max_scratch, 32);
  ATTNLAB_STATIC_SHARED(T, sum_scratch, 32);
  const std::size_t row = blockIdx.x, bh = row / a.Tq, i = row % a.Tq;
  const std::size_t b = cm::batch_of(bh, a.H), h = cm::head_of(bh, a.H);
  const T s = a.scale[h];
  fused::TileState every;  // no block mask: the mask program at every key
  every.partial = true;
  T* x = scores + row * a.Tk;
  cm::OnlineSoftmax<T> state;
  for (std::size_t j = threadIdx.x; j < a.Tk; j += blockDim.x) {
    x[j] = fused::program_score(run, every, attention::score(a, b, h, i, j, s, x[j]), b, bh, h, i,
                                j, a.Tq, a.Tk);
    state.add(x[j]);
  }
  state = detail::block_merge(state, max_scratch, sum_scratch);
  const T inverse_sum = state.inverse_sum();
  for (std::size_t j = threadIdx.x; j < a.Tk; j += blockDim.x) {
    x[j] = cm::exp_shifted(x[j], state.max) * inverse_sum;  // 0 at a hidden key (-inf)
  }
}

// One block per row: softmax_backward_rows with the program. dp (in place) becomes s_h · dS ⊙
// ∂S/∂U, ∂S/∂U = the cap's slope (with a softcap) · f'(the built-in score); dS to a.dscores when
// set; with parameter gradients, Σ_j dS · ∂f/∂θ of the row to its grad_rows row, summed by one
// thread in key order.
template <class T, class P>
__global__ void __launch_bounds__(kRowThreads)
    program_backward_rows(T* dp, const T* p, const T* dots, AttentionParams<T> a,
                          fused::ProgramRun<T, P> run) {
  ATTNLAB_STATIC_SHARED(T, scratch, 32);
  const std::size_t row = blockIdx.x, bh = row / a.Tq, i = row % a.Tq, Tk = a.Tk;
  const std::size_t b = cm::batch_of(bh, a.H), h = cm::head_of(bh, a.H);
  const T s = a.scale[h];
  fused::TileState every;
  every.partial = true;
  T* g = dp + row * Tk;
  const T* w = p + row * Tk;
  const T* x = dots + row * Tk;
  T dot = 0;
  for (std::size_t j = threadIdx.x; j < Tk; j += blockDim.x) dot += g[j] * w[j];
  dot = detail::block_sum(dot, scratch);
  if constexpr (P::kScore) {
    if (run.args.grad_rows != nullptr && threadIdx.x == 0) {
      T* grads = run.args.grad_rows + row * run.args.width;
      for (std::size_t e = 0; e < run.args.width; ++e) grads[e] = T(0);
      for (std::size_t j = 0; j < Tk; ++j) {
        const T ds = cm::softmax_backward_element(w[j], g[j], dot);
        const T base = attention::score(a, b, h, i, j, s, x[j]);
        fused::accumulate_param_grads(run, grads, &ds, &base, 1, 1, 1, b, h, i, j);
      }
    }
    __syncthreads();  // g is read above before it is overwritten below
  }
  T* d = a.dscores == nullptr ? nullptr : a.dscores + row * Tk;
  for (std::size_t j = threadIdx.x; j < Tk; j += blockDim.x) {
    const T ds = cm::softmax_backward_element(w[j], g[j], dot);
    if (d != nullptr) d[j] = ds;
    T slope = T(1);
    (void)fused::program_score_slope(run, every, attention::score(a, b, h, i, j, s, x[j]), b, bh, h,
                                     i, j, a.Tq, Tk, slope);
    const T cap =
        a.softcap == 0 ? T(1) : attention::capped_slope(a, attention::capped(a, s * x[j]));
    g[j] = s * ds * cap * slope;
  }
}

}  // namespace reference

// The host functions below differ between nvcc and the emulator (how they launch, the shared
// memory they assume): an inline namespace per compiler keeps the two apart when one program links
// both (a test binary with the emulated device and the CUDA backend), as one definition each.
#if defined(__CUDACC__)
#define ATTNLAB_PROGRAM_LAUNCH_ABI nvcc
#else
#define ATTNLAB_PROGRAM_LAUNCH_ABI emulated
#endif
inline namespace ATTNLAB_PROGRAM_LAUNCH_ABI {

namespace program_launch {

// kernel<<<grid, block, shared_bytes>>>(args...) on the device, or under the CPU emulator.
template <class... Params, class... Args>
void launch(void (*kernel)(Params...), dim3 grid, dim3 block, std::size_t shared_bytes,
            Args... args) {
#if defined(__CUDACC__)
  if (shared_bytes > 48 * 1024) {
    cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                         static_cast<int>(shared_bytes));
  }
  kernel<<<grid, block, shared_bytes>>>(args...);
  const cudaError_t status = cudaGetLastError();
  if (status != cudaSuccess) {
    throw std::runtime_error(std::string("attention program kernel launch: ") +
                             cudaGetErrorString(status));
  }
#else
  emu::launch(kernel, grid, block, shared_bytes, args...);
#endif
}

// The opt-in shared memory per block: the device's, or an H100's under the emulator (as the
// emulated DeviceOps assume).
inline std::size_t shared_memory_limit() {
#if defined(__CUDACC__)
  int device = 0, bytes = 0;
  cudaGetDevice(&device);
  cudaDeviceGetAttribute(&bytes, cudaDevAttrMaxSharedMemoryPerBlockOptin, device);
  return static_cast<std::size_t>(bytes);
#else
  return 232448;
#endif
}

template <class T, class P>
std::size_t most_smem(std::size_t D, std::size_t Dv, int tile) {
  const fused::Geometry g(D, Dv, tile);
  return std::max({fused::forward_smem<T>(g, tile), fused::key_pass_smem<T>(g, tile, P::kScore),
                   fused::query_pass_smem<T>(g, tile)});
}

template <class T, class P>
int fused_tile(std::size_t D, std::size_t Dv) {
  const std::size_t limit = shared_memory_limit();
  if (most_smem<T, P>(D, Dv, 64) <= limit) return 64;
  if (most_smem<T, P>(D, Dv, 16) <= limit) return 16;
  throw std::invalid_argument("sdpa fused (attention program): head dims D = " + std::to_string(D) +
                              ", Dv = " + std::to_string(Dv) + " need " +
                              std::to_string(most_smem<T, P>(D, Dv, 16)) +
                              " bytes of shared memory, the device has " + std::to_string(limit));
}

template <class T, int TILE, class P>
void forward(const P& program, T* out, T* lse, const AttentionParams<T>& a,
             const DeviceProgramArgs<T>& args) {
  const fused::Geometry g(a.D, a.Dv, TILE);
  launch(fused::program_forward_kernel<T, TILE, P>, fused::packed_query_grid(a, TILE),
         dim3(fused::kThreads), fused::forward_smem<T>(g, TILE), out, lse, a,
         fused::ProgramRun<T, P>{program, args});
}

template <class T, int TILE, class P>
void backward(const P& program, T* dq, T* dk, T* dv, const T* dout, const T* lse, const T* row_dot,
              const AttentionParams<T>& a, const DeviceProgramArgs<T>& args) {
  const fused::Geometry g(a.D, a.Dv, TILE);
  const fused::ProgramRun<T, P> run{program, args};
  launch(fused::program_key_pass_kernel<T, TILE, P>, fused::key_tile_grid(a, TILE),
         dim3(fused::kThreads), fused::key_pass_smem<T>(g, TILE, P::kScore), dk, dv, dout, lse,
         row_dot, a, run);
  launch(fused::program_query_pass_kernel<T, TILE, P>, fused::query_tile_grid(a, TILE),
         dim3(fused::kThreads), fused::query_pass_smem<T>(g, TILE), dq, dout, lse, row_dot, a, run);
}

// The launchers of program P for T; `program` points to a P.
template <class T, class P>
struct Launchers {
  static void forward(const void* program, T* out, T* lse, const AttentionParams<T>& a,
                      const DeviceProgramArgs<T>& args) {
    if (a.B * a.H * a.Tq == 0) return;
    const P& p = *static_cast<const P*>(program);
    if (fused_tile<T, P>(a.D, a.Dv) == 64) {
      program_launch::forward<T, 64>(p, out, lse, a, args);
    } else {
      program_launch::forward<T, 16>(p, out, lse, a, args);
    }
  }
  static void backward(const void* program, T* dq, T* dk, T* dv, T* row_dot, const T* dout,
                       const T* out, const T* lse, const AttentionParams<T>& a,
                       const DeviceProgramArgs<T>& args) {
    const std::size_t rows = a.B * a.H * a.Tq;
    if (rows == 0) return;
    const P& p = *static_cast<const P*>(program);
    launch(fused::row_dot_kernel<T>,
           dim3(static_cast<unsigned>(kernel_math::tile_count(rows, fused::kRowDotRowsPerBlock))),
           dim3(fused::kThreads), 0, row_dot, dout, out, rows, a.Dv);
    if (fused_tile<T, P>(a.D, a.Dv) == 64) {
      program_launch::backward<T, 64>(p, dq, dk, dv, dout, lse, static_cast<const T*>(row_dot), a,
                                      args);
    } else {
      program_launch::backward<T, 16>(p, dq, dk, dv, dout, lse, static_cast<const T*>(row_dot), a,
                                      args);
    }
  }
};

// The reference path's rows of program P for T.
template <class T, class P>
struct ReferenceLaunchers {
  static dim3 rows_grid(const AttentionParams<T>& a, const char* op) {
    const std::size_t rows = a.B * a.H * a.Tq;
    if (rows > static_cast<std::size_t>(std::numeric_limits<int>::max())) {
      throw std::invalid_argument(std::string(op) + ": " + std::to_string(rows) +
                                  " rows, at most " +
                                  std::to_string(std::numeric_limits<int>::max()));
    }
    return dim3(static_cast<unsigned>(rows));
  }
  static void softmax(const void* program, T* scores, const AttentionParams<T>& a,
                      const DeviceProgramArgs<T>& args) {
    if (a.B * a.H * a.Tq == 0) return;
    launch(reference::program_softmax_rows<T, P>, rows_grid(a, "sdpa_reference_forward"),
           dim3(detail::row_threads(a.Tk, reference::kRowThreads)), 0, scores, a,
           fused::ProgramRun<T, P>{*static_cast<const P*>(program), args});
  }
  static void backward(const void* program, T* dp, const T* p, const T* dots,
                       const AttentionParams<T>& a, const DeviceProgramArgs<T>& args) {
    if (a.B * a.H * a.Tq == 0) return;
    launch(reference::program_backward_rows<T, P>, rows_grid(a, "sdpa_reference_backward"),
           dim3(detail::row_threads(a.Tk, reference::kRowThreads)), 0, dp, p, dots, a,
           fused::ProgramRun<T, P>{*static_cast<const P*>(program), args});
  }
};

template <class T, class P>
DeviceProgram<T> make(const std::shared_ptr<const P>& program) {
  DeviceProgram<T> d;
  d.has_score = P::kScore;
  d.has_mask = P::kMask;
  d.program = program;
  d.fused_tile = &fused_tile<T, P>;
  d.fused_forward = &Launchers<T, P>::forward;
  d.fused_backward = &Launchers<T, P>::backward;
  d.reference_softmax = &ReferenceLaunchers<T, P>::softmax;
  d.reference_backward = &ReferenceLaunchers<T, P>::backward;
  return d;
}

}  // namespace program_launch

// The launchers of the fused kernels for score functor `score` and mask functor `mask` (either may
// be fused::NoScore{} / fused::NoMask{}), for float and double. The functors are copied into the
// kernels' arguments at each launch.
template <class F, class M = fused::NoMask>
DevicePrograms device_program(F score, M mask = {}) {
  static_assert(std::is_trivially_copyable_v<F> && std::is_trivially_copyable_v<M>,
                "a device program's functors are copied to the GPU: plain values and device "
                "pointers only");
  using P = fused::Program<F, M>;
  const auto program = std::make_shared<const P>(P{score, mask});
  return DevicePrograms{program_launch::make<float, P>(program),
                        program_launch::make<double, P>(program)};
}

}  // namespace ATTNLAB_PROGRAM_LAUNCH_ABI

}  // namespace attnlab::cuda

#undef ATTNLAB_PROGRAM_LAUNCH_ABI
