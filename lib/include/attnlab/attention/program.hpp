// Attention programs: a user's score function and mask function, run inside the CPU attention
// paths (reference and fused) with exact derivatives and block skipping. The idea is PyTorch's
// FlexAttention (score_mod, mask_mod, BlockMask); the derivatives come from forward-mode dual
// numbers rather than from tracing, the backward runs on the CPU too, and the gradients of captured
// parameters are summed in a fixed order (deterministic at any thread count).
//
//   score program  S_ij = f(u_ij, b, h, i, j [, params])   u_ij = s_h · q_i·k_j, the scaled dot
//   mask program   visible(b, h, i, j)                       false hides key j from query i
//
// f is a C++ callable template over its score type: the library calls it with T (float or double)
// in the forward, and with Dual<T> in the backward to get ∂f/∂u and ∂f/∂θ for every captured
// parameter θ that f reads through its ProgramParams argument. A program may also give its own
// slope (a member `slope(u, b, h, i, j [, params])` returning ∂f/∂u at u); tests can check it
// against the dual numbers with check_program_slope. In f, call the math functions unqualified
// after `using std::tanh;` (and exp, log, sqrt, abs): the Dual overloads below are found by
// argument-dependent lookup. Branches on the score compare values (`s > 0 ? s : 0.1 * s`).
//
// The mask program is evaluated once per shape into a BlockMask (build_block_mask): for each tile
// of tile_rows queries × tile_keys keys it records whether every pair is visible (full), none is
// (empty) or some are (partial). The fused path skips empty tiles, evaluates the mask only on
// partial ones, and clips each row block's key range to the keys that block can see. A BlockMask
// keeps its mask program; pass it in SdpaOptions::block_mask, built once and reused while the
// shape and the sequence layout (e.g. the document boundaries) stay the same.
//
// Composition with the built-in rule (attnlab/attention/score_rule.hpp): a key mask applies on top
// of both kinds of program; a score program replaces the softcap, ALiBi and the additive bias (give
// them in the program instead: attnlab/attention/programs.hpp has each as a program); a mask
// program replaces causal and the window (masks::causal, masks::sliding_window). The op throws for
// the other combinations. Returning -inf from f hides that key, as a bias of -inf does; NaN or
// +inf at a visible key is an error naming the program and the position.
#pragma once

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <memory>
#include <mutex>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "attnlab/attention/dual.hpp"
#include "attnlab/attention/params.hpp"

namespace attnlab::attention {

// ---- Captured parameters and errors

// The first error a program raised during a call (kernels run it from several threads): the op
// throws it as std::invalid_argument after the kernel returns.
class ProgramStatus {
 public:
  bool failed() const { return failed_.load(std::memory_order_relaxed); }
  void fail(std::string message) {
    std::lock_guard<std::mutex> lock(mutex_);
    if (!failed_.load(std::memory_order_relaxed)) message_ = std::move(message);
    failed_.store(true, std::memory_order_relaxed);
  }
  const std::string& message() const { return message_; }

 private:
  std::atomic<bool> failed_{false};
  std::mutex mutex_;
  std::string message_;
};

// The captured parameters of a call in the kernels' type: count arrays, array k of sizes[k] values.
template <class T>
struct ProgramArgs {
  const T* const* values = nullptr;
  const std::size_t* sizes = nullptr;
  std::size_t count = 0;
  ProgramStatus* status = nullptr;
};

// The id of element `index` of captured parameter k, as Dual slots name it.
inline std::uint64_t param_id(std::size_t k, std::size_t index) {
  return (static_cast<std::uint64_t>(k) << 48) | static_cast<std::uint64_t>(index);
}

// What f receives: params(k, index) is element `index` of captured parameter k, as a value of the
// score type (a Dual carrying ∂/∂θ = 1 in the backward). An index out of range reads 0 and fails
// the call with an error naming the parameter, the index and its size.
template <class S>
class ProgramParams;

template <class T>
class ProgramParams {
 public:
  explicit ProgramParams(const ProgramArgs<T>& a) : a_(a) {}
  T operator()(std::size_t k, std::size_t index) const {
    if (k >= a_.count || index >= a_.sizes[k]) return out_of_range(k, index);
    return a_.values[k][index];
  }
  std::size_t size(std::size_t k) const { return k < a_.count ? a_.sizes[k] : 0; }
  std::size_t count() const { return a_.count; }

 private:
  T out_of_range(std::size_t k, std::size_t index) const {
    if (a_.status != nullptr) {
      a_.status->fail("params(" + std::to_string(k) + ", " + std::to_string(index) +
                      ") expected an index below " + std::to_string(size(k)) + " of " +
                      std::to_string(a_.count) + " captured parameter(s)");
    }
    return T(0);
  }
  ProgramArgs<T> a_;
};

template <class T>
class ProgramParams<Dual<T>> {
 public:
  explicit ProgramParams(const ProgramArgs<T>& a) : plain_(a) {}
  Dual<T> operator()(std::size_t k, std::size_t index) const {
    Dual<T> d(plain_(k, index));
    if (k < plain_.count() && index < plain_.size(k)) {
      d.n = 1, d.id[0] = param_id(k, index), d.dp[0] = T(1);
    }
    return d;
  }
  std::size_t size(std::size_t k) const { return plain_.size(k); }
  std::size_t count() const { return plain_.count(); }

 private:
  ProgramParams<T> plain_;
};

// ---- Tiles

// A rows × cols block of one (b, h) slice: queries [i0, i0 + rows), keys [j0, j0 + cols),
// row-major.
struct ProgramTile {
  std::size_t b = 0, h = 0, i0 = 0, rows = 0, j0 = 0, cols = 0;
};

// ---- Score programs: the interface the kernels call, once per tile ------------------------------

class ScoreProgram {
 public:
  virtual ~ScoreProgram() = default;
  virtual const std::string& name() const = 0;
  // tile (rows × cols): in u, out f(u) where visible[e] != 0 (everywhere when visible is null)
  // and -inf elsewhere. With slope set, also slope[e] = ∂f/∂u (0 where hidden).
  virtual void apply(float* tile, float* slope, const unsigned char* visible, const ProgramTile& t,
                     const ProgramArgs<float>& a) const = 0;
  virtual void apply(double* tile, double* slope, const unsigned char* visible,
                     const ProgramTile& t, const ProgramArgs<double>& a) const = 0;
  // grads[k][index] += Σ_e dscore[e] · ∂f/∂θ_(k,index) at u[e], over the e with dscore[e] != 0
  // (hidden keys have dS = 0) in row-major order.
  virtual void accumulate_param_grads(const float* u, const float* dscore, const ProgramTile& t,
                                      const ProgramArgs<float>& a, float* const* grads) const = 0;
  virtual void accumulate_param_grads(const double* u, const double* dscore, const ProgramTile& t,
                                      const ProgramArgs<double>& a, double* const* grads) const = 0;
};

namespace program_detail {

template <class F, class S>
S call_score(const F& f, S s, const ProgramTile& t, std::size_t i, std::size_t j,
             const ProgramParams<S>& params) {
  if constexpr (std::is_invocable_v<const F&, S, std::size_t, std::size_t, std::size_t, std::size_t,
                                    const ProgramParams<S>&>) {
    return static_cast<S>(f(s, t.b, t.h, i, j, params));
  } else {
    static_assert(
        std::is_invocable_v<const F&, S, std::size_t, std::size_t, std::size_t, std::size_t>,
        "a score program is callable as f(score, b, h, i, j) or f(score, b, h, i, j, params)");
    (void)params;
    return static_cast<S>(f(s, t.b, t.h, i, j));
  }
}

// Whether f gives its own value and slope: T value_and_slope(u, b, h, i, j, params, T& slope).
template <class F, class T, class = void>
struct OwnSlope : std::false_type {};
template <class F, class T>
struct OwnSlope<F, T,
                std::void_t<decltype(std::declval<const F&>().value_and_slope(
                    std::declval<T>(), std::size_t{}, std::size_t{}, std::size_t{}, std::size_t{},
                    std::declval<const ProgramParams<T>&>(), std::declval<T&>()))>>
    : std::true_type {};

template <class T>
std::string number(T x) {
  return std::to_string(static_cast<double>(x));
}

}  // namespace program_detail

// A ScoreProgram over a callable f (see the top of this file). Make one with score_program().
template <class F>
class ScoreFunction final : public ScoreProgram {
 public:
  ScoreFunction(F f, std::string name) : f_(std::move(f)), name_(std::move(name)) {}
  const std::string& name() const override { return name_; }
  const F& function() const { return f_; }

  void apply(float* tile, float* slope, const unsigned char* visible, const ProgramTile& t,
             const ProgramArgs<float>& a) const override {
    apply_t(tile, slope, visible, t, a);
  }
  void apply(double* tile, double* slope, const unsigned char* visible, const ProgramTile& t,
             const ProgramArgs<double>& a) const override {
    apply_t(tile, slope, visible, t, a);
  }
  void accumulate_param_grads(const float* u, const float* dscore, const ProgramTile& t,
                              const ProgramArgs<float>& a, float* const* grads) const override {
    grads_t(u, dscore, t, a, grads);
  }
  void accumulate_param_grads(const double* u, const double* dscore, const ProgramTile& t,
                              const ProgramArgs<double>& a, double* const* grads) const override {
    grads_t(u, dscore, t, a, grads);
  }

 private:
  template <class T>
  void apply_t(T* tile, T* slope, const unsigned char* visible, const ProgramTile& t,
               const ProgramArgs<T>& a) const {
    const ProgramParams<T> params(a);
    const ProgramParams<Dual<T>> dual_params(a);
    constexpr T hidden = -std::numeric_limits<T>::infinity();
    for (std::size_t r = 0; r < t.rows; ++r) {
      const std::size_t i = t.i0 + r;
      T* row = tile + r * t.cols;
      T* srow = slope == nullptr ? nullptr : slope + r * t.cols;
      const unsigned char* vrow = visible == nullptr ? nullptr : visible + r * t.cols;
      // One loop per kind, with no call out of line inside: f is inlined into each.
      if (slope == nullptr) {
        for (std::size_t c = 0; c < t.cols; ++c) {
          row[c] = vrow == nullptr || vrow[c] != 0
                       ? program_detail::call_score(f_, row[c], t, i, t.j0 + c, params)
                       : hidden;
        }
      } else if constexpr (program_detail::OwnSlope<F, T>::value) {
        for (std::size_t c = 0; c < t.cols; ++c) {
          if (vrow == nullptr || vrow[c] != 0) {
            row[c] =
                static_cast<T>(f_.value_and_slope(row[c], t.b, t.h, i, t.j0 + c, params, srow[c]));
          } else {
            row[c] = hidden, srow[c] = T(0);
          }
        }
      } else {
        for (std::size_t c = 0; c < t.cols; ++c) {
          if (vrow == nullptr || vrow[c] != 0) {
            Dual<T> du(row[c]);
            du.ds = T(1);
            const Dual<T> d = program_detail::call_score(f_, du, t, i, t.j0 + c, dual_params);
            row[c] = d.v, srow[c] = d.ds;
          } else {
            row[c] = hidden, srow[c] = T(0);
          }
        }
      }
      // NaN or +inf anywhere in the row (hidden keys hold -inf): name the first.
      bool bad = false;
      for (std::size_t c = 0; c < t.cols; ++c) bad |= !(row[c] < -hidden);
      if (bad) {
        std::size_t c = 0;
        while (row[c] < -hidden) ++c;
        fail(a, t, i, t.j0 + c, row[c]);
      }
    }
  }

  template <class T>
  void grads_t(const T* u, const T* dscore, const ProgramTile& t, const ProgramArgs<T>& a,
               T* const* grads) const {
    if (a.count == 0) return;
    const ProgramParams<Dual<T>> dual_params(a);
    for (std::size_t r = 0; r < t.rows; ++r) {
      const std::size_t i = t.i0 + r;
      for (std::size_t c = 0; c < t.cols; ++c) {
        const std::size_t e = r * t.cols + c;
        if (dscore[e] == T(0)) continue;
        const Dual<T> d =
            program_detail::call_score(f_, Dual<T>(u[e]), t, i, t.j0 + c, dual_params);
        if (d.n < 0) {
          if (a.status != nullptr) {
            a.status->fail("score program '" + name_ + "': one score depends on more than " +
                           std::to_string(kDualSlots) + " captured parameter elements");
          }
          return;
        }
        for (int s = 0; s < d.n; ++s) {
          const std::size_t k = static_cast<std::size_t>(d.id[s] >> 48);
          const std::size_t index = static_cast<std::size_t>(d.id[s] & ((1ull << 48) - 1));
          grads[k][index] += dscore[e] * d.dp[s];
        }
      }
    }
  }

  template <class T>
  void fail(const ProgramArgs<T>& a, const ProgramTile& t, std::size_t i, std::size_t j,
            T y) const {
    if (a.status == nullptr) return;
    a.status->fail("score program '" + name_ + "' returned " + program_detail::number(y) +
                   " at (b, h, i, j) = (" + std::to_string(t.b) + ", " + std::to_string(t.h) +
                   ", " + std::to_string(i) + ", " + std::to_string(j) +
                   "); expected a finite score, or -inf to hide the key");
  }

  F f_;
  std::string name_;
};

// A score program over f, shared by the options of every call that uses it.
template <class F>
std::shared_ptr<const ScoreProgram> score_program(F f, std::string name = "score program") {
  return std::make_shared<const ScoreFunction<F>>(std::move(f), std::move(name));
}

// The largest |slope − ∂f/∂u| over a grid of scores (each of `scores` at every (b, h, i, j) below
// the given extents), relative to max(1, |∂f/∂u|), between a program's own slope
// (value_and_slope) and the dual numbers' derivative; infinity when its value differs from f's.
// 0 for a program without its own slope. For tests of hand-given slopes.
template <class F>
double check_program_slope(const ScoreFunction<F>& program, const std::vector<double>& scores,
                           const AttentionSizes& sizes,
                           const std::vector<std::vector<double>>& params = {}) {
  if constexpr (!program_detail::OwnSlope<F, double>::value) {
    return 0.0;
  } else {
    std::vector<const double*> values;
    std::vector<std::size_t> size_of;
    for (const auto& p : params) values.push_back(p.data()), size_of.push_back(p.size());
    const ProgramArgs<double> a{values.data(), size_of.data(), params.size(), nullptr};
    const ProgramParams<double> plain(a);
    const ProgramParams<Dual<double>> dual(a);
    double worst = 0.0;
    const ProgramTile t0{};
    for (std::size_t b = 0; b < sizes.B; ++b) {
      for (std::size_t h = 0; h < sizes.H; ++h) {
        for (std::size_t i = 0; i < sizes.Tq; ++i) {
          for (std::size_t j = 0; j < sizes.Tk; ++j) {
            ProgramTile t = t0;
            t.b = b, t.h = h;
            for (double u : scores) {
              double own = 0;
              const double value = program.function().value_and_slope(u, b, h, i, j, plain, own);
              if (value != program_detail::call_score(program.function(), u, t, i, j, plain)) {
                return std::numeric_limits<double>::infinity();  // its value is not f's
              }
              Dual<double> du(u);
              du.ds = 1.0;
              const double exact =
                  program_detail::call_score(program.function(), du, t, i, j, dual).ds;
              worst = std::max(worst, std::abs(own - exact) / std::max(1.0, std::abs(exact)));
            }
          }
        }
      }
    }
    return worst;
  }
}

// ---- Mask programs

class MaskProgram {
 public:
  virtual ~MaskProgram() = default;
  virtual const std::string& name() const = 0;
  // visible (rows × cols) = visible(b, h, i, j) over the tile, 1 or 0.
  virtual void evaluate(unsigned char* visible, const ProgramTile& t) const = 0;
  // tile (rows × cols) = -inf where visible(b, h, i, j) is false, in one pass.
  virtual void hide(float* tile, const ProgramTile& t) const = 0;
  virtual void hide(double* tile, const ProgramTile& t) const = 0;
  // Whether the mask reads b and h (false: one block mask serves every batch row or head).
  virtual bool depends_on_batch() const = 0;
  virtual bool depends_on_head() const = 0;
};

// Which arguments a mask program reads; a mask that ignores b (or h) is evaluated once for all.
struct MaskDepends {
  bool batch = true;
  bool head = true;
};

template <class F>
class MaskFunction final : public MaskProgram {
 public:
  MaskFunction(F f, std::string name, MaskDepends depends)
      : f_(std::move(f)), name_(std::move(name)), depends_(depends) {}
  const std::string& name() const override { return name_; }
  bool depends_on_batch() const override { return depends_.batch; }
  bool depends_on_head() const override { return depends_.head; }
  void evaluate(unsigned char* visible, const ProgramTile& t) const override {
    static_assert(
        std::is_invocable_r_v<bool, const F&, std::size_t, std::size_t, std::size_t, std::size_t>,
        "a mask program is callable as visible(b, h, i, j) -> bool");
    for (std::size_t r = 0; r < t.rows; ++r) {
      for (std::size_t c = 0; c < t.cols; ++c) {
        visible[r * t.cols + c] = f_(t.b, t.h, t.i0 + r, t.j0 + c) ? 1 : 0;
      }
    }
  }
  void hide(float* tile, const ProgramTile& t) const override { hide_t(tile, t); }
  void hide(double* tile, const ProgramTile& t) const override { hide_t(tile, t); }

 private:
  template <class T>
  void hide_t(T* tile, const ProgramTile& t) const {
    for (std::size_t r = 0; r < t.rows; ++r) {
      T* row = tile + r * t.cols;
      for (std::size_t c = 0; c < t.cols; ++c) {
        if (!f_(t.b, t.h, t.i0 + r, t.j0 + c)) row[c] = -std::numeric_limits<T>::infinity();
      }
    }
  }

  F f_;
  std::string name_;
  MaskDepends depends_;
};

template <class F>
std::shared_ptr<const MaskProgram> mask_program(F f, std::string name = "mask program",
                                                MaskDepends depends = {}) {
  return std::make_shared<const MaskFunction<F>>(std::move(f), std::move(name), depends);
}

// ---- Block masks

enum class BlockState : unsigned char { empty = 0, partial = 1, full = 2 };

// A mask program evaluated over one shape, by tiles of tile_rows × tile_keys. For each (b, h) the
// mask reads (one when it reads neither) and each row block of queries: the range of keys [lo, hi)
// that some query of the block sees, cut into tiles of tile_keys keys from lo, each empty, partial
// or full. Building evaluates the mask at every (b, h, i, j) it reads once: O(B·H·Tq·Tk) calls.
class BlockMask {
 public:
  struct RowBlock {
    std::size_t lo = 0, hi = 0;  // the keys some query of the block sees; lo == hi: none
    std::size_t first_tile = 0;  // index into states() of the block's first key tile
  };

  const MaskProgram& program() const { return *program_; }
  std::shared_ptr<const MaskProgram> program_ptr() const { return program_; }
  std::size_t tile_rows() const { return tile_rows_; }
  std::size_t tile_keys() const { return tile_keys_; }
  const AttentionSizes& sizes() const { return sizes_; }

  // The row block rb of batch b, head h (the mask's own b and h: 0 where it reads neither).
  const RowBlock& row_block(std::size_t b, std::size_t h, std::size_t rb) const {
    const std::size_t mb = program_->depends_on_batch() ? b : 0;
    const std::size_t mh = program_->depends_on_head() ? h : 0;
    return rows_[(mb * heads_ + mh) * row_blocks_ + rb];
  }
  BlockState state(const RowBlock& r, std::size_t tile) const {
    return states_[r.first_tile + tile];
  }
  // Key tiles inside the row blocks' ranges, over every (b, h) the mask reads: how many are empty
  // (skipped), partial and full.
  std::size_t count(BlockState s) const {
    return static_cast<std::size_t>(std::count(states_.begin(), states_.end(), s));
  }
  // The fraction of the Tq × Tk scores (of each (b, h) the mask reads) in the tiles a fused kernel
  // computes: partial and full ones.
  double density() const;

  // Throws std::invalid_argument "<op>: block_mask expected ..." unless it was built for these
  // sizes (B, H, Tq, Tk).
  void check_matches(const AttentionSizes& sizes, const char* op) const;

  friend BlockMask build_block_mask(std::shared_ptr<const MaskProgram> mask,
                                    const AttentionSizes& sizes, std::size_t tile_rows,
                                    std::size_t tile_keys);

 private:
  std::shared_ptr<const MaskProgram> program_;
  AttentionSizes sizes_;
  std::size_t tile_rows_ = 0, tile_keys_ = 0, heads_ = 1, row_blocks_ = 0;
  double computed_ = 0;  // score elements in partial and full tiles
  std::vector<RowBlock> rows_;
  std::vector<BlockState> states_;
};

// The block mask of `mask` for calls of these sizes (B, H, Tq, Tk are read) and fused tiles (0 =
// the fused path's defaults, 128 × 512). Throws std::invalid_argument for a null mask or zero
// sizes.
BlockMask build_block_mask(std::shared_ptr<const MaskProgram> mask, const AttentionSizes& sizes,
                           std::size_t tile_rows = 0, std::size_t tile_keys = 0);

}  // namespace attnlab::attention
