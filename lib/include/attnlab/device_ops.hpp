// The operations a device-resident model is written against: memory, copies, and the kernels of a
// transformer training step, on device pointers. Three implementations exist:
//   make_cuda_device_ops<T>()       the CUDA backend: the kernels of lib/backends/cuda launched by
//   the one
//                                   launch glue (lib/backends/cuda/kernel_device_ops.hpp) compiled
//                                   by nvcc, cudaMalloc with a caching allocator, cuBLAS for the
//                                   GEMMs;
//   emulated::make_device_ops<T>()  the same glue compiled by the C++ compiler over an emulator of
//                                   the CUDA thread model, with BLAS for the GEMMs: the GPU's own
//                                   grids run on the CPU (attnlab/backends/emulated.hpp, target
//                                   attnlab_emulated);
//   make_cpu_device_ops<T>()        host memory and the raw-pointer cores of attnlab's CPU ops
//                                   (attnlab/backends/cpu.hpp).
// The Modules (attnlab/nn/) are written once against this interface, so the same model code runs on
// the CPU, on a GPU, and on the emulated device that checks the GPU kernels on machines without
// one. A new device op is one virtual here, its kernel, one method of the launch glue and one of
// the CPU backend.
//
// Contracts: row-major contiguous tensors; rows are the flattened leading axes; every output is
// assigned (never accumulated) unless stated; every reduction runs in a fixed order (deterministic,
// no atomics). Each op mirrors a CPU op and its contract: embedding (attnlab/ops/embedding.hpp,
// kNoToken = -1: zero row, no gradient), layernorm (biased variance, eps inside the root), rmsnorm,
// gelu (tanh approximation or exact), linear (W stored (In, Out), or (Out, In) with w_transposed),
// cross-entropy (fused softmax, ignore index, mean over labelled), adamw (torch.optim.AdamW's order
// of operations), and attention (attnlab/ops/attention.hpp, on the one parameter struct
// AttentionParams of attnlab/attention/params.hpp). Calls may be asynchronous; download() and the
// functions returning host values synchronise. No CUDA type appears here.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <stdexcept>
#include <string>

#include "attnlab/attention/device_program.hpp"
#include "attnlab/attention/params.hpp"
#include "attnlab/gemm_precision.hpp"
#include "attnlab/kernel_math.hpp"
#include "attnlab/operand_keep.hpp"

namespace attnlab {

// The memory half of a backend, independent of the element type: what a Buffer (attnlab/buffer.hpp)
// needs to hold ids, masks and values alike.
class DeviceMemory {
 public:
  virtual ~DeviceMemory() = default;

  // "cuda: NVIDIA H200 (sm_90, 139 GiB)", "emulated (CPU)", "cpu".
  virtual std::string name() const = 0;
  // True when the backend's memory is the host's and its kernels are the CPU ops (the CPU
  // backend): a Module on it keeps its parameters in the Parameter xarrays themselves.
  virtual bool host_memory() const { return false; }

  // `bytes` of uninitialised device memory (nullptr for 0 bytes); throws on failure.
  virtual void* allocate(std::size_t bytes) = 0;
  virtual void release(void* p) noexcept = 0;
  virtual void upload(void* device_dst, const void* host_src, std::size_t bytes) = 0;
  virtual void download(void* host_dst, const void* device_src, std::size_t bytes) = 0;
  virtual void copy(void* device_dst, const void* device_src, std::size_t bytes) = 0;
  virtual void zero(void* device_dst, std::size_t bytes) = 0;

  // Waits for queued work; throws on an asynchronous error.
  virtual void synchronize() = 0;
};

// An attention program's row kernels for the reference path (made by the program's GPU launchers,
// attnlab/attention/device_program.hpp; `context` is the call's program data): they replace the
// built-in rule's rows between the reference path's GEMMs.
template <class T>
struct ReferenceRows {
  const void* context = nullptr;
  // scores (B,H,Tq,Tk) holds Q Kᵀ unscaled; in place: P = softmax of the built-in rule's score
  // through the mask and score programs, 0 at hidden keys and in rows without a visible key.
  void (*softmax)(const void* context, T* scores, const AttentionParams<T>& a) = nullptr;
  // dp (B,H,Tq,Tk) holds dP; in place: s_h · dS ⊙ ∂S/∂U, with dS = P ⊙ (dP − rowsum(dP ⊙ P)) and
  // U = s_h · dots (dots: Q Kᵀ unscaled); dS itself to a.dscores when set; the captured
  // parameters' gradients to the context's rows.
  void (*backward)(const void* context, T* dp, const T* p, const T* dots,
                   const AttentionParams<T>& a) = nullptr;
};

// Throws std::invalid_argument "set_precision: expected fp32 on <backend>, got '<precision>'".
[[noreturn]] void refuse_precision(const std::string& backend, GemmPrecision precision);

template <class T>
class DeviceOps : public DeviceMemory {
 public:
  // ---- precision -------------------------------------------------------------------------------
  // The arithmetic of this backend's GEMMs (linear, gemm, the reference attention's products) and
  // of its fused attention (attnlab/gemm_precision.hpp): fp32 as stored; bf16: GEMM operands
  // rounded to bfloat16 with fp32 sums, and the fused attention on the tensor-core kernels where
  // D = Dv is 64 or 128 (bf16 q, k, v, dO; fp32 softmax, outputs and gradients); tf32: GEMM
  // operands rounded to TensorFloat-32, attention as fp32. Weights, gradients, optimizer state,
  // norms and the loss stay T. Set before a run, not during a call. Throws std::invalid_argument
  // naming set_precision, the backend and the precision where this backend has no such arithmetic:
  // the CPU backend (its GEMMs follow blas::GemmPrecisionScope) and any double backend take fp32
  // only.
  virtual void set_precision(GemmPrecision precision) {
    if (precision != GemmPrecision::fp32) refuse_precision(this->name(), precision);
  }
  virtual GemmPrecision precision() const { return GemmPrecision::fp32; }
  // Whether this backend's fused attention beats its reference path at every length for head dims
  // D, Dv at its precision (the tensor-core kernels): path auto then picks it.
  virtual bool fused_preferred(std::size_t /*D*/, std::size_t /*Dv*/) const { return false; }

  // ---- elementwise and broadcast ---------------------------------------------------------------
  // y = a + b over n values (y may alias a or b).
  virtual void add(T* y, const T* a, const T* b, std::size_t n) = 0;
  // x *= factor over n values.
  virtual void scale(T* x, T factor, std::size_t n) = 0;
  // y = exp(x) over n values.
  virtual void exp(T* y, const T* x, std::size_t n) = 0;
  // y[r, c] += b[c] over rows × C.
  virtual void add_bias(T* y, const T* b, std::size_t rows, std::size_t C) = 0;
  // db[c] = Σ_r dy[r, c], rows in order.
  virtual void column_sum(T* db, const T* dy, std::size_t rows, std::size_t C) = 0;

  // ---- heads ---------------------------------------------------------------------------------
  // out (B,H,T,D) = x (B,T,H·D) split into heads, and merge_heads its inverse; out must not alias
  // x.
  virtual void split_heads(T* out, const T* x, std::size_t B, std::size_t Tn, std::size_t H,
                           std::size_t D) = 0;
  virtual void merge_heads(T* out, const T* x, std::size_t B, std::size_t Tn, std::size_t H,
                           std::size_t D) = 0;
  // out[h] = Σ_b Σ_i a[b, h, i] · c[b, h, i] for a, c (B, H, n): b in order, then i.
  virtual void head_dot(T* out, const T* a, const T* c, std::size_t B, std::size_t H,
                        std::size_t n) = 0;

  // ---- layers ----------------------------------------------------------------------------------
  // y (rows, C) = table[ids] with table (V, C); ids (rows,) in [0, V) or -1 (row of zeros).
  virtual void embedding_forward(T* y, const int* ids, const T* table, std::size_t rows,
                                 std::size_t C) = 0;
  // dtable (V, C): row v = Σ of dy over the positions whose id is v, in position order.
  virtual void embedding_backward(T* dtable, const T* dy, const int* ids, std::size_t rows,
                                  std::size_t V, std::size_t C) = 0;
  // y = γ ⊙ (x − μ) · rstd + β over rows of x (rows, C); saves mean and rstd (rows,).
  // beta may be null (a LayerNorm without bias: y = γ ⊙ x̂); so may dbeta below.
  virtual void layernorm_forward(T* y, T* mean, T* rstd, const T* x, const T* gamma, const T* beta,
                                 std::size_t rows, std::size_t C, T eps) = 0;
  // dx (rows, C), dgamma (C,) = Σ_rows dy ⊙ x̂, dbeta (C,) = Σ_rows dy.
  virtual void layernorm_backward(T* dx, T* dgamma, T* dbeta, const T* dy, const T* x,
                                  const T* mean, const T* rstd, const T* gamma, std::size_t rows,
                                  std::size_t C) = 0;
  // y = γ ⊙ x · rstd, rstd = 1/√(mean(x²) + eps); saves rstd (rows,). Backward: dx, dgamma.
  virtual void rmsnorm_forward(T* y, T* rstd, const T* x, const T* gamma, std::size_t rows,
                               std::size_t C, T eps) = 0;
  virtual void rmsnorm_backward(T* dx, T* dgamma, const T* dy, const T* x, const T* rstd,
                                const T* gamma, std::size_t rows, std::size_t C) = 0;
  // y = gelu(x) and dx = dy ⊙ gelu'(x), elementwise over n values.
  virtual void gelu_forward(T* y, const T* x, std::size_t n, bool exact) = 0;
  virtual void gelu_backward(T* dx, const T* dy, const T* x, std::size_t n, bool exact) = 0;
  // y = max(x, 0); dx = dy where x > 0, else 0.
  virtual void relu_forward(T* y, const T* x, std::size_t n) = 0;
  virtual void relu_backward(T* dx, const T* dy, const T* x, std::size_t n) = 0;
  // ReLU²: y = max(x, 0)²; dx = 2x · dy where x > 0, else 0.
  virtual void relu_squared_forward(T* y, const T* x, std::size_t n) = 0;
  virtual void relu_squared_backward(T* dx, const T* dy, const T* x, std::size_t n) = 0;
  // SwiGLU (attnlab/ops/swiglu.hpp) on rows of h (rows, 2F) = [a | b]: y (rows, F) = silu(a) ⊙ b;
  // dh (rows, 2F) = [dy ⊙ b ⊙ silu'(a) | dy ⊙ silu(a)].
  virtual void swiglu_forward(T* y, const T* h, std::size_t rows, std::size_t F) = 0;
  virtual void swiglu_backward(T* dh, const T* dy, const T* h, std::size_t rows, std::size_t F) = 0;
  // Softcapping (attnlab/ops/softcap.hpp): y = cap · tanh(x / cap) (y may be x); dx = dy · (1 −
  // (y / cap)²) from the forward's output (dx may be dy). cap > 0 (the callers check it).
  virtual void softcap_forward(T* y, const T* x, std::size_t n, T cap) = 0;
  virtual void softcap_backward(T* dx, const T* dy, const T* y, std::size_t n, T cap) = 0;
  // Rotary positions (attnlab/ops/rope.hpp), in place on x (shape.slices · shape.Tn rows of
  // shape.D): kernel_math::rope_element for every pair; cos, sin (positions, rot/2) tables with
  // positions ≥ shape.offset + shape.Tn. The backward is the same call with shape.inverse.
  virtual void rope(T* x, const T* cos, const T* sin, const kernel_math::RopeShape& shape) = 0;
  // y = x ⊙ M / (1 − p) over n values (y may be x), M drawn from `key` and `stream` by
  // attention::element_dropout_factor (attnlab/attention/dropout.hpp): the same bits on every
  // backend. Dropout's backward is the same call on the gradient.
  virtual void dropout(T* y, const T* x, std::size_t n, double p, std::uint64_t key,
                       std::uint32_t stream) = 0;
  // y = x W (+ b); W stored (In, Out); b may be null. With w_transposed, W is stored (Out, In)
  // (y = x Wᵀ + b: a tied head reads the embedding table (V, C) as it lies). With a keep
  // (attnlab/operand_keep.hpp), the backend may keep what it derives from x and W there for the
  // calls that follow with the same keep; the results are the same.
  virtual void linear_forward(T* y, const T* x, const T* w, const T* b, std::size_t rows,
                              std::size_t in, std::size_t out, bool w_transposed = false,
                              OperandKeep* keep = nullptr) = 0;
  // dx = dy Wᵀ (skipped when dx is null), dW = xᵀ dy, db = Σ_rows dy (skipped when db is null).
  // With w_transposed, W and dW are stored (Out, In): dx = dy W, dW = dyᵀ x. With accumulate_dw,
  // the GEMM adds into dW (β = 1: dW += xᵀ dy, a parameter's gradient written in place); dx and db
  // are assigned either way. `keep` as in linear_forward (the forward's x and W).
  virtual void linear_backward(T* dx, T* dw, T* db, const T* dy, const T* x, const T* w,
                               std::size_t rows, std::size_t in, std::size_t out,
                               bool w_transposed = false, bool accumulate_dw = false,
                               OperandKeep* keep = nullptr) = 0;
  // Fused softmax cross-entropy with PaLM's z-loss (attnlab/ops/cross_entropy.hpp) over logits
  // (rows, V), targets (rows,) in [0, V) or ignore_index, with log Z = logsumexp of the row: loss
  // (2 device values) = [mean over labelled rows of −log softmax[target], z_loss · mean of log Z²]
  // (0 when none is labelled); dlogits = (softmax · (1 + 2 z_loss log Z) − onehot) / n on labelled
  // rows, 0 elsewhere; row_loss (2 · rows) is scratch. Out-of-range targets count as unlabelled
  // (the host API validates them).
  virtual void softmax_cross_entropy(T* loss, T* dlogits, T* row_loss, const T* logits,
                                     const int* targets, std::size_t rows, std::size_t V,
                                     int ignore_index, T z_loss) = 0;

  // ---- attention ----------------------------------------------------------------------------
  // The CPU op's contract (attnlab/ops/attention.hpp): S = s_h · Q Kᵀ, P = softmax(S) over the
  // visible keys, O = P V; the arguments are checked by check_attention_params. A row with no
  // visible key gives P = 0, O = 0 and zero gradients. Every output element is assigned, so outputs
  // may start uninitialised; with AttentionParams::dscores set, the backward also writes dS there
  // (zero it first: the fused path skips hidden tiles).
  // Reference path: out (B,H,Tq,Dv) and p (B,H,Tq,Tk) the weights; backward from p, ds (B,H,Tq,Tk)
  // scratch. Fused path: out and lse (B,H,Tq), P never stored; row_dot (B,H,Tq) scratch.
  virtual void sdpa_reference_forward(T* out, T* p, const AttentionParams<T>& args) = 0;
  virtual void sdpa_reference_backward(T* dq, T* dk, T* dv, T* ds, const T* dout, const T* p,
                                       const AttentionParams<T>& args) = 0;
  // The reference path with an attention program's rows (ReferenceRows) in place of the built-in
  // rule's; the same outputs. Backends that run programs elsewhere (the CPU's) throw.
  virtual void sdpa_reference_program_forward(T* /*out*/, T* /*p*/,
                                              const AttentionParams<T>& /*args*/,
                                              const ReferenceRows<T>& /*rows*/) {
    throw std::invalid_argument(name() +
                                ": sdpa_reference_program_forward: this backend runs "
                                "attention programs on its own paths");
  }
  virtual void sdpa_reference_program_backward(T* /*dq*/, T* /*dk*/, T* /*dv*/, T* /*ds*/,
                                               const T* /*dout*/, const T* /*p*/,
                                               const AttentionParams<T>& /*args*/,
                                               const ReferenceRows<T>& /*rows*/) {
    throw std::invalid_argument(name() +
                                ": sdpa_reference_program_backward: this backend runs "
                                "attention programs on its own paths");
  }
  // The GPU launchers of packed documents' mask (attention::masks::DocumentIds, per batch row and
  // causal) over ids (B, T) in this device's memory, for a layer's SequenceLayout on this backend:
  // the ids must outlive every call made with them. Backends that run programs elsewhere (the
  // CPU's) have none: nullptr.
  virtual std::shared_ptr<const cuda::DevicePrograms> document_mask_program(
      const std::int32_t* /*ids*/, std::size_t /*T*/) {
    return nullptr;
  }
  virtual void sdpa_fused_forward(T* out, T* lse, const AttentionParams<T>& args) = 0;
  virtual void sdpa_fused_backward(T* dq, T* dk, T* dv, T* row_dot, const T* dout, const T* out,
                                   const T* lse, const AttentionParams<T>& args) = 0;
  // Throws std::invalid_argument when the fused path cannot take head dims D, Dv.
  virtual void check_fused(std::size_t D, std::size_t Dv) = 0;

  // ---- optimizers and norms ----------------------------------------------------------------
  virtual void adamw_update(T* param, T* m, T* v, const T* grad, std::size_t n,
                            const kernel_math::AdamWScalars<T>& scalars) = 0;
  // torch.optim.SGD (dampening 0): g = grad + wd·p; buf = g (first) or momentum·buf + g; p -=
  // lr·buf. buf is null when momentum is 0 (then p -= lr·g).
  virtual void sgd_update(T* param, T* buf, const T* grad, std::size_t n, T lr, T momentum,
                          T weight_decay, bool first_step) = 0;
  // out (1 double, device) = Σ x² accumulated in double; partial holds sum_of_squares_scratch()
  // doubles.
  virtual void sum_of_squares(double* out, double* partial, const T* x, std::size_t n) = 0;
  virtual std::size_t sum_of_squares_scratch() const = 0;

  // ---- Muon (attnlab/optim/muon.hpp) ---------------------------------------------------------
  // C = alpha · op(A) op(B) + beta · C, row-major with row strides lda, ldb, ldc: blas::gemm's
  // contract (attnlab/blas.hpp) on backend memory; C aliases neither A nor B; beta 0 ignores C.
  virtual void gemm(bool trans_a, bool trans_b, std::size_t m, std::size_t n, std::size_t k,
                    T alpha, const T* a, std::size_t lda, const T* b, std::size_t ldb, T beta, T* c,
                    std::size_t ldc) = 0;
  // Muon's momentum (kernel_math::muon_momentum_element): m ← lerp(m, g, 1 − β), then
  // u ← lerp(g, m, β) with Nesterov, u ← m without; 1 − β formed in double by the caller. u may
  // not alias m or g.
  virtual void muon_momentum(T* u, T* m, const T* g, std::size_t n, T beta, T one_minus_beta,
                             bool nesterov) = 0;
  // x ← x / (√s + eps) with s the one device double that sum_of_squares wrote.
  virtual void divide_by_norm(T* x, const double* sum_of_squares, std::size_t n, T eps) = 0;
  // y ← a · y + b · x (two roundings, in that order: p·(1 − decay), then + (−step)·x).
  virtual void axpby(T* y, const T* x, std::size_t n, T a, T b) = 0;
};

// ops's precision set to `precision` for this object's lifetime, then put back (a run on a backend
// it shares with others). Throws as set_precision.
template <class T>
class PrecisionScope {
 public:
  PrecisionScope(DeviceOps<T>& ops, GemmPrecision precision) : ops_(ops), before_(ops.precision()) {
    ops.set_precision(precision);
  }
  ~PrecisionScope() { ops_.set_precision(before_); }
  PrecisionScope(const PrecisionScope&) = delete;
  PrecisionScope& operator=(const PrecisionScope&) = delete;

 private:
  DeviceOps<T>& ops_;
  GemmPrecision before_;
};

// A new CUDA backend, owned by the caller (a run makes one and keeps it for its lifetime; instances
// are independent and hold no state). Throws CudaError naming make_cuda_device_ops when attnlab was
// built without CUDA or no device is available.
template <class T>
std::unique_ptr<DeviceOps<T>> make_cuda_device_ops();

// The scalars of AdamW step t (1-based) for these options, formed in double as the CPU op does, for
// DeviceOps::adamw_update.
template <class T>
kernel_math::AdamWScalars<T> adamw_scalars(double lr, double beta1, double beta2, double eps,
                                           double weight_decay, std::size_t t);

}  // namespace attnlab
