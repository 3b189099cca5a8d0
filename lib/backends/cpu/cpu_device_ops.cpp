// The CPU backend's DeviceOps (attnlab/backends/cpu.hpp): each operation is a CPU op's raw-pointer
// core (lib/src/kernels/<op>.hpp, the headers meant for the op fronts and this backend, and the
// softmax rows of attnlab/ops/softmax.hpp; the xtensor ops are checked fronts over the same cores),
// or the element math of the optimizers (lib/src/kernels/optimizers.hpp). No copies in
// the hot path; small scratch (per-chunk partial sums, per-slice dL/ds) is kept between calls.
// The CPU attention paths allocate their own per-thread tile scratch, as they do under the ops.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <new>
#include <stdexcept>
#include <string>
#include <vector>

#include "attnlab/attention/dropout.hpp"
#include "attnlab/backends/cpu.hpp"
#include "attnlab/blas.hpp"
#include "attnlab/memory.hpp"
#include "kernels/attention.hpp"
#include "kernels/cross_entropy.hpp"
#include "kernels/embedding.hpp"
#include "kernels/gelu.hpp"
#include "kernels/linear.hpp"
#include "kernels/norms.hpp"
#include "kernels/optimizers.hpp"
#include "kernels/relu.hpp"
#include "kernels/rope.hpp"
#include "kernels/rows.hpp"
#include "kernels/softcap.hpp"
#include "kernels/swiglu.hpp"
#include "parallel_rows.hpp"

namespace attnlab {

namespace {

using detail::for_chunks;
using detail::for_row_chunks;

// The optimizers' updates take a thread per kMinUpdateChunk elements (element-wise: the same bits
// for any cut); sum_of_squares sums blocks of kSquaresBlock elements.
constexpr std::size_t kMinUpdateChunk = 4096;
constexpr std::size_t kSquaresBlock = 4096;

std::size_t update_chunks(std::size_t n) {
  const auto threads = static_cast<std::size_t>(num_threads());
  return std::max<std::size_t>(1, std::min(threads, n / kMinUpdateChunk));
}

// The optimizers' element loops over [0, n) of one chunk. The scalars come by value and the arrays
// __restrict: a store through an array could otherwise alias a scalar read by reference (a
// captured T& or a field of a const struct&), and GCC then reloads it every element and refuses to
// vectorise the loop. With -fno-math-errno (cmake/AttnlabMarch.cmake) the square root is an
// instruction, so AdamW's loop vectorises: the same IEEE operations per element, the same bits.
template <class T>
void adamw_elements(T* __restrict param, T* __restrict m, T* __restrict v, const T* __restrict grad,
                    std::size_t n, const kernel_math::AdamWScalars<T> s) {
  for (std::size_t i = 0; i < n; ++i) kernel_math::adamw_element(param[i], m[i], v[i], grad[i], s);
}

template <class T>
void sgd_elements(T* __restrict param, T* __restrict buf, const T* __restrict grad, std::size_t n,
                  const T lr, const T momentum, const T weight_decay, const bool first_step) {
  if (buf == nullptr) {
    for (std::size_t i = 0; i < n; ++i)
      kernel_math::sgd_element(param[i], static_cast<T*>(nullptr), grad[i], lr, momentum,
                               weight_decay, first_step);
    return;
  }
  for (std::size_t i = 0; i < n; ++i)
    kernel_math::sgd_element(param[i], buf + i, grad[i], lr, momentum, weight_decay, first_step);
}

template <class T>
void muon_momentum_elements(T* __restrict u, T* __restrict m, const T* __restrict g, std::size_t n,
                            const T beta, const T one_minus_beta, const bool nesterov) {
  for (std::size_t i = 0; i < n; ++i)
    u[i] = kernel_math::muon_momentum_element(m[i], g[i], beta, one_minus_beta, nesterov);
}

// (B,T,H·D) <-> (B,H,T,D): the head split has no xtensor op of its own.
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

template <class T>
class CpuDeviceOps final : public DeviceOps<T> {
 public:
  std::string name() const override { return "cpu"; }
  bool host_memory() const override { return true; }

  // ---- memory -----------------------------------------------------------------------------------
  void* allocate(std::size_t bytes) override {
    if (bytes == 0) return nullptr;
    try {
      return ::operator new(bytes, kAlignment);
    } catch (const std::bad_alloc&) {
      throw OutOfMemory(bytes, "a CPU buffer");
    }
  }
  void release(void* p) noexcept override {
    if (p != nullptr) ::operator delete(p, kAlignment);
  }
  void upload(void* dst, const void* src, std::size_t bytes) override { copy(dst, src, bytes); }
  void download(void* dst, const void* src, std::size_t bytes) override { copy(dst, src, bytes); }
  void copy(void* dst, const void* src, std::size_t bytes) override {
    if (bytes > 0) std::memmove(dst, src, bytes);
  }
  void zero(void* dst, std::size_t bytes) override {
    if (bytes > 0) std::memset(dst, 0, bytes);
  }

  // ---- elementwise and broadcast -------------------------------------------------------------
  void add(T* y, const T* a, const T* b, std::size_t n) override {
    detail::add_elements(y, a, b, n);
  }
  void scale(T* x, T factor, std::size_t n) override {
    for_row_chunks(n, 1, [&](std::size_t i0, std::size_t i1, std::size_t) {
      row_kernels::scale_inplace(x + i0, i1 - i0, factor);
    });
  }
  void exp(T* y, const T* x, std::size_t n) override {
    for_row_chunks(n, 1, [&](std::size_t i0, std::size_t i1, std::size_t) {
      for (std::size_t i = i0; i < i1; ++i) y[i] = std::exp(x[i]);
    });
  }
  void add_bias(T* y, const T* b, std::size_t rows, std::size_t C) override {
    for_row_chunks(rows, C, [&](std::size_t r0, std::size_t r1, std::size_t) {
      for (std::size_t r = r0; r < r1; ++r) {
        T* row = y + r * C;
        for (std::size_t c = 0; c < C; ++c) row[c] += b[c];
      }
    });
  }
  void column_sum(T* db, const T* dy, std::size_t rows, std::size_t C) override {
    std::fill(db, db + C, T(0));
    // Columns cut across threads; each column summed in row order (linear_backward's db).
    for_row_chunks(C, rows, [&](std::size_t c0, std::size_t c1, std::size_t) {
      for (std::size_t r = 0; r < rows; ++r) {
        const T* row = dy + r * C;
        for (std::size_t c = c0; c < c1; ++c) db[c] += row[c];
      }
    });
  }

  // ---- heads --------------------------------------------------------------------------------
  void split_heads(T* out, const T* x, std::size_t B, std::size_t Tn, std::size_t H,
                   std::size_t D) override {
    permute_heads(out, x, B, Tn, H, D, true);
  }
  void merge_heads(T* out, const T* x, std::size_t B, std::size_t Tn, std::size_t H,
                   std::size_t D) override {
    permute_heads(out, x, B, Tn, H, D, false);
  }
  void head_dot(T* out, const T* a, const T* c, std::size_t B, std::size_t H,
                std::size_t n) override {
    for (std::size_t h = 0; h < H; ++h) {
      T acc = 0;
      for (std::size_t b = 0; b < B; ++b) {
        const std::size_t off = (b * H + h) * n;
        acc += row_kernels::dot(a + off, c + off, n);
      }
      out[h] = acc;
    }
  }

  // ---- layers -------------------------------------------------------------------------------
  void embedding_forward(T* y, const int* ids, const T* table, std::size_t rows,
                         std::size_t C) override {
    detail::embedding_forward_rows(y, ids, table, rows, C);
  }
  void embedding_backward(T* dtable, const T* dy, const int* ids, std::size_t rows, std::size_t V,
                          std::size_t C) override {
    detail::embedding_backward_rows(dtable, dy, ids, rows, V, C);
  }
  void layernorm_forward(T* y, T* mean, T* rstd, const T* x, const T* gamma, const T* beta,
                         std::size_t rows, std::size_t C, T eps) override {
    detail::layernorm_forward_rows(y, mean, rstd, x, gamma, beta, rows, C, eps);
  }
  void layernorm_backward(T* dx, T* dgamma, T* dbeta, const T* dy, const T* x, const T* mean,
                          const T* rstd, const T* gamma, std::size_t rows, std::size_t C) override {
    detail::layernorm_backward_rows(dx, dgamma, dbeta, dy, x, mean, rstd, gamma, rows, C,
                                    scratch());
  }
  void rmsnorm_forward(T* y, T* rstd, const T* x, const T* gamma, std::size_t rows, std::size_t C,
                       T eps) override {
    detail::rmsnorm_forward_rows(y, rstd, x, gamma, rows, C, eps);
  }
  void rmsnorm_backward(T* dx, T* dgamma, const T* dy, const T* x, const T* rstd, const T* gamma,
                        std::size_t rows, std::size_t C) override {
    detail::rmsnorm_backward_rows(dx, dgamma, dy, x, rstd, gamma, rows, C, scratch());
  }
  void gelu_forward(T* y, const T* x, std::size_t n, bool exact) override {
    detail::gelu_elements<T>(y, x, nullptr, n, exact);
  }
  void gelu_backward(T* dx, const T* dy, const T* x, std::size_t n, bool exact) override {
    detail::gelu_elements<T>(dx, x, dy, n, exact);
  }
  void relu_forward(T* y, const T* x, std::size_t n) override {
    detail::relu_forward_elements(y, x, n, false);
  }
  void relu_backward(T* dx, const T* dy, const T* x, std::size_t n) override {
    detail::relu_backward_elements(dx, dy, x, n, false);
  }
  void relu_squared_forward(T* y, const T* x, std::size_t n) override {
    detail::relu_forward_elements(y, x, n, true);
  }
  void relu_squared_backward(T* dx, const T* dy, const T* x, std::size_t n) override {
    detail::relu_backward_elements(dx, dy, x, n, true);
  }
  void swiglu_forward(T* y, const T* h, std::size_t rows, std::size_t F) override {
    detail::swiglu_forward_rows(y, h, rows, F);
  }
  void swiglu_backward(T* dh, const T* dy, const T* h, std::size_t rows, std::size_t F) override {
    detail::swiglu_backward_rows(dh, dy, h, rows, F);
  }
  void softcap_forward(T* y, const T* x, std::size_t n, T cap) override {
    detail::softcap_forward_elements(y, x, n, cap);
  }
  void softcap_backward(T* dx, const T* dy, const T* y, std::size_t n, T cap) override {
    detail::softcap_backward_elements(dx, dy, y, n, cap);
  }
  void rope(T* x, const T* cos, const T* sin, const kernel_math::RopeShape& shape) override {
    detail::rope_rows(x, cos, sin, shape);
  }
  void dropout(T* y, const T* x, std::size_t n, double p, std::uint64_t key,
               std::uint32_t stream) override {
    attention::dropout_elements(y, x, n, p, key, stream);
  }
  void linear_forward(T* y, const T* x, const T* w, const T* b, std::size_t rows, std::size_t in,
                      std::size_t out, bool w_transposed, OperandKeep* keep) override {
    if (out == 0) return;
    detail::linear_forward_rows(y, x, w, b, rows, in, out, w_transposed, keep);
  }
  void linear_backward(T* dx, T* dw, T* db, const T* dy, const T* x, const T* w, std::size_t rows,
                       std::size_t in, std::size_t out, bool w_transposed, bool accumulate_dw,
                       OperandKeep* keep) override {
    std::vector<T>& partial = scratch();
    partial.resize((detail::linear_chunks(rows) - 1) * in * out);
    detail::linear_backward_rows(dx, dw, db, dy, x, w, rows, in, out, partial.data(), w_transposed,
                                 accumulate_dw, keep);
  }
  void softmax_cross_entropy(T* loss, T* dlogits, T* /*row_loss: kept in double here*/,
                             const T* logits, const int* targets, std::size_t rows, std::size_t V,
                             int ignore_index, T z_loss) override {
    // p is written into dlogits, then turned into the gradient in place.
    const double z = static_cast<double>(z_loss);
    const std::size_t labelled =
        detail::cross_entropy_forward_rows(loss, loss + 1, dlogits, row_loss(), row_log_z(), logits,
                                           targets, rows, V, ignore_index, z);
    detail::cross_entropy_backward_rows(
        dlogits, static_cast<const T*>(dlogits), targets, rows, V, ignore_index,
        labelled ? T(1) / static_cast<T>(labelled) : T(0), row_log_z().data(), z);
  }

  // ---- attention: the CPU paths; dL/ds per slice goes to scratch (the device model uses head_dot)
  void sdpa_reference_forward(T* out, T* p, const AttentionParams<T>& a) override {
    check_attention_params(a, "cpu sdpa_reference_forward");
    if (a.B * a.H * a.Tq == 0) return;
    detail::sdpa_reference_forward(out, p, a);
  }
  void sdpa_reference_backward(T* dq, T* dk, T* dv, T* /*ds: per-thread inside the op*/,
                               const T* dout, const T* p, const AttentionParams<T>& a) override {
    check_attention_params(a, "cpu sdpa_reference_backward");
    if (a.B * a.H * a.Tq == 0) return;
    std::vector<T>& dscale = scratch();
    dscale.resize(a.B * a.H);
    detail::sdpa_reference_backward(dq, dk, dv, dscale.data(), dout, p, a);
  }
  void sdpa_fused_forward(T* out, T* lse, const AttentionParams<T>& a) override {
    check_attention_params(a, "cpu sdpa_fused_forward");
    if (a.B * a.H * a.Tq == 0) return;
    detail::sdpa_fused_forward(out, lse, a, 0, 0);
  }
  void sdpa_fused_backward(T* dq, T* dk, T* dv, T* /*row_dot*/, const T* dout, const T* out,
                           const T* lse, const AttentionParams<T>& a) override {
    check_attention_params(a, "cpu sdpa_fused_backward");
    if (a.B * a.H * a.Tq == 0) return;
    std::vector<T>& dscale = scratch();
    dscale.resize(a.B * a.H);
    detail::sdpa_fused_backward(dq, dk, dv, dscale.data(), dout, out, lse, a, 0, 0);
  }
  // The CPU fused path takes any head dims.
  void check_fused(std::size_t, std::size_t) override {}

  // ---- optimizers and norms ------------------------------------------------------------------
  // The optimizers' element updates read and write four arrays with a square root and a division
  // per element: worth a thread from kMinUpdateChunk elements (a 128 x 128 weight splits in two).
  void adamw_update(T* param, T* m, T* v, const T* grad, std::size_t n,
                    const kernel_math::AdamWScalars<T>& s) override {
    for_chunks(n, update_chunks(n), [&](std::size_t i0, std::size_t i1, std::size_t) {
      adamw_elements(param + i0, m + i0, v + i0, grad + i0, i1 - i0, s);
    });
  }
  void sgd_update(T* param, T* buf, const T* grad, std::size_t n, T lr, T momentum, T weight_decay,
                  bool first_step) override {
    for_chunks(n, update_chunks(n), [&](std::size_t i0, std::size_t i1, std::size_t) {
      sgd_elements(param + i0, buf ? buf + i0 : nullptr, grad + i0, i1 - i0, lr, momentum,
                   weight_decay, first_step);
    });
  }
  // In double: blocks of kSquaresBlock elements, each summed in a fixed order (below), then the
  // blocks' sums in block order. The blocks do not depend on the thread count, so neither do the
  // bits; the blocks run in parallel for a large n.
  void sum_of_squares(double* out, double* /*partial*/, const T* x, std::size_t n) override {
    const std::size_t blocks = (n + kSquaresBlock - 1) / kSquaresBlock;
    std::vector<double> block_sum(blocks, 0.0);
    for_row_chunks(blocks, kSquaresBlock, [&](std::size_t b0, std::size_t b1, std::size_t) {
      for (std::size_t b = b0; b < b1; ++b) {
        const std::size_t i1 = std::min(n, (b + 1) * kSquaresBlock);
        // Eight running sums (sum j takes the elements ≡ j mod 8), added in a fixed tree: one
        // running sum is a serial chain of double adds, which GCC may not reorder (the profile:
        // tests/bench/README.md).
        double acc[8] = {};
        std::size_t i = b * kSquaresBlock;
        for (; i + 8 <= i1; i += 8) {
          for (std::size_t j = 0; j < 8; ++j)
            acc[j] += static_cast<double>(x[i + j]) * static_cast<double>(x[i + j]);
        }
        double sum =
            ((acc[0] + acc[4]) + (acc[1] + acc[5])) + ((acc[2] + acc[6]) + (acc[3] + acc[7]));
        for (; i < i1; ++i) sum += static_cast<double>(x[i]) * static_cast<double>(x[i]);
        block_sum[b] = sum;
      }
    });
    double sum = 0;
    for (double s : block_sum) sum += s;
    *out = sum;
  }
  std::size_t sum_of_squares_scratch() const override { return 1; }

  // ---- Muon ------------------------------------------------------------------------------------
  void gemm(bool trans_a, bool trans_b, std::size_t m, std::size_t n, std::size_t k, T alpha,
            const T* a, std::size_t lda, const T* b, std::size_t ldb, T beta, T* c,
            std::size_t ldc) override {
    const auto as_int = [](std::size_t v) {
      if (v > static_cast<std::size_t>(std::numeric_limits<int>::max()))
        throw std::invalid_argument("gemm: extent " + std::to_string(v) + " too large for a GEMM");
      return static_cast<int>(v);
    };
    blas::gemm<T>(trans_a, trans_b, as_int(m), as_int(n), as_int(k), alpha, a, as_int(lda), b,
                  as_int(ldb), beta, c, as_int(ldc));
  }
  void muon_momentum(T* u, T* m, const T* g, std::size_t n, T beta, T one_minus_beta,
                     bool nesterov) override {
    for_chunks(n, update_chunks(n), [&](std::size_t i0, std::size_t i1, std::size_t) {
      muon_momentum_elements(u + i0, m + i0, g + i0, i1 - i0, beta, one_minus_beta, nesterov);
    });
  }
  void divide_by_norm(T* x, const double* sum_of_squares, std::size_t n, T eps) override {
    const T denom = static_cast<T>(std::sqrt(*sum_of_squares)) + eps;
    for_chunks(n, update_chunks(n), [&](std::size_t i0, std::size_t i1, std::size_t) {
      for (std::size_t i = i0; i < i1; ++i) x[i] = x[i] / denom;
    });
  }
  void axpby(T* y, const T* x, std::size_t n, T a, T b) override {
    for_chunks(n, update_chunks(n), [&](std::size_t i0, std::size_t i1, std::size_t) {
      for (std::size_t i = i0; i < i1; ++i) y[i] = y[i] * a + b * x[i];
    });
  }

  void synchronize() override {}

 private:
  static constexpr std::align_val_t kAlignment{64};

  // Per calling thread, so that one instance serves every thread: per-chunk partial sums (norm and
  // linear backward) or the (B·H) dL/ds of the attention backward (unused by the caller), and the
  // (rows,) cross-entropy row losses in double.
  static std::vector<T>& scratch() {
    thread_local std::vector<T> buffer;
    return buffer;
  }
  static std::vector<double>& row_loss() {
    thread_local std::vector<double> buffer;
    return buffer;
  }
  static std::vector<double>& row_log_z() {
    thread_local std::vector<double> buffer;
    return buffer;
  }
};

}  // namespace

template <class T>
std::unique_ptr<DeviceOps<T>> make_cpu_device_ops() {
  return std::make_unique<CpuDeviceOps<T>>();
}

template <class T>
DeviceOps<T>& cpu_ops() {
  static CpuDeviceOps<T>* const instance = new CpuDeviceOps<T>();  // immortal: Buffers may outlive
  return *instance;                                                // static destruction
}

template DeviceOps<float>& cpu_ops<float>();
template DeviceOps<double>& cpu_ops<double>();
template std::unique_ptr<DeviceOps<float>> make_cpu_device_ops<float>();
template std::unique_ptr<DeviceOps<double>> make_cpu_device_ops<double>();

}  // namespace attnlab
