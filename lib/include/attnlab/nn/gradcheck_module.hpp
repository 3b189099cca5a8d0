// Gradient checking for Modules: the public facility users run on their own layers, and the one
// the test suite uses. Double precision, central differences (attnlab/gradcheck.hpp).
//
// For a sequence module the loss is a random projection of the output,
//   L(x, θ) = Σ r ⊙ forward(x),   r ~ N(0, 1) fixed by the seed,
// so dL/dy = r and a single backward(r) gives the analytic dx and every parameter gradient.
// The report has one row for the input ("x") and one per named parameter ("attn.w_q", ...), each
// with the max absolute error, the relative error ‖g − ĝ‖ / max(‖g‖, ‖ĝ‖) and the worst index.
//
// The checker calls zero_grad() on the module: its grads are overwritten. Parameter values are
// perturbed in place and restored.
#pragma once

#include <cstdint>
#include <functional>

#include "attnlab/gradcheck.hpp"
#include "attnlab/nn/module.hpp"

namespace attnlab {

struct ModuleGradcheckOptions {
  double eps = 1e-6;          // central-difference step
  std::uint64_t seed = 1234;  // seed of the projection r
  bool check_input = true;    // also check dx (row "x")
};

using SequenceFunction = std::function<Tensor3<double>(const Tensor3<double>&)>;

// Checks module.forward / module.backward on input x (B, T, in_features()).
GradcheckReport check_module_gradients(SequenceModule<double>& module, const Tensor3<double>& x,
                                       const ModuleGradcheckOptions& options = {});

// The general form: `forward` maps x to y (any (B, T', C') output), `backward` maps dy to dx; both
// must go through `module` (e.g. attention with a key mask, cross-attention with a fixed context,
// a user's own composite).
GradcheckReport check_module_gradients(Module<double>& module, const Tensor3<double>& x,
                                       const SequenceFunction& forward,
                                       const SequenceFunction& backward,
                                       const ModuleGradcheckOptions& options = {});

// Parameters only, for modules whose input is not differentiable (a Transformer on token ids).
// `loss(true)` must run forward and backward (adding dL/dθ into the grads) and return L;
// `loss(false)` must run the forward only and return L. The checker zero_grads first.
GradcheckReport check_parameter_gradients(Module<double>& module,
                                          const std::function<double(bool with_backward)>& loss,
                                          double eps = 1e-6);

}  // namespace attnlab
