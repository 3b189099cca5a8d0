// Buffer<E>: the small tensor handle the Modules are written over. A shape, and a block of memory
// on one backend (attnlab/device_ops.hpp: the CPU, a CUDA device, the emulated device), shared by
// reference: copying a Buffer copies the handle, not the values (as a torch.Tensor does).
//
// The Modules take and return Buffers on their backend and cache the Buffers their backward needs;
// the values never pass through the host. Host code moves values in and out with from_host /
// to_host (a copy, also on the CPU backend). E is the element type: T for activations, int for
// token ids, unsigned char for key masks, double for reductions.
//
// No xtensor here (nvcc-free and light); to_tensor in attnlab/nn/module.hpp gives an xtensor.
#pragma once

#include <cstddef>
#include <memory>
#include <utility>
#include <vector>

#include "attnlab/device_ops.hpp"

namespace attnlab {

template <class E>
class Buffer {
 public:
  Buffer() = default;

  // Uninitialised values of `shape` on `memory` (which must outlive every handle to them).
  Buffer(DeviceMemory& memory, std::vector<std::size_t> shape)
      : memory_(&memory), shape_(std::move(shape)) {
    const std::size_t n = size();
    capacity_ = n;
    if (n == 0) return;
    DeviceMemory* m = memory_;
    storage_ = std::shared_ptr<E>(static_cast<E*>(m->allocate(n * sizeof(E))),
                                  [m](E* p) { m->release(p); });
  }

  // Zeros of `shape`.
  static Buffer zeros(DeviceMemory& memory, std::vector<std::size_t> shape) {
    Buffer b(memory, std::move(shape));
    b.fill_zero();
    return b;
  }

  // A copy of the size() values at `host` (row-major, `shape`).
  static Buffer from_host(DeviceMemory& memory, const E* host, std::vector<std::size_t> shape) {
    Buffer b(memory, std::move(shape));
    if (b.size() > 0) memory.upload(b.data(), host, b.size() * sizeof(E));
    return b;
  }

  // A view of `count` values of `owner` from element `offset` on, shaped `shape` (same storage,
  // kept alive by the view).
  static Buffer view(const Buffer& owner, std::size_t offset, std::vector<std::size_t> shape) {
    Buffer b;
    b.memory_ = owner.memory_;
    b.shape_ = std::move(shape);
    b.capacity_ = b.size();
    b.storage_ = std::shared_ptr<E>(owner.storage_, owner.data() + offset);
    return b;
  }

  DeviceMemory* memory() const { return memory_; }
  E* data() const { return storage_.get(); }
  const std::vector<std::size_t>& shape() const { return shape_; }
  std::size_t dim(std::size_t axis) const { return shape_.at(axis); }
  std::size_t rank() const { return shape_.size(); }
  std::size_t size() const {
    if (shape_.empty()) return memory_ ? 1 : 0;
    std::size_t n = 1;
    for (std::size_t e : shape_) n *= e;
    return n;
  }
  bool empty() const { return size() == 0; }

  // Copies the values to `host` (size() elements); synchronises.
  void copy_to_host(E* host) const {
    if (size() > 0) memory_->download(host, data(), size() * sizeof(E));
  }
  std::vector<E> to_vector() const {
    std::vector<E> out(size());
    copy_to_host(out.data());
    return out;
  }
  void fill_zero() {
    if (size() > 0) memory_->zero(data(), size() * sizeof(E));
  }
  // The same storage under another shape of the same size.
  Buffer reshaped(std::vector<std::size_t> shape) const {
    Buffer b = *this;
    b.shape_ = std::move(shape);
    return b;
  }

  // Makes `slot` a Buffer of `shape` on `memory`, reusing its storage when nothing else holds it
  // and it is large enough (the values are then stale, not cleared). A Module's outputs and caches
  // go through here, so a training step allocates nothing once shapes settle, and an output the
  // caller still holds is never overwritten.
  static Buffer& reuse(Buffer& slot, DeviceMemory& memory, std::vector<std::size_t> shape) {
    std::size_t n = 1;
    for (std::size_t e : shape) n *= e;
    if (slot.memory_ == &memory && slot.storage_ && slot.storage_.use_count() == 1 &&
        slot.capacity_ >= n) {
      slot.shape_ = std::move(shape);
      return slot;
    }
    slot = Buffer(memory, std::move(shape));
    return slot;
  }

 private:
  DeviceMemory* memory_ = nullptr;
  std::shared_ptr<E> storage_;
  std::vector<std::size_t> shape_;
  std::size_t capacity_ = 0;
};

}  // namespace attnlab
