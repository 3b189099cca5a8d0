// Gradient clipping by global norm.
//
// Reference: torch.nn.utils.clip_grad_norm_ (norm_type 2, error_if_nonfinite false).
#pragma once

#include "attnlab/nn/parameter.hpp"

namespace attnlab {

// Added to the norm in the clip coefficient max_norm / (norm + kClipNormEps), as in PyTorch, so
// that a clipped norm lands just under max_norm.
inline constexpr double kClipNormEps = 1e-6;

// Returns the global 2-norm of all grads, sqrt(sum over parameters and entries of g^2), computed
// in double before clipping, in a fixed order (parameter order, then row-major). When it exceeds
// max_norm, multiplies every grad in place by max_norm / (norm + kClipNormEps); otherwise leaves
// the grads untouched. A non-finite norm is returned as is and the grads are left untouched, so
// that the caller can detect divergence. Throws std::invalid_argument unless max_norm is finite
// and > 0.
template <class T>
double clip_grad_norm(const ParameterList<T>& params, double max_norm);

// The global 2-norm of all grads, as above, without clipping.
template <class T>
double grad_norm(const ParameterList<T>& params);

}  // namespace attnlab
