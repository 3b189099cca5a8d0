// What a backend may keep of the operands of linear calls that read the same x or W more than
// once: a layer's backward reads the x and W of its forward, and a self-attention's three
// projections read one x. The caller owns the keep and promises that every x and W it passed with
// it stays unchanged until it calls clear(), as a layer's backward already needs its forward's x
// and W unchanged; a layer clears its keep at the start of each forward. The backend fills and
// reads it: the CPU keeps the bf16 roundings of x and W under a bf16 GemmPrecisionScope (so each
// is rounded once per forward and backward, lib/README.md "Mixed precision"); a backend that keeps
// nothing leaves it empty. A copy of a keep holds nothing; results never depend on what a keep
// holds.
#pragma once

#include <memory>

namespace attnlab {

class OperandKeep {
 public:
  // A backend's own record (e.g. the CPU's rounded operands).
  class State {
   public:
    virtual ~State() = default;
    // Forget every operand held (its storage may be kept for reuse).
    virtual void clear() = 0;
  };

  OperandKeep() = default;
  OperandKeep(const OperandKeep&) {}
  OperandKeep& operator=(const OperandKeep&) {
    state_.reset();
    return *this;
  }
  OperandKeep(OperandKeep&&) noexcept = default;
  OperandKeep& operator=(OperandKeep&&) noexcept = default;

  // The caller's operands may change from here on.
  void clear() {
    if (state_) state_->clear();
  }

  // The backend's record of type S, made empty when the keep holds none or another backend's.
  template <class S>
  S& state() {
    if (auto* s = dynamic_cast<S*>(state_.get())) return *s;
    auto made = std::make_unique<S>();
    S& s = *made;
    state_ = std::move(made);
    return s;
  }

 private:
  std::unique_ptr<State> state_;
};

}  // namespace attnlab
