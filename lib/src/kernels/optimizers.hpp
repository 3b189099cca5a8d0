// The element math of the optimizer steps (attnlab/optim: AdamW, SGD, Muon's momentum), which the
// CUDA kernels (lib/backends/cuda/optimizers.cuh) and the CPU backend (lib/backends/cpu) run, so
// every backend steps a parameter with the same bits. There is no xtensor front: the optimizers
// call DeviceOps. The scalars of an AdamW step (kernel_math::AdamWScalars) are public, as
// attnlab/device_ops.hpp takes them. Seen by nvcc: no xtensor, no xsimd, no OpenMP here.
#pragma once

#include "attnlab/kernel_math.hpp"

namespace attnlab::kernel_math {

// torch.lerp(a, b, w) = a + w (b − a), in the form that is exact at both ends (torch's kernel).
template <class T>
ATTNLAB_HD inline T lerp(T a, T b, T w) {
  return w < T(0.5) ? a + w * (b - a) : b - (b - a) * (T(1) - w);
}

// One element of Muon's momentum (Keller Jordan's muon_update): m ← lerp(m, g, 1 − β); the update
// is lerp(g, m, β) with Nesterov (g + β (m − g)), m itself without. 1 − β comes formed in double,
// as PyTorch forms it in Python.
template <class T>
ATTNLAB_HD inline T muon_momentum_element(T& m, T g, T beta, T one_minus_beta, bool nesterov) {
  m = lerp(m, g, one_minus_beta);
  return nesterov ? lerp(g, m, beta) : m;
}

// One element of AdamW, in torch's order: p ← p·decay; m ← lerp(m, g, 1−β1);
// v ← v·β2 + (1−β2) g²; p ← p − step_size · m / (√v / √(1−β2^t) + eps).
template <class T>
ATTNLAB_HD inline void adamw_element(T& p, T& m, T& v, T g, const AdamWScalars<T>& s) {
  if (s.decays) p = p * s.decay;
  m = lerp(m, g, s.one_minus_beta1);
  v = v * s.beta2 + s.one_minus_beta2 * g * g;
  const T denom = sqrt_of(v) / s.bias_correction2_sqrt + s.eps;
  p = p + (-s.step_size) * m / denom;
}

// One element of SGD (torch.optim.SGD, dampening 0, no Nesterov), in attnlab::SGD's order:
// d = g + wd·p (when wd != 0); with momentum (buf not null): buf = d on the first step, else
// buf·momentum + d, and d = buf; p = p + (−lr)·d.
template <class T>
ATTNLAB_HD inline void sgd_element(T& p, T* buf, T g, T lr, T momentum, T weight_decay,
                                   bool first_step) {
  T d = g;
  if (weight_decay != T(0)) d = d + weight_decay * p;
  if (buf) {
    *buf = first_step ? d : *buf * momentum + d;
    d = *buf;
  }
  p = p + (-lr) * d;
}

}  // namespace attnlab::kernel_math
