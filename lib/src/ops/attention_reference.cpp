// The reference CPU attention: the readable definition of the contract (attnlab/ops/attention.hpp),
// one (b, h) slice per thread, whole (Tq, Tk) matrices through blas::gemm, P materialised.
//   S = s · Q Kᵀ (the score rule, attnlab/attention/score_rule.hpp), P = softmax(S), O = P V;
//   dV = Pᵀ dO, dP = dO Vᵀ, dS = P ⊙ (dP − rowsum(dP ⊙ P)), dQ = s · dS K, dK = s · dSᵀ Q;
//   with grouped-query attention dK and dV sum over the query heads that share a K/V head; dS goes
//   to p.dscores when set (the bias gradient). With a softcap c, S = c·tanh(U/c) + ... for
//   U = s · Q Kᵀ, and dQ, dK take dU = dS ⊙ (1 − tanh²(U/c)), U recomputed by one more GEMM.
//   Dropout: O = Pd V with Pd = P ⊙ M / (1 − p), and dV = Pdᵀ dO, dP = (dO Vᵀ) ⊙ M / (1 − p), the
//   mask regenerated (attnlab/attention/dropout.hpp).
#include <algorithm>
#include <cstddef>
#include <memory>
#include <vector>

#include "attnlab/attention/dropout.hpp"
#include "attnlab/attention/score_rule.hpp"
#include "attnlab/blas.hpp"
#include "attnlab/ops/softmax.hpp"
#include "attnlab/threads.hpp"
#include "kernels/attention.hpp"
#include "kernels/attention_program.hpp"

namespace attnlab::detail {

namespace {

// U = s · Q Kᵀ of one (b, h) slice: up (Tq,Tk).
template <class T>
void scaled_dots(T* up, const AttentionParams<T>& p, std::size_t bh) {
  const std::size_t h = bh % p.H, kv = p.kv_slice_of(bh);
  const int m = static_cast<int>(p.Tq), n = static_cast<int>(p.Tk), d = static_cast<int>(p.D);
  //                                                      (Tq,D) x (D,Tk) -> (Tq,Tk)
  blas::gemm<T>(false, true, m, n, d, p.scale[h], p.q + bh * p.Tq * p.D, d, p.k + kv * p.Tk * p.D,
                d, T(0), up, n);
}

// One (b, h) slice of S = s · Q Kᵀ with hidden positions at -inf: sp (Tq,Tk). With a program,
// visible (Tq,Tk) receives the slice's visibility and slope (optional) ∂S/∂U: the mask program is
// evaluated at every position (no block skipping on this path).
template <class T>
void scores_slice(T* sp, const AttentionParams<T>& p, std::size_t bh,
                  unsigned char* visible = nullptr, T* slope = nullptr) {
  const std::size_t b = bh / p.H, h = bh % p.H;
  scaled_dots(sp, p, bh);
  if (p.has_program()) {
    (void)program_scores(sp, slope, visible, p, b, h, 0, p.Tq, 0, p.Tk,
                         attention::BlockState::partial);
    return;
  }
  for (std::size_t i = 0; i < p.Tq; ++i) attention::score_row(p, b, h, i, 0, p.Tk, sp + i * p.Tk);
}

}  // namespace

template <class T>
void sdpa_reference_scores(T* scores, const AttentionParams<T>& p) {
  const auto bh_count = static_cast<std::ptrdiff_t>(p.B * p.H);
#pragma omp parallel num_threads(num_threads())
  {
    std::vector<unsigned char> visible(p.score_program != nullptr ? p.Tq * p.Tk : 0);
#pragma omp for schedule(static)
    for (std::ptrdiff_t bh = 0; bh < bh_count; ++bh) {
      scores_slice(scores + bh * p.Tq * p.Tk, p, static_cast<std::size_t>(bh), visible.data());
    }
  }
}

// Pd = P ⊙ M / (1 − p), the dropped weights of slice bh, into pd (Tq,Tk).
template <class T>
void dropped_slice(T* pd, const T* pp, const AttentionParams<T>& p, std::size_t bh) {
  std::copy_n(pp, p.Tq * p.Tk, pd);
  for (std::size_t i = 0; i < p.Tq; ++i) {
    attention::attention_dropout_row(p, bh, i, 0, p.Tk, pd + i * p.Tk);
  }
}

template <class T>
void sdpa_reference_forward(T* out, T* probs, const AttentionParams<T>& p) {
  const std::size_t Tq = p.Tq, Tk = p.Tk, Dv = p.Dv;
  const int m = static_cast<int>(Tq), n = static_cast<int>(Tk), dv = static_cast<int>(Dv);
  const auto bh_count = static_cast<std::ptrdiff_t>(p.B * p.H);
  const bool dropout = p.dropout_p != 0;
#pragma omp parallel num_threads(num_threads())
  {
    // Per-thread scratch for the dropped weights (dropout only), and a score program's visibility.
    const std::unique_ptr<T[]> pd(dropout ? new T[Tq * Tk] : nullptr);
    std::vector<unsigned char> visible(p.score_program != nullptr ? Tq * Tk : 0);
#pragma omp for schedule(static)
    for (std::ptrdiff_t bh = 0; bh < bh_count; ++bh) {
      const std::size_t kv = p.kv_slice_of(static_cast<std::size_t>(bh));
      T* pp = probs + bh * Tq * Tk;
      scores_slice(pp, p, static_cast<std::size_t>(bh), visible.data());  // S, hidden at -inf
      softmax_rows_forward(pp, pp, Tq, Tk);  // P = softmax(S), in place
      if (dropout) dropped_slice(pd.get(), pp, p, static_cast<std::size_t>(bh));
      // O = P V (P ⊙ M / (1 − p) with dropout)          (Tq,Tk) x (Tk,Dv) -> (Tq,Dv)
      blas::gemm<T>(false, false, m, dv, n, T(1), dropout ? pd.get() : pp, n, p.v + kv * Tk * Dv,
                    dv, T(0), out + bh * Tq * Dv, dv);
    }
  }
}

template <class T>
void sdpa_reference_backward(T* dq, T* dk, T* dv, T* dscale_part, const T* dout, const T* probs,
                             const AttentionParams<T>& p) {
  const std::size_t Tq = p.Tq, Tk = p.Tk, D = p.D, Dv = p.Dv;
  const int m = static_cast<int>(Tq), n = static_cast<int>(Tk), d = static_cast<int>(D),
            dvw = static_cast<int>(Dv);
  // One K/V slice (b, kv head) per task: its group's query heads bh = kv·g + r, r in order, add
  // their dK and dV into it (the first assigns), so grouped-query attention sums without races.
  const std::size_t group = p.group();
  const auto kv_count = static_cast<std::ptrdiff_t>(p.B * p.Hkv);
#pragma omp parallel num_threads(num_threads())
  {
    // Per-thread scratch: dP, then dS in place; left uninitialised (gemm assigns it with beta = 0).
    // With dropout, the dropped weights Pd too.
    // With a score program: U, the slope dS/dU, S recomputed, the visibility.
    const bool dropout = p.dropout_p != 0, capped = p.softcap != 0;
    const bool program = p.score_program != nullptr;
    const std::unique_ptr<T[]> ds(new T[Tq * Tk]);
    const std::unique_ptr<T[]> pd(dropout ? new T[Tq * Tk] : nullptr);
    const std::unique_ptr<T[]> slope(capped || program ? new T[Tq * Tk] : nullptr);
    const std::unique_ptr<T[]> u(program ? new T[Tq * Tk] : nullptr);
    const std::unique_ptr<T[]> recomputed(program ? new T[Tq * Tk] : nullptr);
    std::vector<unsigned char> visible(program ? Tq * Tk : 0);
#pragma omp for schedule(static)
    for (std::ptrdiff_t kv_index = 0; kv_index < kv_count; ++kv_index) {
      const auto kv = static_cast<std::size_t>(kv_index);
      const std::vector<T*> grads = program_grad_row(p, kv);
      const T* kp = p.k + kv * Tk * D;
      const T* vp = p.v + kv * Tk * Dv;
      for (std::size_t r = 0; r < group; ++r) {
        const std::size_t bh = kv * group + r;
        const T s = p.scale[bh % p.H];
        const T beta = r == 0 ? T(0) : T(1);
        const T* pp = probs + bh * Tq * Tk;
        const T* dop = dout + bh * Tq * Dv;
        const T* qp = p.q + bh * Tq * D;
        T* dqp = dq + bh * Tq * D;
        if (dropout) dropped_slice(pd.get(), pp, p, bh);
        // dV (+)= Pᵀ dO (Pd with dropout)               (Tk,Tq) x (Tq,Dv) -> (Tk,Dv)
        blas::gemm<T>(true, false, n, dvw, m, T(1), dropout ? pd.get() : pp, n, dop, dvw, beta,
                      dv + kv * Tk * Dv, dvw);
        // dP = dO Vᵀ (⊙ M / (1 − p) with dropout)       (Tq,Dv) x (Dv,Tk) -> (Tq,Tk)
        blas::gemm<T>(false, true, m, n, dvw, T(1), dop, dvw, vp, dvw, T(0), ds.get(), n);
        for (std::size_t i = 0; dropout && i < Tq; ++i) {
          attention::attention_dropout_row(p, bh, i, 0, Tk, ds.get() + i * Tk);
        }
        // dS = P ⊙ (dP − rowsum(dP ⊙ P)); hidden positions have P = 0, hence dS = 0 there.
        softmax_rows_backward(ds.get(), ds.get(), pp, Tq, Tk);
        if (p.dscores != nullptr) std::copy_n(ds.get(), Tq * Tk, p.dscores + bh * Tq * Tk);
        if (program) {
          // dU = dS ⊙ f'(U) and the parameters' Σ dS · ∂f/∂θ, from U = s · Q Kᵀ recomputed
          scaled_dots(u.get(), p, bh);
          std::copy_n(u.get(), Tq * Tk, recomputed.get());
          (void)program_scores(recomputed.get(), slope.get(), visible.data(), p, bh / p.H, bh % p.H,
                               0, Tq, 0, Tk, attention::BlockState::partial);
          program_tile_grads(p, grads, u.get(), ds.get(), bh / p.H, bh % p.H, 0, Tq, 0, Tk);
          for (std::size_t e = 0; e < Tq * Tk; ++e) ds[e] *= slope[e];
        } else if (capped) {
          // dU = dS ⊙ (1 − tanh²(U/c)), U = s · Q Kᵀ        (Tq,D) x (D,Tk) -> (Tq,Tk)
          blas::gemm<T>(false, true, m, n, d, s, qp, d, kp, d, T(0), slope.get(), n);
          attention::cap_row(p, Tq * Tk, slope.get(), slope.get());
          for (std::size_t e = 0; e < Tq * Tk; ++e) ds[e] *= slope[e];
        }
        // dQ = s · dS K                                  (Tq,Tk) x (Tk,D) -> (Tq,D)
        blas::gemm<T>(false, false, m, d, n, s, ds.get(), n, kp, d, T(0), dqp, d);
        // dK (+)= s · dSᵀ Q                              (Tk,Tq) x (Tq,D) -> (Tk,D)
        blas::gemm<T>(true, false, n, d, m, s, ds.get(), n, qp, d, beta, dk + kv * Tk * D, d);
        // dL/ds = Σ dS ⊙ (Q Kᵀ) = ⟨dS K, Q⟩ = ⟨dQ, Q⟩ / s
        T acc = 0;
        for (std::size_t i = 0; i < Tq * D; ++i) acc += dqp[i] * qp[i];
        dscale_part[bh] = acc / s;
      }
    }
  }
}

#define ATTNLAB_INSTANTIATE_SDPA_REFERENCE(T)                                  \
  template void sdpa_reference_scores<T>(T*, const AttentionParams<T>&);       \
  template void sdpa_reference_forward<T>(T*, T*, const AttentionParams<T>&);  \
  template void sdpa_reference_backward<T>(T*, T*, T*, T*, const T*, const T*, \
                                           const AttentionParams<T>&);
ATTNLAB_INSTANTIATE_SDPA_REFERENCE(float)
ATTNLAB_INSTANTIATE_SDPA_REFERENCE(double)
#undef ATTNLAB_INSTANTIATE_SDPA_REFERENCE

}  // namespace attnlab::detail
