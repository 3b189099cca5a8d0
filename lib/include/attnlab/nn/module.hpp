// The Module contract (lib/README.md, "The Module contract"):
//   - forward(x) caches what backward needs and returns y;
//   - backward(dy) returns dx and ADDS into the grads of the module's Parameters;
//   - zero_grad() is the only thing that clears grads;
//   - parameters() lists them with stable hierarchical names ("blocks.0.attn.w_q");
//   - backward before forward throws std::logic_error;
//   - backward reads the parameters as they are then: change them between a forward and its
//     backward (an optimizer step) and the gradients are wrong (PyTorch raises in that case).
//
// One model, any backend. Every Module is written once, over Buffers (attnlab/buffer.hpp) and the
// operations of its backend (attnlab/device_ops.hpp): the CPU (the default), a CUDA device, or the
// emulated device. Module::to(ops) moves a module and its children; nothing else changes. Host
// code keeps xtensor in and out: the Tensor3 overloads copy to the backend and back.
//
// SequenceModule is the common case, a layer (B, T, in) -> (B, T, out). Its public forward and
// backward are non-virtual: they check shapes, the backend and the call order, then call the
// virtual forward_impl / backward_impl (the tiny-cuda-nn boundary), so every layer reports errors
// alike.
#pragma once

// First, before any xtensor header.
#include "attnlab/xtensor_config.hpp"

#include <algorithm>
#include <array>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

#include <xtensor/xarray.hpp>
#include <xtensor/xbuilder.hpp>

#include "attnlab/backends/cpu.hpp"
#include "attnlab/buffer.hpp"
#include "attnlab/nn/parameter.hpp"
#include "attnlab/tensor.hpp"

namespace attnlab {

template <class T>
class Module {
 public:
  virtual ~Module() = default;
  Module() = default;
  Module(const Module&) = delete;
  Module& operator=(const Module&) = delete;

  // Appends this module's parameters to `out`, each name prefixed with `prefix`. A prefix is empty
  // or ends with '.', e.g. "blocks.0.attn."; children are collected with prefix + "child.".
  virtual void collect_parameters(const std::string& prefix, ParameterList<T>& out) = 0;

  // The parameters, in a fixed order (the order of construction), with hierarchical names.
  ParameterList<T> parameters(const std::string& prefix = "") {
    ParameterList<T> out;
    collect_parameters(prefix, out);
    return out;
  }

  // Sets every parameter's grad to 0 (where the backend keeps it).
  void zero_grad();

  // Total number of scalar parameters.
  std::size_t num_parameters() {
    std::size_t n = 0;
    for (auto& p : parameters()) n += p.param->size();
    return n;
  }

  // The backend this module computes on (the CPU until to() is called).
  DeviceOps<T>& ops() const { return ops_ ? *ops_ : cpu_ops<T>(); }

  // Moves this module and its children to `ops` (which must outlive them), parameters included:
  // on a device backend the values and grads go to one flat arena in parameters() order (the
  // optimizers and the grad norm then run there); on the CPU backend they come back into the
  // Parameter xarrays. The cached forward is dropped (backward then throws until the next
  // forward). Moving to the backend the module is on does nothing.
  void to(DeviceOps<T>& ops);
  // Device backend: copies the parameter values (and grads) from the arena into the Parameter
  // xarrays, for host code that reads them (checkpoints, metrics). A no-op on the CPU backend.
  void copy_to_host(bool grads = false);
  // Device backend: copies the Parameter xarrays' values into the arena, after host code changed
  // them (a checkpoint load). A no-op on the CPU backend.
  void copy_to_device();

  // Training or evaluation mode, as torch's train()/eval(): dropout is active only in training.
  // A module starts in training mode; these set the children too.
  void train(bool on = true);
  void eval() { train(false); }
  bool training() const { return training_; }

  // Keys the dropout masks of the following training forwards on a run's seed and a step: each
  // module of the tree gets attention::dropout_key(seed, step, i), with i its index in a
  // depth-first walk, so layers draw different masks. A module that draws a mask then advances
  // its own step, so that successive forwards draw fresh masks. The trainer calls this at every
  // step, so a resumed run draws the masks it would have drawn; a gradient check calls it before
  // each forward to hold the masks fixed. Without a call the seed is 0.
  void set_dropout_key(std::uint64_t seed, std::uint64_t step);

  // The device arenas (empty on the CPU backend): parameter i occupies a contiguous run, in
  // parameters() order.
  const Buffer<T>& value_arena() const { return arena_values_; }
  const Buffer<T>& grad_arena() const { return arena_grads_; }

 protected:
  // The direct children, for to(): composites list theirs.
  virtual void for_each_child(const std::function<void(Module<T>&)>& /*visit*/) {}
  // Called after the backend changed: drop whatever the last forward cached.
  virtual void reset_cache() {}
  // The key of this module's next dropout mask (a training forward with dropout calls it once per
  // mask); advances the module's step.
  std::uint64_t next_dropout_key();

 private:
  void set_backend(DeviceOps<T>* ops);
  std::uint32_t key_tree(std::uint64_t seed, std::uint64_t step, std::uint32_t index);

  DeviceOps<T>* ops_ = nullptr;
  Buffer<T> arena_values_, arena_grads_;
  bool training_ = true;
  std::uint64_t dropout_seed_ = 0, dropout_step_ = 0;
  std::uint32_t dropout_index_ = 0;
};

// ---- Buffers and host tensors -----------------------------------------------------------------

// A copy of a host tensor on `memory`.
template <class T, class E>
Buffer<T> to_buffer(DeviceMemory& memory, const E& host) {
  return Buffer<T>::from_host(memory, host.data(),
                              std::vector<std::size_t>(host.shape().begin(), host.shape().end()));
}

// A host copy of a Buffer of rank N (ShapeError naming `op` otherwise).
template <class T, std::size_t N>
Tensor<T, N> to_tensor(const Buffer<T>& b, std::string_view op = "to_tensor") {
  if (b.rank() != N) {
    throw ShapeError(op, "buffer", std::vector<std::ptrdiff_t>(N, kAnyExtent), b.shape());
  }
  std::array<std::size_t, N> shape;
  std::copy(b.shape().begin(), b.shape().end(), shape.begin());
  Tensor<T, N> t(shape);
  b.copy_to_host(t.data());
  return t;
}

// A (B, Tk) key mask as bytes on `memory` (nonzero = may attend), what the attention kernels read.
inline Buffer<unsigned char> to_byte_mask(DeviceMemory& memory, const KeyMask& mask) {
  std::vector<unsigned char> bytes(mask.size());
  for (std::size_t i = 0; i < bytes.size(); ++i) bytes[i] = mask.data()[i] ? 1 : 0;
  return Buffer<unsigned char>::from_host(memory, bytes.data(), {mask.shape()[0], mask.shape()[1]});
}

// True when every one of n host values is finite: a branch-free test of the exponent bits (the
// compiler vectorises it), in parallel for large n. The training step runs it on every block's
// output while its non-finite check is on.
template <class T>
bool all_finite_host(const T* x, std::size_t n);

// True when every value is finite (read in place on the CPU backend, copied to the host from a
// device: for checks that are switched on).
template <class T>
bool all_finite(const Buffer<T>& b) {
  if (b.memory() != nullptr && b.memory()->host_memory())
    return all_finite_host(b.data(), b.size());
  const std::vector<T> values = b.to_vector();
  return all_finite_host(values.data(), values.size());
}

// Throws std::invalid_argument "<op>: <arg> expected on backend '<expected>', got '<actual>'".
[[noreturn]] void throw_wrong_backend(std::string_view op, std::string_view arg,
                                      const DeviceMemory& expected, const DeviceMemory* actual);

// Throws ShapeError unless `b` has the expected extents, std::invalid_argument unless it lives on
// `ops`: "Linear: x expected on backend 'cuda: ...', got 'cpu'".
template <class E>
void check_buffer(std::string_view op, std::string_view arg, const Buffer<E>& b,
                  const DeviceMemory& ops, std::initializer_list<std::ptrdiff_t> expected) {
  check_extents(op, arg, b.shape(), std::vector<std::ptrdiff_t>(expected));
  if (b.size() > 0 && b.memory() != &ops) throw_wrong_backend(op, arg, ops, b.memory());
}

template <class T>
class SequenceModule : public Module<T> {
 public:
  // x: (B, T, in_features()) on this module's backend. Returns y (B, T, out_features()) there and
  // caches what backward needs. Throws ShapeError naming the module when x's width is wrong.
  Buffer<T> forward(const Buffer<T>& x) {
    check_input(x);
    Buffer<T> y = forward_impl(x);
    mark_forward(x.dim(0), x.dim(1));
    return y;
  }
  // Host tensors in and out (copied to the backend and back).
  Tensor3<T> forward(const Tensor3<T>& x) {
    return to_tensor<T, 3>(forward(to_buffer<T>(this->ops(), x)), type_name());
  }
  // The same for a dynamic-rank input: a rank other than 3 throws ShapeError.
  Tensor3<T> forward(const xt::xarray<T>& x) {
    check_extents(type_name(), "x", std::vector<std::size_t>(x.shape().begin(), x.shape().end()),
                  {kAnyExtent, kAnyExtent, static_cast<std::ptrdiff_t>(in_features())});
    return forward(Tensor3<T>(x));
  }

  // dy: (B, T, out_features()) of the last forward. Returns dx (B, T, in_features()) and ADDS
  // into the parameter grads. Throws std::logic_error before any forward, ShapeError on mismatch.
  Buffer<T> backward(const Buffer<T>& dy) {
    if (!has_forward_) {
      throw std::logic_error(std::string(type_name()) + "::backward: called before forward");
    }
    check_buffer(type_name(), "dy", dy, this->ops(),
                 {static_cast<std::ptrdiff_t>(batch_), static_cast<std::ptrdiff_t>(length_),
                  static_cast<std::ptrdiff_t>(out_features())});
    return backward_impl(dy);
  }
  Tensor3<T> backward(const Tensor3<T>& dy) {
    if (!has_forward_) {
      throw std::logic_error(std::string(type_name()) + "::backward: called before forward");
    }
    check_shape(type_name(), "dy", dy,
                {static_cast<std::ptrdiff_t>(batch_), static_cast<std::ptrdiff_t>(length_),
                 static_cast<std::ptrdiff_t>(out_features())});
    return to_tensor<T, 3>(backward(to_buffer<T>(this->ops(), dy)), type_name());
  }

  virtual std::size_t in_features() const = 0;
  virtual std::size_t out_features() const = 0;
  // The layer's name in error messages, e.g. "MultiHeadAttention".
  virtual std::string_view type_name() const = 0;

 protected:
  virtual Buffer<T> forward_impl(const Buffer<T>& x) = 0;
  virtual Buffer<T> backward_impl(const Buffer<T>& dy) = 0;

  void check_input(const Buffer<T>& x) const {
    check_buffer(type_name(), "x", x, this->ops(),
                 {kAnyExtent, kAnyExtent, static_cast<std::ptrdiff_t>(in_features())});
  }
  void check_input(const Tensor3<T>& x) const {
    check_shape(type_name(), "x", x,
                {kAnyExtent, kAnyExtent, static_cast<std::ptrdiff_t>(in_features())});
  }
  // For derived forward overloads (e.g. attention with a mask): records the (B, T) of the output.
  void mark_forward(std::size_t batch, std::size_t length) {
    has_forward_ = true;
    batch_ = batch;
    length_ = length;
  }
  void reset_cache() override { has_forward_ = false; }

 private:
  bool has_forward_ = false;
  std::size_t batch_ = 0, length_ = 0;
};

// A layer written on host tensors, the quick way to write one's own (or prototype one): implement
// forward_host / backward_host on Tensor3 and read the Parameters' xarrays, as before there were
// backends. It runs on the CPU backend (its input and output are copied to and from the host); on
// a device backend its forward throws std::logic_error naming the layer (write forward_impl /
// backward_impl over the backend's operations to run there).
template <class T>
class HostSequenceModule : public SequenceModule<T> {
 protected:
  virtual Tensor3<T> forward_host(const Tensor3<T>& x) = 0;
  virtual Tensor3<T> backward_host(const Tensor3<T>& dy) = 0;

  Buffer<T> forward_impl(const Buffer<T>& x) final {
    if (!this->ops().host_memory()) {
      throw std::logic_error(
          std::string(this->type_name()) +
          "::forward: a host-tensor layer runs on the CPU backend only, not on '" +
          this->ops().name() + "'");
    }
    return to_buffer<T>(this->ops(), forward_host(to_tensor<T, 3>(x, this->type_name())));
  }
  Buffer<T> backward_impl(const Buffer<T>& dy) final {
    return to_buffer<T>(this->ops(), backward_host(to_tensor<T, 3>(dy, this->type_name())));
  }
};

// ---- Helpers for module implementations ---------------------------------------------------------

// A parameter holding `value`, with a zero grad of the same shape.
template <class T, class E>
Parameter<T> make_parameter(const E& value) {
  Parameter<T> p;
  p.value = value;
  p.grad = xt::zeros<T>(p.value.shape());
  return p;
}

// grad += g on the backend (same number of elements: the add-into contract).
template <class T>
void add_into(DeviceOps<T>& ops, Parameter<T>& p, const Buffer<T>& g) {
  ops.add(p.grad_data(), p.grad_data(), g.data(), p.size());
}

}  // namespace attnlab
