// The host side of one GPU attention call with an attention program, fused or reference: its
// program data in device memory (DeviceProgramArgs: the captured parameters, the block mask at the
// fused kernels' tile size, the error record, the rows of parameter gradients), the deterministic
// sum of those rows, and the program's error thrown as the CPU path's. Over any DeviceOps (the CUDA
// backend's in the host op, the emulated device in the tests); C++ only, no CUDA type.
#pragma once

#include <cstddef>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include "attnlab/attention/device_program.hpp"
#include "attnlab/attention/program.hpp"
#include "attnlab/device_ops.hpp"
#include "attnlab/kernel_math.hpp"

namespace attnlab::cuda {

template <class T>
class DeviceProgramCall {
 public:
  // params: the captured parameters' values; mask: the mask program (or null); block_mask: one
  // built for these sizes at the kernels' tile, or null to build it here; grads: whether the
  // backward sums the parameters' gradients; fused: the fused path's kernels (false: the
  // reference path's rows, which evaluate the mask program at every key, no block mask).
  DeviceProgramCall(DeviceOps<T>& ops, const DeviceProgram<T>& program, const AttentionParams<T>& a,
                    const std::vector<std::vector<T>>& params,
                    std::shared_ptr<const attention::MaskProgram> mask,
                    std::shared_ptr<const attention::BlockMask> block_mask, bool grads,
                    bool fused = true)
      : ops_(ops), program_(program), a_(a) {
    if (fused) tile_ = static_cast<std::size_t>(program.fused_tile(a.D, a.Dv));
    std::vector<std::size_t> offsets{0};
    std::vector<T> values;
    for (const auto& p : params) {
      values.insert(values.end(), p.begin(), p.end());
      offsets.push_back(values.size());
      sizes_.push_back(p.size());
    }
    width_ = values.size();
    args_.values = upload(values);
    args_.offsets = upload(offsets);
    args_.count = params.size();
    args_.error = static_cast<DeviceProgramError*>(keep(sizeof(DeviceProgramError)));
    ops.zero(args_.error, sizeof(DeviceProgramError));
    if (mask && fused) {
      const AttentionSizes sizes = a;
      if (!block_mask || block_mask->tile_rows() != tile_ || block_mask->tile_keys() != tile_) {
        block_mask = std::make_shared<const attention::BlockMask>(
            attention::build_block_mask(mask, sizes, tile_, tile_));
      }
      block_mask_ = block_mask;
      upload_block_mask(*block_mask);
    }
    if (grads && width_ > 0) {
      rows_ = fused ? a.B * a.Hkv * kernel_math::tile_count(a.Tk, tile_) : a.B * a.H * a.Tq;
      args_.grad_rows = static_cast<T*>(keep(rows_ * width_ * sizeof(T)));
      args_.width = width_;
    }
  }
  ~DeviceProgramCall() {
    for (void* p : owned_) ops_.release(p);
  }
  DeviceProgramCall(const DeviceProgramCall&) = delete;
  DeviceProgramCall& operator=(const DeviceProgramCall&) = delete;

  const DeviceProgramArgs<T>& args() const { return args_; }
  std::size_t tile() const { return tile_; }
  // The block mask the fused kernels use (at their tile), or null.
  const std::shared_ptr<const attention::BlockMask>& block_mask() const { return block_mask_; }

  void forward(T* out, T* lse) {
    program_.fused_forward(program_.program.get(), out, lse, a_, args_);
  }
  void backward(T* dq, T* dk, T* dv, T* row_dot, const T* dout, const T* out, const T* lse) {
    program_.fused_backward(program_.program.get(), dq, dk, dv, row_dot, dout, out, lse, a_, args_);
  }

  // The reference path's rows over this call's program data (for DeviceOps'
  // sdpa_reference_program_forward / _backward; this call outlives them).
  ReferenceRows<T> reference_rows() const {
    ReferenceRows<T> rows;
    rows.context = this;
    rows.softmax = [](const void* self, T* scores, const AttentionParams<T>& a) {
      const auto& c = *static_cast<const DeviceProgramCall*>(self);
      c.program_.reference_softmax(c.program_.program.get(), scores, a, c.args_);
    };
    rows.backward = [](const void* self, T* dp, const T* p, const T* dots,
                       const AttentionParams<T>& a) {
      const auto& c = *static_cast<const DeviceProgramCall*>(self);
      c.program_.reference_backward(c.program_.program.get(), dp, p, dots, a, c.args_);
    };
    return rows;
  }

  // Throws std::invalid_argument "<op>: <the CPU path's message>" if a kernel recorded an error
  // (score_name: the score program's name).
  void rethrow(const std::string& op, const std::string& score_name) {
    DeviceProgramError e;
    ops_.synchronize();
    ops_.download(&e, args_.error, sizeof e);
    if (e.code == 0) return;
    std::string message;
    if (e.code == 1) {
      const std::size_t j = e.where % a_.Tk, i = e.where / a_.Tk % a_.Tq;
      const std::size_t bh = e.where / a_.Tk / a_.Tq;
      message = "score program '" + score_name + "' returned " + std::to_string(e.value) +
                " at (b, h, i, j) = (" + std::to_string(bh / a_.H) + ", " +
                std::to_string(bh % a_.H) + ", " + std::to_string(i) + ", " + std::to_string(j) +
                "); expected a finite score, or -inf to hide the key";
    } else if (e.code == 2) {
      const std::size_t k = static_cast<std::size_t>(e.where >> 48);
      const std::size_t index = static_cast<std::size_t>(e.where & ((1ull << 48) - 1));
      const std::size_t size = k < args_.count ? sizes_[k] : 0;
      message = "params(" + std::to_string(k) + ", " + std::to_string(index) +
                ") expected an index below " + std::to_string(size) + " of " +
                std::to_string(args_.count) + " captured parameter(s)";
    } else {
      message = "score program '" + score_name + "': one score depends on more than " +
                std::to_string(attention::kDualSlots) + " captured parameter elements";
    }
    throw std::invalid_argument(op + ": " + message);
  }

  // The parameters' gradients: the blocks' rows summed on the device in row order, one thread per
  // element (DeviceOps::column_sum: the same bits every run), and only the sums copied back.
  std::vector<std::vector<T>> grads() {
    std::vector<T> total(width_, T(0));
    if (rows_ > 0 && width_ > 0) {
      T* sum = static_cast<T*>(keep(width_ * sizeof(T)));
      ops_.column_sum(sum, args_.grad_rows, rows_, width_);
      ops_.download(total.data(), sum, width_ * sizeof(T));
    }
    std::vector<std::vector<T>> g;
    std::size_t at = 0;
    for (std::size_t size : sizes_) {
      g.emplace_back(total.begin() + static_cast<std::ptrdiff_t>(at),
                     total.begin() + static_cast<std::ptrdiff_t>(at + size));
      at += size;
    }
    return g;
  }

 private:
  void* keep(std::size_t bytes) {
    void* p = ops_.allocate(bytes);
    owned_.push_back(p);
    return p;
  }
  template <class U>
  const U* upload(const std::vector<U>& host) {
    if (host.empty()) return nullptr;
    void* p = keep(host.size() * sizeof(U));
    ops_.upload(p, host.data(), host.size() * sizeof(U));
    return static_cast<const U*>(p);
  }
  // Expanded over every (b, h) in the kernels' order; each row block's states copied in turn.
  void upload_block_mask(const attention::BlockMask& m) {
    const std::size_t row_blocks = kernel_math::tile_count(a_.Tq, tile_);
    std::vector<std::size_t> lo, hi, first;
    std::vector<unsigned char> states;
    for (std::size_t bh = 0; bh < a_.B * a_.H; ++bh) {
      for (std::size_t rb = 0; rb < row_blocks; ++rb) {
        const auto& r = m.row_block(bh / a_.H, bh % a_.H, rb);
        lo.push_back(r.lo), hi.push_back(r.hi), first.push_back(states.size());
        for (std::size_t t = 0; r.lo + t * tile_ < r.hi; ++t) {
          states.push_back(static_cast<unsigned char>(m.state(r, t)));
        }
      }
    }
    if (states.empty()) states.push_back(0);  // every row block empty: a valid pointer still
    args_.block_lo = upload(lo);
    args_.block_hi = upload(hi);
    args_.block_first = upload(first);
    args_.block_states = upload(states);
    args_.row_blocks = row_blocks;
  }

  DeviceOps<T>& ops_;
  const DeviceProgram<T>& program_;
  AttentionParams<T> a_;
  DeviceProgramArgs<T> args_;
  std::size_t tile_ = 0, width_ = 0, rows_ = 0;
  std::vector<std::size_t> sizes_;
  std::shared_ptr<const attention::BlockMask> block_mask_;
  std::vector<void*> owned_;
};

}  // namespace attnlab::cuda
