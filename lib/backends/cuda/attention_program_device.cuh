// Attention programs inside the fused kernels (attention_fused_kernels.cuh): the policy type a
// kernel is templated on (a score functor and a mask functor; NoProgram compiles to the built-in
// rule alone), the device view of the captured parameters, and the per-element hooks. Device code
// on raw pointers (attnlab/attention/device_program.hpp describes the data), compiled by nvcc and,
// for the emulator, by the C++ compiler.
#pragma once

#include <cstddef>
#include <type_traits>

#include "attnlab/attention/device_program.hpp"
#include "attnlab/attention/dual.hpp"
#include "attnlab/kernel_math.hpp"
#include "device_compat.cuh"

namespace attnlab::cuda::fused {

struct NoScore {};
struct NoMask {};

// A kernel's program: score functor F (NoScore: none) and mask functor M (NoMask: none).
template <class F, class M>
struct Program {
  static constexpr bool kScore = !std::is_same_v<F, NoScore>;
  static constexpr bool kMask = !std::is_same_v<M, NoMask>;
  static constexpr bool kAny = kScore || kMask;
  F score;
  M mask;
};
using NoProgram = Program<NoScore, NoMask>;

// What a kernel receives: the program and the call's program data.
template <class T, class P>
struct ProgramRun {
  P program;
  DeviceProgramArgs<T> args;
};

template <class T>
__device__ inline void report(DeviceProgramError* error, int code, unsigned long long where,
                              T value) {
  if (error == nullptr || error->code != 0) return;
  error->where = where;
  error->value = static_cast<double>(value);
  error->code = code;
}

// params(k, index): element `index` of captured parameter k; out of range reads 0 and records
// the error (code 2).
template <class S>
class DeviceParams {
 public:
  __device__ explicit DeviceParams(const DeviceProgramArgs<S>& a) : a_(a) {}
  __device__ S operator()(std::size_t k, std::size_t index) const {
    if (k >= a_.count || index >= size(k)) {
      report(a_.error, 2, (static_cast<unsigned long long>(k) << 48) | index, S(0));
      return S(0);
    }
    return a_.values[a_.offsets[k] + index];
  }
  __device__ std::size_t size(std::size_t k) const {
    return k < a_.count ? a_.offsets[k + 1] - a_.offsets[k] : 0;
  }
  __device__ std::size_t count() const { return a_.count; }

 private:
  const DeviceProgramArgs<S>& a_;
};

// The backward's view: each element a Dual carrying ∂/∂θ = 1 for its own id.
template <class T>
class DeviceParams<attention::Dual<T>> {
 public:
  __device__ explicit DeviceParams(const DeviceProgramArgs<T>& a) : plain_(a) {}
  __device__ attention::Dual<T> operator()(std::size_t k, std::size_t index) const {
    attention::Dual<T> d(plain_(k, index));
    if (k < plain_.count() && index < plain_.size(k)) {
      d.n = 1, d.id[0] = (static_cast<std::uint64_t>(k) << 48) | index, d.dp[0] = T(1);
    }
    return d;
  }
  __device__ std::size_t size(std::size_t k) const { return plain_.size(k); }
  __device__ std::size_t count() const { return plain_.count(); }

 private:
  DeviceParams<T> plain_;
};

template <class F, class S, class A>
__device__ inline S call_score(const F& f, S u, std::size_t b, std::size_t h, std::size_t i,
                               std::size_t j, const A& args) {
  const DeviceParams<S> params(args);
  if constexpr (std::is_invocable_v<const F&, S, std::size_t, std::size_t, std::size_t, std::size_t,
                                    const DeviceParams<S>&>) {
    return static_cast<S>(f(u, b, h, i, j, params));
  } else {
    return static_cast<S>(f(u, b, h, i, j));
  }
}

// How a kernel treats one tile pair: skip it (every pair hidden), evaluate the mask program on it
// (partial), or not (full: only keys past `hi` hidden). Without a mask program: full.
struct TileState {
  bool skip = false, partial = false;
  std::size_t hi = static_cast<std::size_t>(-1);
};

// Row block rb (query tile, tile rows = the kernel's TILE) of slice bh against key tile
// [j0, j0 + tile): the states of the block mask's key tiles it overlaps.
template <class T>
__device__ inline TileState tile_state(const DeviceProgramArgs<T>& a, std::size_t bh,
                                       std::size_t rb, std::size_t j0, int tile) {
  TileState st;
  if (a.block_states == nullptr) return st;
  const std::size_t e = bh * a.row_blocks + rb, lo = a.block_lo[e], hi = a.block_hi[e];
  st.hi = hi;
  const std::size_t from = j0 > lo ? j0 : lo, to = j0 + tile < hi ? j0 + tile : hi;
  if (from >= to) {
    st.skip = true;
    return st;
  }
  bool all_empty = true, all_full = j0 >= lo && j0 + tile <= hi;
  for (std::size_t t = (from - lo) / tile; t <= (to - 1 - lo) / tile; ++t) {
    const unsigned char s = a.block_states[a.block_first[e] + t];
    all_empty = all_empty && s == 0;
    all_full = all_full && s == 2;
  }
  st.skip = all_empty;
  st.partial = !all_full;
  return st;
}

// Row block rb of the `heads` slices bh0 .. bh0 + heads − 1 together (a grouped-query tile, whose
// rows are those slices' queries) against key tile [j0, j0 + tile): skipped when every slice skips
// it, full when every slice sees all of it, partial otherwise (a slice that skips it beside one
// that does not: the mask program hides that slice's keys element by element).
template <class T>
__device__ inline TileState tile_state(const DeviceProgramArgs<T>& a, std::size_t bh0,
                                       std::size_t heads, std::size_t rb, std::size_t j0,
                                       int tile) {
  if (heads == 1) return tile_state(a, bh0, rb, j0, tile);
  TileState st;
  st.skip = true;
  st.hi = 0;
  for (std::size_t bh = bh0; bh < bh0 + heads; ++bh) {
    const TileState one = tile_state(a, bh, rb, j0, tile);
    st.skip = st.skip && one.skip;
    st.partial = st.partial || one.partial || one.skip;
    st.hi = st.hi > one.hi ? st.hi : one.hi;
  }
  if (st.skip) st.partial = false;
  return st;
}

// Keys [lo, hi) that row block rb of the slices bh0 .. bh0 + heads − 1 sees, together: the key
// loop's range with a mask program.
template <class T>
__device__ inline void block_range(const DeviceProgramArgs<T>& a, std::size_t bh0,
                                   std::size_t heads, std::size_t rb, std::size_t& lo,
                                   std::size_t& hi) {
  lo = a.block_lo[bh0 * a.row_blocks + rb];
  hi = a.block_hi[bh0 * a.row_blocks + rb];
  for (std::size_t bh = bh0 + 1; bh < bh0 + heads; ++bh) {
    const std::size_t l = a.block_lo[bh * a.row_blocks + rb],
                      h = a.block_hi[bh * a.row_blocks + rb];
    if (l == h) continue;  // this slice sees no key
    if (lo == hi) {
      lo = l, hi = h;
    } else {
      lo = l < lo ? l : lo;
      hi = h > hi ? h : hi;
    }
  }
}

// The built-in rule's score `base` (-inf when hidden) through the mask and score programs: the
// score the softmax sees. A score that is NaN or +inf at a visible key is recorded (code 1) and
// hides the key. With kSlope, *slope receives ∂f/∂u from a Dual evaluation (untouched without a
// score program).
template <bool kSlope, class T, class P>
__device__ inline T program_score_at(const ProgramRun<T, P>& run, const TileState& st, T base,
                                     std::size_t b, std::size_t bh, std::size_t h, std::size_t i,
                                     std::size_t j, std::size_t Tq, std::size_t Tk, T* slope) {
  const T hidden = kernel_math::negative_infinity<T>();
  if constexpr (P::kMask) {
    if (j >= st.hi || (st.partial && !(base == hidden) && !run.program.mask(b, h, i, j))) {
      return hidden;
    }
  }
  if constexpr (P::kScore) {
    if (!(base == hidden)) {
      T y;
      if constexpr (kSlope) {
        attention::Dual<T> u(base);
        u.ds = T(1);
        const attention::Dual<T> d = call_score(run.program.score, u, b, h, i, j, run.args);
        y = d.v;
        *slope = d.ds;
      } else {
        y = call_score(run.program.score, base, b, h, i, j, run.args);
      }
      if (!(y < -hidden) && !(y == hidden)) {
        report(run.args.error, 1, (bh * Tq + i) * Tk + j, y);
        return hidden;
      }
      return y;
    }
  }
  return base;
}

template <class T, class P>
__device__ inline T program_score(const ProgramRun<T, P>& run, const TileState& st, T base,
                                  std::size_t b, std::size_t bh, std::size_t h, std::size_t i,
                                  std::size_t j, std::size_t Tq, std::size_t Tk) {
  return program_score_at<false>(run, st, base, b, bh, h, i, j, Tq, Tk, static_cast<T*>(nullptr));
}

// The same with the backward's slope ∂f/∂u (slope untouched without a score program).
template <class T, class P>
__device__ inline T program_score_slope(const ProgramRun<T, P>& run, const TileState& st, T base,
                                        std::size_t b, std::size_t bh, std::size_t h, std::size_t i,
                                        std::size_t j, std::size_t Tq, std::size_t Tk, T& slope) {
  return program_score_at<true>(run, st, base, b, bh, h, i, j, Tq, Tk, &slope);
}

// grads[offsets[k] + index] += Σ dS · ∂f/∂θ over a tile of rows × cols elements (row-major, row
// stride ld) of dS (ds, 0 where hidden) and u, in row-major order: one thread, a fixed order.
template <class T, class P>
__device__ inline void accumulate_param_grads(const ProgramRun<T, P>& run, T* grads, const T* ds,
                                              const T* u, int ld, int rows, int cols, std::size_t b,
                                              std::size_t h, std::size_t i0, std::size_t j0) {
  if constexpr (P::kScore) {
    for (int r = 0; r < rows; ++r) {
      for (int c = 0; c < cols; ++c) {
        const T d = ds[r * ld + c];
        if (d == T(0)) continue;
        const attention::Dual<T> y = call_score(
            run.program.score, attention::Dual<T>(u[r * ld + c]), b, h, i0 + r, j0 + c, run.args);
        if (y.n < 0) {
          report(run.args.error, 3, 0, T(0));
          return;
        }
        for (int s = 0; s < y.n; ++s) {
          const std::size_t k = static_cast<std::size_t>(y.id[s] >> 48);
          const std::size_t index = static_cast<std::size_t>(y.id[s] & ((1ull << 48) - 1));
          grads[run.args.offsets[k] + index] += d * y.dp[s];
        }
      }
    }
  }
}

}  // namespace attnlab::cuda::fused
