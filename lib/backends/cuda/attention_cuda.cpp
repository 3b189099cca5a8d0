// The host side of the GPU attention op (attnlab/ops/attention_cuda.hpp): the CPU op's checks and
// cache (lib/src/ops/attention_checks.hpp), device copies, and the CUDA backend's DeviceOps
// (attnlab/device_ops.hpp), whose attention calls are the GPU paths. Part of the CUDA backend, but
// compiled by the C++ compiler into the library in every build (lib/CMakeLists.txt): it names no
// CUDA type, and without the backend its calls throw as make_cuda_device_ops does
// (without_cuda.cpp), so the op needs no stub.
#include "attnlab/ops/attention_cuda.hpp"

#include <algorithm>
#include <limits>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include "attention_program_host.hpp"
#include "attnlab/cuda.hpp"
#include "attnlab/device_ops.hpp"
#include "ops/attention_checks.hpp"

namespace attnlab {

namespace {

// `count` elements of T in the memory of `device`, released with the array.
template <class T, class U = T>
class DeviceArray {
 public:
  DeviceArray() = default;
  DeviceArray(DeviceOps<T>& device, std::size_t count)
      : device_(&device),
        data_(static_cast<U*>(device.allocate(count * sizeof(U)))),
        count_(count) {}
  DeviceArray(DeviceOps<T>& device, const U* host, std::size_t count) : DeviceArray(device, count) {
    device.upload(data_, host, count * sizeof(U));
  }
  DeviceArray(DeviceArray&& o) noexcept { *this = std::move(o); }
  DeviceArray& operator=(DeviceArray&& o) noexcept {
    std::swap(device_, o.device_), std::swap(data_, o.data_), std::swap(count_, o.count_);
    return *this;
  }
  ~DeviceArray() {
    if (device_ != nullptr) device_->release(data_);
  }
  U* data() const { return data_; }
  std::size_t size() const { return count_; }
  void download(U* host) const { device_->download(host, data_, count_ * sizeof(U)); }

 private:
  DeviceOps<T>* device_ = nullptr;
  U* data_ = nullptr;
  std::size_t count_ = 0;
};

// The process's CUDA backend for this op, made on first use (after require_device). DeviceOps
// instances hold no state the op depends on, so one serves every thread.
template <class T>
DeviceOps<T>& gpu() {
  static const std::unique_ptr<DeviceOps<T>> ops = make_cuda_device_ops<T>();
  return *ops;
}

// The device copies of one call's inputs and the launch parameters pointing at them.
template <class T>
struct DeviceInputs {
  DeviceArray<T> q, k, v, scale, alibi, bias;
  DeviceArray<T, unsigned char> key_mask;
  AttentionParams<T> params;

  DeviceInputs(DeviceOps<T>& d, const SdpaCache<T>& c, const Tensor4<T>& q_host,
               const Tensor4<T>& k_host, const Tensor4<T>& v_host)
      : q(d, q_host.data(), q_host.size()),
        k(d, k_host.data(), k_host.size()),
        v(d, v_host.data(), v_host.size()),
        scale(d, c.scale.data(), c.scale.size()) {
    params = c.params(q.data(), k.data(), v.data());
    params.scale = scale.data();
    if (!c.alibi.empty()) {
      alibi = DeviceArray<T>(d, c.alibi.data(), c.alibi.size());
      params.alibi_slopes = alibi.data();
    }
    if (c.has_bias()) {
      bias = DeviceArray<T>(d, c.bias.data(), c.bias.size());
      params.bias = bias.data();
    }
    params.key_mask = nullptr;
    if (c.has_key_mask) {
      const std::vector<unsigned char> mask(c.key_mask.begin(), c.key_mask.end());
      key_mask = DeviceArray<T, unsigned char>(d, mask.data(), mask.size());
      params.key_mask = key_mask.data();
    }
  }
};

// A device output of `count` elements, poisoned with NaN so that an element no kernel wrote shows.
template <class T>
DeviceArray<T> poisoned(DeviceOps<T>& d, std::size_t count) {
  const std::vector<T> nan(count, std::numeric_limits<T>::quiet_NaN());
  return DeviceArray<T>(d, nan.data(), count);
}

// `automatic` on the GPU: the fused path when its tiles fit in shared memory for D and Dv.
template <class T>
SdpaPath resolve_cuda_path(DeviceOps<T>& d, SdpaPath path, std::size_t D, std::size_t Dv) {
  if (path != SdpaPath::automatic) return path;
  try {
    d.check_fused(D, Dv);
    return SdpaPath::fused;
  } catch (const std::invalid_argument&) {
    return SdpaPath::reference;
  }
}

// A call's program on the GPU: its launchers for T (refused without them).
template <class T>
const cuda::DeviceProgram<T>& device_program_of(const SdpaCache<T>& c, const char* op) {
  static const cuda::DeviceProgram<T> none;
  if (!c.has_program()) return none;
  const cuda::DeviceProgram<T>* d =
      c.device_program ? &c.device_program->template get<T>() : nullptr;
  check_arg(d != nullptr && static_cast<bool>(*d), op, "device_program",
            "the program's GPU launchers beside score_program / mask_program: "
            "SdpaOptions::device_program = attnlab::cuda::device_program(score, mask), made in a "
            ".cu file that includes attention_program_kernels.cuh (or a .cpp under the emulator)",
            "none");
  check_arg(d->has_score == static_cast<bool>(c.score_program) &&
                d->has_mask == static_cast<bool>(c.mask_program),
            op, "device_program", "launchers for the same kinds of program as the host programs",
            std::string("score ") + (d->has_score ? "yes" : "no") + ", mask " +
                (d->has_mask ? "yes" : "no"));
  return *d;
}

// The captured parameters' gradients, as tensors.
template <class T>
std::vector<Tensor1<T>> as_tensors(const std::vector<std::vector<T>>& grads) {
  std::vector<Tensor1<T>> out;
  for (const auto& values : grads) {
    Tensor1<T> t = Tensor1<T>::from_shape({values.size()});
    std::copy(values.begin(), values.end(), t.begin());
    out.push_back(std::move(t));
  }
  return out;
}

// The name the program errors give, as on the CPU.
template <class T>
std::string score_name(const SdpaCache<T>& c) {
  return c.score_program ? c.score_program->name() : std::string("score program");
}

}  // namespace

namespace {
// The cache of a GPU call: the CPU op's, with the GPU's path and the program's launchers (a
// program without them throws here, before any copy). A mask program given without its block mask
// gets one built once, at the fused kernels' tile (not at the CPU's, for the kernels to build
// again).
template <class T>
SdpaCache<T> gpu_cache(DeviceOps<T>& device, const SdpaCall& call, SdpaOptions options,
                       const KeyMask* key_mask, const Tensor4<T>* bias, const char* op) {
  const AttentionSpec& spec = call.spec;
  const SdpaPath path = resolve_cuda_path<T>(device, options.path, spec.D, spec.Dv);
  if (path == SdpaPath::fused && options.mask_program && !options.block_mask &&
      options.device_program && options.device_program->template get<T>()) {
    const auto tile = static_cast<std::size_t>(
        options.device_program->template get<T>().fused_tile(spec.D, spec.Dv));
    options.block_mask = std::make_shared<const attention::BlockMask>(
        attention::build_block_mask(options.mask_program, spec, tile, tile));
  }
  SdpaCache<T> c;
  detail::fill_sdpa_cache(c, call, options, key_mask, bias);
  c.path = path;
  c.device_program = options.device_program;
  (void)device_program_of(c, op);
  return c;
}
}  // namespace

template <class T>
SdpaCache<T> sdpa_program_cache(DeviceOps<T>& device, const SdpaCall& call,
                                const SdpaOptions& options) {
  return gpu_cache<T>(device, call, options, nullptr, nullptr, "sdpa_forward_cuda");
}

template <class T>
void sdpa_program_forward_device(DeviceOps<T>& device, SdpaCache<T>& c, const AttentionParams<T>& a,
                                 T* out, T* aux) {
  const char* op = "sdpa_forward_cuda";
  const cuda::DeviceProgram<T>& program = device_program_of(c, op);
  if (c.path == SdpaPath::reference) {
    cuda::DeviceProgramCall<T> run(device, program, a, c.program_params, c.mask_program, nullptr,
                                   false, false);
    device.sdpa_reference_program_forward(out, aux, a, run.reference_rows());
    run.rethrow(op, score_name(c));
  } else {
    cuda::DeviceProgramCall<T> run(device, program, a, c.program_params, c.mask_program,
                                   c.block_mask, false);
    run.forward(out, aux);
    run.rethrow(op, score_name(c));
    c.block_mask = run.block_mask();  // the one the kernels used: at their tile size
  }
}

template <class T>
std::vector<std::vector<T>> sdpa_program_backward_device(DeviceOps<T>& device,
                                                         const SdpaCache<T>& c,
                                                         const AttentionParams<T>& a, const T* dout,
                                                         const T* out, const T* aux, T* dq, T* dk,
                                                         T* dv, T* scratch) {
  const char* op = "sdpa_backward_cuda";
  const cuda::DeviceProgram<T>& program = device_program_of(c, op);
  const bool fused = c.path == SdpaPath::fused;
  cuda::DeviceProgramCall<T> run(device, program, a, c.program_params, c.mask_program,
                                 fused ? c.block_mask : nullptr, c.program_grad, fused);
  if (fused) {
    run.backward(dq, dk, dv, scratch, dout, out, aux);
  } else {
    device.sdpa_reference_program_backward(dq, dk, dv, scratch, dout, aux, a, run.reference_rows());
  }
  run.rethrow(op, score_name(c));
  return c.program_grad ? run.grads() : std::vector<std::vector<T>>();
}

template <class T>
Tensor4<T> sdpa_forward_cuda(DeviceOps<T>& device, SdpaCache<T>& cache, const Tensor4<T>& q,
                             const Tensor4<T>& k, const Tensor4<T>& v, const SdpaOptions& options,
                             const KeyMask* key_mask, const Tensor4<T>* bias) {
  const char* op = "sdpa_forward_cuda";
  const SdpaCall call = detail::check_sdpa_inputs<T>(op, q, k, &v, options, key_mask, bias);
  const AttentionSpec& spec = call.spec;
  SdpaCache<T> c = gpu_cache<T>(device, call, options, key_mask, bias, op);

  DeviceInputs<T> in(device, c, q, k, v);
  Tensor4<T> out({spec.B, spec.H, spec.Tq, spec.Dv});
  auto out_d = poisoned<T>(device, out.size());
  // The forward into out_d and the path's saved statistic (P or the LSE) into `saved`: the
  // program's kernels with a program, else the path's own (builtin).
  const auto forward = [&](auto& saved, auto builtin) {
    auto saved_d = poisoned<T>(device, saved.size());
    if (c.has_program()) {
      sdpa_program_forward_device<T>(device, c, in.params, out_d.data(), saved_d.data());
    } else {
      (device.*builtin)(out_d.data(), saved_d.data(), in.params);
    }
    device.synchronize();
    saved_d.download(saved.data());
  };
  if (c.path == SdpaPath::reference) {
    c.p = Tensor4<T>({spec.B, spec.H, spec.Tq, spec.Tk});
    forward(c.p, &DeviceOps<T>::sdpa_reference_forward);
  } else {
    c.lse = Tensor3<T>({spec.B, spec.H, spec.Tq});
    forward(c.lse, &DeviceOps<T>::sdpa_fused_forward);
  }
  out_d.download(out.data());
  if (c.path == SdpaPath::fused) c.out = out;
  cache = std::move(c);
  return out;
}

template <class T>
Tensor4<T> sdpa_forward_cuda(SdpaCache<T>& cache, const Tensor4<T>& q, const Tensor4<T>& k,
                             const Tensor4<T>& v, const SdpaOptions& options,
                             const KeyMask* key_mask, const Tensor4<T>* bias) {
  const char* op = "sdpa_forward_cuda";
  // Bad inputs, and a program without launchers, throw before a device is asked for.
  (void)detail::check_sdpa_inputs<T>(op, q, k, &v, options, key_mask, bias);
  if (options.score_program || options.mask_program || options.block_mask) {
    check_arg(static_cast<bool>(options.device_program), op, "device_program",
              "the program's GPU launchers beside score_program / mask_program: "
              "SdpaOptions::device_program = attnlab::cuda::device_program(score, mask), made in a "
              ".cu file that includes attention_program_kernels.cuh (or a .cpp under the emulator)",
              "none");
  }
  cuda::require_device(op);
  return sdpa_forward_cuda(gpu<T>(), cache, q, k, v, options, key_mask, bias);
}

template <class T>
SdpaGrads<T> sdpa_backward_cuda(const Tensor4<T>& dout, const SdpaCache<T>& cache,
                                const Tensor4<T>& q, const Tensor4<T>& k, const Tensor4<T>& v) {
  detail::check_sdpa_backward_inputs("sdpa_backward_cuda", dout, cache, q, k, v);
  cuda::require_device("sdpa_backward_cuda");
  return sdpa_backward_cuda(gpu<T>(), dout, cache, q, k, v);
}

template <class T>
SdpaGrads<T> sdpa_backward_cuda(DeviceOps<T>& device, const Tensor4<T>& dout,
                                const SdpaCache<T>& cache, const Tensor4<T>& q, const Tensor4<T>& k,
                                const Tensor4<T>& v) {
  const char* op = "sdpa_backward_cuda";
  detail::check_sdpa_backward_inputs(op, dout, cache, q, k, v);
  const AttentionSpec& s = cache.spec;
  (void)device_program_of(cache, op);  // a program without launchers throws before any copy

  DeviceInputs<T> in(device, cache, q, k, v);
  DeviceArray<T> dout_d(device, dout.data(), dout.size());
  SdpaGrads<T> g{Tensor4<T>({s.B, s.H, s.Tq, s.D}),
                 Tensor4<T>({s.B, s.Hkv, s.Tk, s.D}),
                 Tensor4<T>({s.B, s.Hkv, s.Tk, s.Dv}),
                 Tensor1<T>::from_shape({s.H}),
                 {},
                 {}};
  Tensor4<T> scratch;  // dS (B,H,Tq,Tk) when the bias broadcasts
  Tensor4<T>* dscores = cache.bias_grad ? &detail::dscores_for(g, scratch, cache) : nullptr;
  DeviceArray<T> dscores_d;
  if (dscores) {
    dscores_d = DeviceArray<T>(device, dscores->data(), dscores->size());  // zeroed
    in.params.dscores = dscores_d.data();
  }
  auto dq_d = poisoned<T>(device, g.dq.size());
  auto dk_d = poisoned<T>(device, g.dk.size());
  auto dv_d = poisoned<T>(device, g.dv.size());
  if (cache.path == SdpaPath::reference) {
    DeviceArray<T> p_d(device, cache.p.data(), cache.p.size());
    auto ds_d = poisoned<T>(device, cache.p.size());
    if (cache.has_program()) {
      g.dprogram = as_tensors(sdpa_program_backward_device<T>(
          device, cache, in.params, dout_d.data(), nullptr, p_d.data(), dq_d.data(), dk_d.data(),
          dv_d.data(), ds_d.data()));
    } else {
      device.sdpa_reference_backward(dq_d.data(), dk_d.data(), dv_d.data(), ds_d.data(),
                                     dout_d.data(), p_d.data(), in.params);
    }
  } else {
    DeviceArray<T> out_d(device, cache.out.data(), cache.out.size());
    DeviceArray<T> lse_d(device, cache.lse.data(), cache.lse.size());
    auto row_dot_d = poisoned<T>(device, cache.lse.size());
    if (cache.has_program()) {
      g.dprogram = as_tensors(sdpa_program_backward_device<T>(
          device, cache, in.params, dout_d.data(), out_d.data(), lse_d.data(), dq_d.data(),
          dk_d.data(), dv_d.data(), row_dot_d.data()));
    } else {
      device.sdpa_fused_backward(dq_d.data(), dk_d.data(), dv_d.data(), row_dot_d.data(),
                                 dout_d.data(), out_d.data(), lse_d.data(), in.params);
    }
  }
  device.synchronize();
  dq_d.download(g.dq.data());
  dk_d.download(g.dk.data());
  dv_d.download(g.dv.data());
  if (dscores) {
    dscores_d.download(dscores->data());
    if (scratch.size() != 0) {
      const auto& b = cache.bias.shape();
      g.dbias = sum_to_bias_shape(scratch, {b[0], b[1], b[2], b[3]});
    }
  }
  // dL/ds_h = Σ dS ⊙ (Q Kᵀ) = ⟨dQ, Q⟩ / s_h, per (b, h) slice, then summed over the batch.
  std::vector<T> dscale_part(s.B * s.H);
  const std::size_t slice = s.Tq * s.D;
  for (std::size_t bh = 0; bh < s.B * s.H; ++bh) {
    T acc = 0;
    for (std::size_t i = 0; i < slice; ++i) {
      acc += g.dq.data()[bh * slice + i] * q.data()[bh * slice + i];
    }
    dscale_part[bh] = acc / cache.scale[bh % s.H];
  }
  detail::sum_dscale(g, dscale_part, s.H);
  return g;
}

#define ATTNLAB_INSTANTIATE_SDPA_CUDA(T)                                                           \
  template Tensor4<T> sdpa_forward_cuda<T>(SdpaCache<T>&, const Tensor4<T>&, const Tensor4<T>&,    \
                                           const Tensor4<T>&, const SdpaOptions&, const KeyMask*,  \
                                           const Tensor4<T>*);                                     \
  template SdpaGrads<T> sdpa_backward_cuda<T>(const Tensor4<T>&, const SdpaCache<T>&,              \
                                              const Tensor4<T>&, const Tensor4<T>&,                \
                                              const Tensor4<T>&);                                  \
  template Tensor4<T> sdpa_forward_cuda<T>(DeviceOps<T>&, SdpaCache<T>&, const Tensor4<T>&,        \
                                           const Tensor4<T>&, const Tensor4<T>&,                   \
                                           const SdpaOptions&, const KeyMask*, const Tensor4<T>*); \
  template SdpaGrads<T> sdpa_backward_cuda<T>(DeviceOps<T>&, const Tensor4<T>&,                    \
                                              const SdpaCache<T>&, const Tensor4<T>&,              \
                                              const Tensor4<T>&, const Tensor4<T>&);               \
  template SdpaCache<T> sdpa_program_cache<T>(DeviceOps<T>&, const SdpaCall&, const SdpaOptions&); \
  template void sdpa_program_forward_device<T>(DeviceOps<T>&, SdpaCache<T>&,                       \
                                               const AttentionParams<T>&, T*, T*);                 \
  template std::vector<std::vector<T>> sdpa_program_backward_device<T>(                            \
      DeviceOps<T>&, const SdpaCache<T>&, const AttentionParams<T>&, const T*, const T*, const T*, \
      T*, T*, T*, T*);
ATTNLAB_INSTANTIATE_SDPA_CUDA(float)
ATTNLAB_INSTANTIATE_SDPA_CUDA(double)
#undef ATTNLAB_INSTANTIATE_SDPA_CUDA

}  // namespace attnlab
