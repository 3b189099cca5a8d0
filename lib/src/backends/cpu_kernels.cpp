#include "cpu_kernels.hpp"

#include <algorithm>
#include <cmath>

#include "../parallel_rows.hpp"
#include "attnlab/ops/softmax.hpp"

namespace attnlab::cpu_backend {

using detail::for_chunks;
using detail::for_row_chunks;
using detail::row_chunks;

namespace {

// The partial sums of chunk `chunk`: the output itself for chunk 0, else a slice of scratch.
template <class T>
T* partial_of(T* out, std::vector<T>& scratch, std::size_t chunk, std::size_t C) {
  return chunk == 0 ? out : scratch.data() + (chunk - 1) * C;
}

// out[c] += Σ over chunks 1.. of their partials, in chunk order.
template <class T>
void add_partials(T* out, const std::vector<T>& scratch, std::size_t chunks, std::size_t C) {
  for (std::size_t chunk = 1; chunk < chunks; ++chunk) {
    const T* part = scratch.data() + (chunk - 1) * C;
    for (std::size_t c = 0; c < C; ++c) out[c] += part[c];
  }
}

}  // namespace

template <class T>
void layernorm_forward(T* y, T* mean, T* rstd, const T* x, const T* gamma, const T* beta,
                       std::size_t rows, std::size_t C, T eps) {
  for_row_chunks(rows, C, [&](std::size_t r0, std::size_t r1, std::size_t) {
    for (std::size_t r = r0; r < r1; ++r) {
      const T* xr = x + r * C;
      T* yr = y + r * C;
      T mu = 0;
      for (std::size_t c = 0; c < C; ++c) mu += xr[c];
      mu /= T(C);
      T var = 0;
      for (std::size_t c = 0; c < C; ++c) var += (xr[c] - mu) * (xr[c] - mu);
      var /= T(C);  // biased, as PyTorch
      const T rs = T(1) / std::sqrt(var + eps);
      mean[r] = mu;
      rstd[r] = rs;
      for (std::size_t c = 0; c < C; ++c) yr[c] = gamma[c] * ((xr[c] - mu) * rs) + beta[c];
    }
  });
}

template <class T>
void layernorm_backward(T* dx, T* dgamma, T* dbeta, const T* dy, const T* x, const T* mean,
                        const T* rstd, const T* gamma, std::size_t rows, std::size_t C,
                        std::vector<T>& scratch) {
  // dγ and dβ side by side in 2C values per chunk; chunk 0 sums into `sums`, copied out at the end.
  const std::size_t chunks = row_chunks(rows, C);
  scratch.assign(chunks * 2 * C, T(0));
  for_chunks(rows, chunks, [&](std::size_t r0, std::size_t r1, std::size_t chunk) {
    T* dg = scratch.data() + chunk * 2 * C;
    T* db = dg + C;
    for (std::size_t r = r0; r < r1; ++r) {
      const T* dyr = dy + r * C;
      const T* xr = x + r * C;
      T* dxr = dx + r * C;
      const T mu = mean[r], rs = rstd[r];
      // g = dy ⊙ γ; dx = rstd · (g − mean(g) − x̂ ⊙ mean(g ⊙ x̂)), x̂ recomputed as the forward did.
      T mean_g = 0, mean_gh = 0;
      for (std::size_t c = 0; c < C; ++c) {
        const T h = (xr[c] - mu) * rs;
        const T gc = dyr[c] * gamma[c];
        mean_g += gc;
        mean_gh += gc * h;
        dg[c] += dyr[c] * h;
        db[c] += dyr[c];
      }
      mean_g /= T(C);
      mean_gh /= T(C);
      for (std::size_t c = 0; c < C; ++c) {
        const T h = (xr[c] - mu) * rs;
        dxr[c] = rs * (dyr[c] * gamma[c] - mean_g - h * mean_gh);
      }
    }
  });
  for (std::size_t chunk = 1; chunk < chunks; ++chunk) {
    const T* part = scratch.data() + chunk * 2 * C;
    for (std::size_t c = 0; c < 2 * C; ++c) scratch[c] += part[c];
  }
  if (dgamma) std::copy(scratch.data(), scratch.data() + C, dgamma);
  if (dbeta) std::copy(scratch.data() + C, scratch.data() + 2 * C, dbeta);
}

template <class T>
void rmsnorm_forward(T* y, T* rstd, const T* x, const T* gamma, std::size_t rows, std::size_t C,
                     T eps) {
  for_row_chunks(rows, C, [&](std::size_t r0, std::size_t r1, std::size_t) {
    for (std::size_t r = r0; r < r1; ++r) {
      const T* xr = x + r * C;
      T* yr = y + r * C;
      T mean_sq = 0;
      for (std::size_t c = 0; c < C; ++c) mean_sq += xr[c] * xr[c];
      mean_sq /= T(C);
      const T rs = T(1) / std::sqrt(mean_sq + eps);
      rstd[r] = rs;
      for (std::size_t c = 0; c < C; ++c) yr[c] = gamma[c] * (xr[c] * rs);
    }
  });
}

template <class T>
void rmsnorm_backward(T* dx, T* dgamma, const T* dy, const T* x, const T* rstd, const T* gamma,
                      std::size_t rows, std::size_t C, std::vector<T>& scratch) {
  const std::size_t chunks = row_chunks(rows, C);
  std::fill(dgamma, dgamma + C, T(0));
  scratch.assign(chunks > 1 ? (chunks - 1) * C : 0, T(0));
  for_chunks(rows, chunks, [&](std::size_t r0, std::size_t r1, std::size_t chunk) {
    T* dg = partial_of(dgamma, scratch, chunk, C);
    for (std::size_t r = r0; r < r1; ++r) {
      const T* dyr = dy + r * C;
      const T* xr = x + r * C;
      T* dxr = dx + r * C;
      const T rs = rstd[r];
      // dx = rstd · (g − x̂ ⊙ mean(g ⊙ x̂)), g = dy ⊙ γ.
      T mean_gh = 0;
      for (std::size_t c = 0; c < C; ++c) {
        const T h = xr[c] * rs;
        mean_gh += dyr[c] * gamma[c] * h;
        dg[c] += dyr[c] * h;
      }
      mean_gh /= T(C);
      for (std::size_t c = 0; c < C; ++c) dxr[c] = rs * (dyr[c] * gamma[c] - xr[c] * rs * mean_gh);
    }
  });
  add_partials(dgamma, scratch, chunks, C);
}

template <class T>
void softmax_cross_entropy(T* loss, T* dlogits, const T* logits, const int* targets,
                           std::size_t rows, std::size_t V, int ignore_index,
                           std::vector<double>& row_loss) {
  const auto labelled_row = [&](std::size_t r) {
    const int t = targets[r];
    return t != ignore_index && t >= 0 && static_cast<std::size_t>(t) < V;
  };
  std::size_t labelled = 0;
  for (std::size_t r = 0; r < rows; ++r) labelled += labelled_row(r) ? 1 : 0;
  row_loss.assign(rows, 0.0);
  const T w = labelled ? T(1) / static_cast<T>(labelled) : T(0);
  for_row_chunks(rows, V, [&](std::size_t r0, std::size_t r1, std::size_t) {
    for (std::size_t r = r0; r < r1; ++r) {
      const T* x = logits + r * V;
      T* d = dlogits + r * V;
      if (!labelled_row(r)) {
        std::fill(d, d + V, T(0));
        continue;
      }
      const auto target = static_cast<std::size_t>(targets[r]);
      const T row_max = *std::max_element(x, x + V);
      std::copy(x, x + V, d);
      const T sum = exp_shifted_inplace(d, V, row_max);  // d = exp(x − max), sum ≥ 1
      const T inv = T(1) / sum;
      for (std::size_t c = 0; c < V; ++c) d[c] = w * (d[c] * inv);  // cross_entropy_backward's
      d[target] -= w;                                               // (p − onehot) / n
      row_loss[r] =
          -(static_cast<double>(x[target] - row_max) - std::log(static_cast<double>(sum)));
    }
  });
  double total = 0;
  for (std::size_t r = 0; r < rows; ++r) total += row_loss[r];  // 0 on unlabelled rows
  *loss = labelled ? static_cast<T>(total / static_cast<double>(labelled)) : T(0);
}

template <class T>
void embedding_forward(T* y, const int* ids, const T* table, std::size_t rows, std::size_t C) {
  for_row_chunks(rows, C, [&](std::size_t i0, std::size_t i1, std::size_t) {
    for (std::size_t i = i0; i < i1; ++i) {
      T* dst = y + i * C;
      if (ids[i] < 0) {  // kNoToken
        std::fill(dst, dst + C, T(0));
        continue;
      }
      const T* src = table + static_cast<std::size_t>(ids[i]) * C;
      std::copy(src, src + C, dst);
    }
  });
}

template <class T>
void embedding_backward(T* dtable, const T* dy, const int* ids, std::size_t rows, std::size_t V,
                        std::size_t C) {
  std::fill(dtable, dtable + V * C, T(0));
  // Scatter-add in position order (deterministic); columns cut across threads.
  for_row_chunks(C, rows, [&](std::size_t c0, std::size_t c1, std::size_t) {
    for (std::size_t i = 0; i < rows; ++i) {
      if (ids[i] < 0 || static_cast<std::size_t>(ids[i]) >= V) continue;
      T* dst = dtable + static_cast<std::size_t>(ids[i]) * C;
      const T* src = dy + i * C;
      for (std::size_t c = c0; c < c1; ++c) dst[c] += src[c];
    }
  });
}

template <class T>
void permute_heads(T* out, const T* x, std::size_t B, std::size_t Tn, std::size_t H, std::size_t D,
                   bool split) {
  // One (b, t) row of H·D values per step: H runs of D values, each copied whole.
  for_row_chunks(B * Tn, H * D, [&](std::size_t r0, std::size_t r1, std::size_t) {
    for (std::size_t r = r0; r < r1; ++r) {
      const std::size_t b = r / Tn, t = r % Tn;
      for (std::size_t h = 0; h < H; ++h) {
        const std::size_t bhtd = ((b * H + h) * Tn + t) * D, btc = r * H * D + h * D;
        if (split) {
          std::copy(x + btc, x + btc + D, out + bhtd);
        } else {
          std::copy(x + bhtd, x + bhtd + D, out + btc);
        }
      }
    }
  });
}

#define ATTNLAB_INSTANTIATE_CPU_KERNELS(T)                                                         \
  template void layernorm_forward<T>(T*, T*, T*, const T*, const T*, const T*, std::size_t,        \
                                     std::size_t, T);                                              \
  template void layernorm_backward<T>(T*, T*, T*, const T*, const T*, const T*, const T*,          \
                                      const T*, std::size_t, std::size_t, std::vector<T>&);        \
  template void rmsnorm_forward<T>(T*, T*, const T*, const T*, std::size_t, std::size_t, T);       \
  template void rmsnorm_backward<T>(T*, T*, const T*, const T*, const T*, const T*, std::size_t,   \
                                    std::size_t, std::vector<T>&);                                 \
  template void softmax_cross_entropy<T>(T*, T*, const T*, const int*, std::size_t, std::size_t,   \
                                         int, std::vector<double>&);                               \
  template void embedding_forward<T>(T*, const int*, const T*, std::size_t, std::size_t);          \
  template void embedding_backward<T>(T*, const T*, const int*, std::size_t, std::size_t,          \
                                      std::size_t);                                                \
  template void permute_heads<T>(T*, const T*, std::size_t, std::size_t, std::size_t, std::size_t, \
                                 bool);
ATTNLAB_INSTANTIATE_CPU_KERNELS(float)
ATTNLAB_INSTANTIATE_CPU_KERNELS(double)
#undef ATTNLAB_INSTANTIATE_CPU_KERNELS

}  // namespace attnlab::cpu_backend
