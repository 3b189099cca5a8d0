// Private to lib/backends/cuda: a float backend's precision (DeviceOps::set_precision) in the one
// launch glue (kernel_device_ops.hpp), over its Runtime.
//   GEMMs      bf16: A and B rounded into bf16 device copies (to_bf16_kernel), then the runtime's
//              gemm_bf16 (fp32 sums into the fp32 C: cublasGemmStridedBatchedEx on a GPU, exact
//              products summed in fp32 by the emulator); tf32: the runtime's gemm_tf32 (cuBLAS's
//              TF32 tensor-op math; the emulator rounds copies of A and B to TF32).
//   attention  bf16 with D = Dv ∈ {64, 128} and a call the tensor-core kernels take: q, k, v (and
//              dO in the backward) rounded into bf16 copies, then attention_tc_kernels.cuh's
//              forward and deterministic backward; fp32 O, LSE and gradients, as the fp32 kernels.
// Include after kernel_device_ops.hpp's prerequisites (the emulator first on the CPU).
#pragma once

#include <cstddef>

#include "attention_tc_kernels.cuh"
#include "attnlab/attention/params.hpp"
#include "attnlab/gemm_precision.hpp"
#include "elementwise.cuh"
#include "grid.cuh"

namespace attnlab::cuda::precision {

// x (n floats of device memory) rounded into a bf16 copy that lives as long as this object.
template <class Runtime>
class Bf16Copy {
 public:
  Bf16Copy(Runtime& rt, const float* x, std::size_t n)
      : rt_(rt),
        data_(n ? static_cast<attnlab_bf16*>(rt.allocate(n * sizeof(attnlab_bf16))) : nullptr) {
    if (n > 0) {
      rt.launch(kernels::to_bf16_kernel<float>,
                dim3(kernels::element_blocks(n, Runtime::kMaxStrideBlocks)),
                dim3(kernels::kElementThreads), 0, data_, x, n);
    }
  }
  ~Bf16Copy() { rt_.release(data_); }
  Bf16Copy(const Bf16Copy&) = delete;
  Bf16Copy& operator=(const Bf16Copy&) = delete;
  const attnlab_bf16* data() const { return data_; }

 private:
  Runtime& rt_;
  attnlab_bf16* data_;
};

// The elements a strided-batched operand spans: `rows` stored rows of `cols` at row stride ld, and
// batch matrices `stride` apart.
inline std::size_t operand_span(int rows, int cols, int ld, long long stride, int batch) {
  if (rows <= 0 || cols <= 0 || batch <= 0) return 0;
  return static_cast<std::size_t>(batch - 1) * static_cast<std::size_t>(stride) +
         static_cast<std::size_t>(rows - 1) * static_cast<std::size_t>(ld) +
         static_cast<std::size_t>(cols);
}

// The Runtime's gemm<float> contract at `precision`.
template <class Runtime>
void gemm(Runtime& rt, GemmPrecision precision, bool trans_a, bool trans_b, int m, int n, int k,
          float alpha, const float* a, int lda, long long stride_a, const float* b, int ldb,
          long long stride_b, float beta, float* c, int ldc, long long stride_c, int batch) {
  if (precision == GemmPrecision::bf16 && k > 0) {
    const Bf16Copy<Runtime> ab(
        rt, a, operand_span(trans_a ? k : m, trans_a ? m : k, lda, stride_a, batch));
    const Bf16Copy<Runtime> bb(
        rt, b, operand_span(trans_b ? n : k, trans_b ? k : n, ldb, stride_b, batch));
    rt.gemm_bf16(trans_a, trans_b, m, n, k, alpha, ab.data(), lda, stride_a, bb.data(), ldb,
                 stride_b, beta, c, ldc, stride_c, batch);
  } else if (precision == GemmPrecision::tf32 && k > 0) {
    rt.gemm_tf32(trans_a, trans_b, m, n, k, alpha, a, lda, stride_a, b, ldb, stride_b, beta, c, ldc,
                 stride_c, batch);
  } else {
    rt.template gemm<float>(trans_a, trans_b, m, n, k, alpha, a, lda, stride_a, b, ldb, stride_b,
                            beta, c, ldc, stride_c, batch);
  }
}

// Head dims the tensor-core kernels have.
inline bool tensor_core_dims(std::size_t D, std::size_t Dv) {
  return D == Dv && (D == 64 || D == 128);
}

// Whether the fused attention of this call runs on the tensor-core kernels: bf16, their head dims,
// no attention program (nor its block mask), and the grid tc::check_tc_params accepts. Dropout and
// the dscores output run there too.
inline bool tensor_cores(GemmPrecision precision, const AttentionParams<float>& a) {
  return precision == GemmPrecision::bf16 && tensor_core_dims(a.D, a.Dv) && !a.has_program() &&
         a.block_mask == nullptr && a.B * a.H <= 65535;
}

// q, k and v of a call rounded to bf16.
template <class Runtime>
struct Bf16Inputs {
  Bf16Copy<Runtime> q, k, v;
  Bf16Inputs(Runtime& rt, const AttentionParams<float>& a)
      : q(rt, a.q, a.B * a.H * a.Tq * a.D),
        k(rt, a.k, a.B * a.Hkv * a.Tk * a.D),
        v(rt, a.v, a.B * a.Hkv * a.Tk * a.Dv) {}
};

template <class Runtime>
void tc_forward(Runtime& rt, float* out, float* lse, const AttentionParams<float>& a) {
  const Bf16Inputs<Runtime> in(rt, a);
  if (a.D == 64) {
    tc::tc_attention_forward<64>(rt, out, lse, in.q.data(), in.k.data(), in.v.data(), a);
  } else {
    tc::tc_attention_forward<128>(rt, out, lse, in.q.data(), in.k.data(), in.v.data(), a);
  }
}

// row_dot: B·H·Tq floats of device scratch.
template <class Runtime>
void tc_backward(Runtime& rt, float* dq, float* dk, float* dv, float* row_dot, const float* dout,
                 const float* out, const float* lse, const AttentionParams<float>& a) {
  const Bf16Inputs<Runtime> in(rt, a);
  const Bf16Copy<Runtime> dob(rt, dout, a.B * a.H * a.Tq * a.Dv);
  if (a.D == 64) {
    tc::tc_attention_backward<64>(rt, dq, dk, dv, row_dot, in.q.data(), in.k.data(), in.v.data(),
                                  dob.data(), out, lse, a);
  } else {
    tc::tc_attention_backward<128>(rt, dq, dk, dv, row_dot, in.q.data(), in.k.data(), in.v.data(),
                                   dob.data(), out, lse, a);
  }
}

}  // namespace attnlab::cuda::precision
