// Attention programs on the GPU's fused and reference paths
// (lib/backends/cuda/attention_program_kernels.cuh),
// run on the CPU by the emulated device (attnlab/backends/emulated.hpp) through the GPU op itself
// (sdpa_forward_cuda / sdpa_backward_cuda on a DeviceOps): the same kernel source nvcc compiles.
// Checked against the CPU op's programs, central differences, the built-in rule, and a dense -inf
// bias; block skipping by NaN poison in tiles the mask hides; determinism; the errors. The last
// case runs programs compiled by nvcc (cuda_programs.cu) on a real GPU, skipped without one.
#include <doctest/doctest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include <xtensor/xbuilder.hpp>
#include <xtensor/xmath.hpp>
#include <xtensor/xsort.hpp>

#include "attnlab/attention/programs.hpp"
#include "attnlab/backends/emulated.hpp"
#include "attnlab/nn/multi_head_attention.hpp"
#include "attnlab/ops/attention.hpp"
#include "attnlab/ops/attention_cuda.hpp"
#include "attnlab/random.hpp"
#include "cuda_helpers.hpp"
#include "helpers.hpp"
#include "program_functors.hpp"
#if defined(ATTNLAB_TEST_GPU_PROGRAMS)
#include "gpu_programs.hpp"
#endif

// clang-format off
#include "attnlab/backends/cuda_emulator.hpp"
#include "attention_program_kernels.cuh"
// clang-format on

using namespace attnlab;
using attnlab::test::CappedRelative;
using attnlab::test::DocumentIds;

namespace {

// Queries below 64 see the first 16 keys and keys from 128; later queries see every key.
struct GlobalTail {
  ATTNLAB_HOST_DEVICE bool operator()(std::size_t, std::size_t, std::size_t i,
                                      std::size_t j) const {
    return i >= 64 || j < 16 || j >= 128;
  }
};

// Causal with a window that widens with the head: head h sees the last 24 + 60·h keys. Over
// grouped heads one packed tile holds queries of heads whose tiles differ (empty, partial, full).
struct HeadWindow {
  ATTNLAB_HOST_DEVICE bool operator()(std::size_t, std::size_t h, std::size_t i,
                                      std::size_t j) const {
    return j <= i && i - j < 24 + 60 * h;
  }
};

// +inf at (b, h, i, j) = (0, 1, 3, 2), u elsewhere.
struct InfAt {
  double zero = 0;
  template <class S>
  ATTNLAB_HOST_DEVICE S operator()(S u, std::size_t b, std::size_t h, std::size_t i,
                                   std::size_t j) const {
    using Plain = decltype(attention::value_of(u));
    return b == 0 && h == 1 && i == 3 && j == 2 ? u + Plain(1) / static_cast<Plain>(zero) : u;
  }
};

// Reads element `index` of captured parameter 1 at every score (past its end when index ≥ its
// size).
struct ReadsParam1 {
  std::size_t index = 0;
  template <class S, class P>
  ATTNLAB_HOST_DEVICE S operator()(S u, std::size_t, std::size_t, std::size_t, std::size_t,
                                   const P& params) const {
    return u + params(1, index);
  }
};

struct Inputs {
  Tensor4<double> q, k, v, dout;
};

Inputs inputs(std::size_t B, std::size_t H, std::size_t Hkv, std::size_t Tq, std::size_t Tk,
              std::size_t D, std::uint64_t seed) {
  Rng rng(seed);
  Inputs in;
  in.q = randn<double, 4>({B, H, Tq, D}, rng);
  in.k = randn<double, 4>({B, Hkv, Tk, D}, rng);
  in.v = randn<double, 4>({B, Hkv, Tk, D}, rng);
  in.dout = randn<double, 4>({B, H, Tq, D}, rng);
  return in;
}

template <class T>
Tensor4<T> to(const Tensor4<double>& x) {
  return Tensor4<T>(xt::cast<T>(x));
}

std::vector<std::vector<double>> relative_params(std::size_t H, std::size_t R, std::uint64_t seed) {
  Rng rng(seed);
  const auto table = randn<double, 1>({H * (2 * R + 1)}, rng, 0.5);
  const auto slope = randn<double, 1>({H}, rng, 0.3);
  return {std::vector<double>(table.begin(), table.end()),
          std::vector<double>(slope.begin(), slope.end())};
}

// Both GPU paths, each beside the CPU op's same path.
constexpr SdpaPath kPaths[] = {SdpaPath::fused, SdpaPath::reference};
const char* path_name(SdpaPath p) {
  return p == SdpaPath::fused ? "fused" : "reference";
}

SdpaOptions relative_options(std::size_t H, std::uint64_t seed, SdpaPath path = SdpaPath::fused) {
  SdpaOptions o;
  o.path = path;
  o.score_program = attention::score_program(CappedRelative{}, "capped relative");
  o.program_params = relative_params(H, CappedRelative{}.R, seed);
  o.device_program =
      std::make_shared<const cuda::DevicePrograms>(cuda::device_program(CappedRelative{}));
  return o;
}

template <class T>
struct Run {
  Tensor4<T> out;
  SdpaGrads<T> g;
};

template <class T>
Run<T> gpu_run(DeviceOps<T>& device, const Inputs& in, const SdpaOptions& o,
               const KeyMask* key_mask = nullptr) {
  SdpaCache<T> cache;
  const auto q = to<T>(in.q), k = to<T>(in.k), v = to<T>(in.v);
  Run<T> r;
  r.out = sdpa_forward_cuda(device, cache, q, k, v, o, key_mask);
  r.g = sdpa_backward_cuda(device, to<T>(in.dout), cache, q, k, v);
  return r;
}

template <class T>
Run<T> cpu_run(const Inputs& in, SdpaOptions o, const KeyMask* key_mask = nullptr) {
  SdpaCache<T> cache;
  const auto q = to<T>(in.q), k = to<T>(in.k), v = to<T>(in.v);
  Run<T> r;
  r.out = sdpa_forward(cache, q, k, v, o, key_mask);
  r.g = sdpa_backward(to<T>(in.dout), cache, q, k, v);
  return r;
}

template <class T>
void check_close(const Run<T>& gpu, const Run<T>& cpu, double tol) {
  CHECK(test::all_finite(gpu.out));
  CHECK(test::rel_error(gpu.out, cpu.out) < tol);
  CHECK(test::rel_error(gpu.g.dq, cpu.g.dq) < tol);
  CHECK(test::rel_error(gpu.g.dk, cpu.g.dk) < tol);
  CHECK(test::rel_error(gpu.g.dv, cpu.g.dv) < tol);
  REQUIRE(gpu.g.dprogram.size() == cpu.g.dprogram.size());
  for (std::size_t k = 0; k < gpu.g.dprogram.size(); ++k) {
    CAPTURE(k);
    CHECK(test::rel_error(gpu.g.dprogram[k], cpu.g.dprogram[k]) < tol);
  }
}

// Fused-path options with a mask program: its host form (for the CPU op and the block mask) and the
// launchers of device functor `mask`.
template <class M>
SdpaOptions fused_mask(std::shared_ptr<const attention::MaskProgram> host, M mask) {
  SdpaOptions o;
  o.path = SdpaPath::fused;
  o.mask_program = std::move(host);
  o.device_program = std::make_shared<const cuda::DevicePrograms>(
      cuda::device_program(cuda::fused::NoScore{}, mask));
  return o;
}

// The device layer's parameter gradients (copied to the host) against the CPU layer's, to 1e-12;
// returns the device layer's parameters.
auto check_same_grads(MultiHeadAttention<double>& cpu, MultiHeadAttention<double>& dev) {
  dev.copy_to_host(true);
  const auto pc = cpu.parameters();
  auto pd = dev.parameters();
  REQUIRE(pc.size() == pd.size());
  for (std::size_t i = 0; i < pc.size(); ++i) {
    CAPTURE(pc[i].name);
    CHECK(test::rel_error(pd[i].param->grad, pc[i].param->grad) < 1e-12);
  }
  return pd;
}

// L = Σ out ⊙ dout on the GPU op in double.
double loss(DeviceOps<double>& device, const Inputs& in, const SdpaOptions& o) {
  SdpaCache<double> cache;
  const auto out = sdpa_forward_cuda(device, cache, in.q, in.k, in.v, o);
  double l = 0;
  for (std::size_t e = 0; e < out.size(); ++e) l += out.data()[e] * in.dout.data()[e];
  return l;
}

// Central differences of `loss` at a few elements of each of q, k, v and every element of each
// captured parameter, against the GPU backward's gradients.
void gradient_check(const Inputs& in0, const SdpaOptions& o0) {
  auto device = emulated::make_device_ops<double>();
  const Run<double> run = gpu_run<double>(*device, in0, o0);
  constexpr double h = 1e-6, tol = 1e-6;
  const auto numeric = [&](auto&& perturb) {
    Inputs in = in0;
    SdpaOptions o = o0;
    perturb(in, o, h);
    const double up = loss(*device, in, o);
    in = in0, o = o0;
    perturb(in, o, -h);
    return (up - loss(*device, in, o)) / (2 * h);
  };
  Rng rng(7);
  const auto tensors = {&Inputs::q, &Inputs::k, &Inputs::v};
  const Tensor4<double>* grads[] = {&run.g.dq, &run.g.dk, &run.g.dv};
  int t = 0;
  for (auto member : tensors) {
    const std::size_t n = (in0.*member).size();
    for (int s = 0; s < 6; ++s) {
      const std::size_t e = static_cast<std::size_t>(rng.uniform() * static_cast<double>(n)) % n;
      const double num =
          numeric([&](Inputs& in, SdpaOptions&, double d) { (in.*member).data()[e] += d; });
      CAPTURE(t);
      CAPTURE(e);
      CHECK(std::abs(num - grads[t]->data()[e]) < tol * std::max(1.0, std::abs(num)));
    }
    ++t;
  }
  for (std::size_t k = 0; k < o0.program_params.size(); ++k) {
    for (std::size_t e = 0; e < o0.program_params[k].size(); ++e) {
      const double num =
          numeric([&](Inputs&, SdpaOptions& o, double d) { o.program_params[k][e] += d; });
      CAPTURE(k);
      CAPTURE(e);
      CHECK(std::abs(num - run.g.dprogram[k](e)) < tol * std::max(1.0, std::abs(num)));
    }
  }
}

// Device memory holding `ids`, released with this holder (declared after its device).
class DeviceIds {
 public:
  DeviceIds(DeviceOps<double>& device, const std::vector<std::int32_t>& ids)
      : device_(device), p_(device.allocate(ids.size() * sizeof(std::int32_t))) {
    device.upload(p_, ids.data(), ids.size() * sizeof(std::int32_t));
  }
  DeviceIds(const DeviceIds&) = delete;
  DeviceIds& operator=(const DeviceIds&) = delete;
  ~DeviceIds() { device_.release(p_); }
  const std::int32_t* get() const { return static_cast<const std::int32_t*>(p_); }

 private:
  DeviceOps<double>& device_;
  void* p_;
};

}  // namespace

TEST_CASE("cuda program: a score program matches the CPU op, float and double, both paths") {
  const std::size_t H = 2;
  const Inputs in = inputs(2, H, 1, 37, 70, 8, 11);  // grouped-query, two key tiles
  for (SdpaPath path : kPaths) {
    CAPTURE(path_name(path));
    const SdpaOptions o = relative_options(H, 3, path);
    {
      auto device = emulated::make_device_ops<double>();
      check_close(gpu_run<double>(*device, in, o), cpu_run<double>(in, o), 1e-12);
    }
    {
      auto device = emulated::make_device_ops<float>();
      check_close(gpu_run<float>(*device, in, o), cpu_run<float>(in, o), 2e-5);
    }
  }
}

TEST_CASE("cuda program: gradients of a score program by central differences, both paths") {
  const std::size_t H = 2;
  for (SdpaPath path : kPaths) {
    CAPTURE(path_name(path));
    gradient_check(inputs(1, H, 2, 9, 12, 4, 5), relative_options(H, 9, path));
  }
}

TEST_CASE("cuda program: gradients through document and sliding-window masks, both paths") {
  const std::size_t T = 20, H = 2;
  const std::vector<std::int32_t> ids = {0, 0, 0, 0, 0, 0, 0, 1, 1, 1,
                                         1, 1, 1, 1, 1, 2, 2, 2, 2, 2};
  auto holder = emulated::make_device_ops<double>();  // keeps the ids' device memory
  const DeviceIds held(*holder, ids);
  const DocumentIds device_mask{held.get(), true};
  const auto host_ids = std::make_shared<const std::vector<std::int32_t>>(ids);
  for (SdpaPath path : kPaths) {
    CAPTURE(path_name(path));
    SdpaOptions o = relative_options(H, 4, path);
    o.mask_program = attention::mask_program(attention::masks::Document{host_ids, T, false, true},
                                             "document", {false, false});
    o.device_program = std::make_shared<const cuda::DevicePrograms>(
        cuda::device_program(CappedRelative{}, device_mask));
    const Inputs in = inputs(1, H, 2, T, T, 4, 6);
    {
      auto device = emulated::make_device_ops<double>();
      check_close(gpu_run<double>(*device, in, o), cpu_run<double>(in, o), 1e-12);
    }
    gradient_check(in, o);
    SdpaOptions w;
    w.path = path;
    w.mask_program =
        attention::mask_program(attention::masks::SlidingWindow{5, 0}, "window", {false, false});
    w.device_program = std::make_shared<const cuda::DevicePrograms>(
        cuda::device_program(cuda::fused::NoScore{}, attention::masks::SlidingWindow{5, 0}));
    gradient_check(in, w);
  }
}

TEST_CASE("cuda program: built-in programs match the built-in rule on the GPU, both paths") {
  const std::size_t H = 2, T = 70;
  const Inputs in = inputs(1, H, 2, T, T, 8, 21);
  auto device = emulated::make_device_ops<double>();
  SdpaPath path = SdpaPath::fused;
  SUBCASE("fused") {}
  SUBCASE("reference") {
    path = SdpaPath::reference;
  }
  CAPTURE(path_name(path));
  {
    SdpaOptions builtin;
    builtin.path = path;
    builtin.softcap = 4.0;
    builtin.causal = true;
    SdpaOptions program;
    program.path = path;
    program.score_program = attention::softcap_program(4.0);
    program.mask_program =
        attention::mask_program(attention::masks::Causal{0}, "causal", {false, false});
    program.device_program = std::make_shared<const cuda::DevicePrograms>(
        cuda::device_program(attention::programs::Softcap{4.0}, attention::masks::Causal{0}));
    const auto a = gpu_run<double>(*device, in, builtin), b = gpu_run<double>(*device, in, program);
    CHECK(test::rel_error(a.out, b.out) < 1e-13);
    CHECK(test::rel_error(a.g.dq, b.g.dq) < 1e-12);
    CHECK(test::rel_error(a.g.dk, b.g.dk) < 1e-12);
    CHECK(test::rel_error(a.g.dv, b.g.dv) < 1e-12);
  }
  {  // ALiBi and a sliding window
    SdpaOptions builtin;
    builtin.path = path;
    builtin.alibi_slopes = {0.5, 0.25};
    builtin.causal = true;
    builtin.window = 9;
    SdpaOptions program;
    program.path = path;
    program.score_program = attention::alibi_program(0);
    program.program_params = {{0.5, 0.25}};
    program.mask_program =
        attention::mask_program(attention::masks::SlidingWindow{9, 0}, "window", {false, false});
    program.device_program = std::make_shared<const cuda::DevicePrograms>(
        cuda::device_program(attention::programs::Alibi{0}, attention::masks::SlidingWindow{9, 0}));
    const auto a = gpu_run<double>(*device, in, builtin), b = gpu_run<double>(*device, in, program);
    CHECK(test::rel_error(a.out, b.out) < 1e-13);
    CHECK(test::rel_error(a.g.dq, b.g.dq) < 1e-12);
    CHECK(test::rel_error(a.g.dk, b.g.dk) < 1e-12);
    CHECK(test::rel_error(a.g.dv, b.g.dv) < 1e-12);
    // the slopes' gradients: the CPU op's
    const auto cpu = cpu_run<double>(in, program);
    REQUIRE(b.g.dprogram.size() == 1);
    CHECK(test::rel_error(b.g.dprogram[0], cpu.g.dprogram[0]) < 1e-12);
  }
}

TEST_CASE("cuda program: a document mask equals a dense -inf bias on the fused path") {
  const std::size_t T = 150, H = 2;
  std::vector<std::int32_t> ids(T);
  for (std::size_t t = 0; t < T; ++t) ids[t] = t < 40 ? 0 : (t < 100 ? 1 : 2);
  auto device = emulated::make_device_ops<double>();
  const DeviceIds held(*device, ids);
  const DocumentIds device_mask{held.get(), true};
  SdpaOptions o;
  o.path = SdpaPath::fused;
  o.mask_program = attention::mask_program(
      attention::masks::Document{std::make_shared<const std::vector<std::int32_t>>(ids), T, false,
                                 true},
      "document", {false, false});
  o.device_program = std::make_shared<const cuda::DevicePrograms>(
      cuda::device_program(cuda::fused::NoScore{}, device_mask));
  Tensor4<double> bias = xt::zeros<double>({std::size_t{1}, std::size_t{1}, T, T});
  for (std::size_t i = 0; i < T; ++i) {
    for (std::size_t j = 0; j < T; ++j) {
      if (!(ids[i] == ids[j] && j <= i))
        bias(0, 0, i, j) = -std::numeric_limits<double>::infinity();
    }
  }
  const Inputs in = inputs(1, H, 2, T, T, 8, 31);
  SdpaOptions dense;
  dense.path = SdpaPath::fused;
  dense.bias_requires_grad = false;
  SdpaCache<double> c1, c2;
  const auto a = sdpa_forward_cuda(*device, c1, in.q, in.k, in.v, o);
  const auto b = sdpa_forward_cuda(*device, c2, in.q, in.k, in.v, dense, nullptr, &bias);
  CHECK(test::rel_error(a, b) < 1e-14);
  const auto ga = sdpa_backward_cuda(*device, in.dout, c1, in.q, in.k, in.v);
  const auto gb = sdpa_backward_cuda(*device, in.dout, c2, in.q, in.k, in.v);
  CHECK(test::rel_error(ga.dq, gb.dq) < 1e-13);
  CHECK(test::rel_error(ga.dk, gb.dk) < 1e-13);
  CHECK(test::rel_error(ga.dv, gb.dv) < 1e-13);
}

TEST_CASE("cuda program: tiles a mask program makes empty are skipped (NaN poison)") {
  // Queries 0..63 (the first tile) see keys [0, 16) and [128, 192): the key tile [64, 128) is
  // empty for them. NaN in those K/V rows reaches their output only if the tile is read. With
  // grouped heads (H = 2, 3 over one K/V head) the forward packs the G heads' queries into its
  // tiles, and skips the tile only for all of them together.
  const std::size_t T = 192;
  auto device = emulated::make_device_ops<double>();
  const SdpaOptions o = fused_mask(
      attention::mask_program(GlobalTail{}, "global tail", {false, false}), GlobalTail{});
  for (const std::size_t H : {1, 2, 3}) {
    CAPTURE(H);
    const Inputs clean = inputs(1, H, 1, T, T, 8, 41);
    Inputs poisoned = clean;
    for (std::size_t j = 64; j < 128; ++j) {
      for (std::size_t c = 0; c < 8; ++c) {
        poisoned.k(0, 0, j, c) = std::numeric_limits<double>::quiet_NaN();
        poisoned.v(0, 0, j, c) = std::numeric_limits<double>::quiet_NaN();
      }
    }
    const Run<double> a = gpu_run<double>(*device, clean, o),
                      b = gpu_run<double>(*device, poisoned, o);
    bool clean_rows = true;
    for (std::size_t h = 0; h < H; ++h) {
      for (std::size_t i = 0; i < 64; ++i) {
        for (std::size_t c = 0; c < 8; ++c) {
          clean_rows = clean_rows && std::isfinite(b.out(0, h, i, c)) &&
                       b.out(0, h, i, c) == a.out(0, h, i, c) &&
                       b.g.dq(0, h, i, c) == a.g.dq(0, h, i, c);
        }
      }
      CHECK(std::isnan(b.out(0, h, 64, 0)));  // a later query sees the poisoned keys
    }
    CHECK(clean_rows);
  }
}

TEST_CASE("cuda program: a mask program's block mask is built once, at the kernels' tile") {
  // The host form of GlobalTail counts its evaluations. Building a block mask evaluates the mask
  // once per (i, j) it reads (b and h it does not): T² calls per build.
  const std::size_t T = 192;
  auto calls = std::make_shared<std::size_t>(0);
  const auto counting = [calls](std::size_t b, std::size_t h, std::size_t i, std::size_t j) {
    ++*calls;
    return GlobalTail{}(b, h, i, j);
  };
  auto device = emulated::make_device_ops<double>();
  const SdpaOptions o =
      fused_mask(attention::mask_program(counting, "global tail", {false, false}), GlobalTail{});
  const Inputs in = inputs(2, 2, 1, T, T, 8, 71);
  SdpaCache<double> cache;
  (void)sdpa_forward_cuda(*device, cache, in.q, in.k, in.v, o);
  (void)sdpa_backward_cuda(*device, in.dout, cache, in.q, in.k, in.v);
  CHECK(*calls == T * T);  // one build: the kernels' own, which the backward reuses
  REQUIRE(cache.block_mask != nullptr);
  CHECK(cache.block_mask->tile_rows() ==
        static_cast<std::size_t>(o.device_program->f64.fused_tile(8, 8)));
}

TEST_CASE("cuda program: a head-dependent mask over grouped heads matches the CPU op") {
  // H = 3 heads over one K/V head: the fused forward's packed tiles mix the heads' block states.
  auto device = emulated::make_device_ops<double>();
  const SdpaOptions o =
      fused_mask(attention::mask_program(HeadWindow{}, "head window", {false, true}), HeadWindow{});
  const Inputs in = inputs(2, 3, 1, 200, 200, 8, 61);
  check_close(gpu_run<double>(*device, in, o), cpu_run<double>(in, o), 1e-12);
}

TEST_CASE("cuda program: the parameters' gradients are the same bits run to run, both paths") {
  const std::size_t H = 2;
  const Inputs in = inputs(1, H, 1, 70, 70, 8, 51);  // two key tiles: two rows to sum
  for (SdpaPath path : kPaths) {
    CAPTURE(path_name(path));
    const SdpaOptions o = relative_options(H, 8, path);
    auto device = emulated::make_device_ops<float>();
    const auto a = gpu_run<float>(*device, in, o), b = gpu_run<float>(*device, in, o);
    REQUIRE(a.g.dprogram.size() == 2);
    for (std::size_t k = 0; k < 2; ++k) {
      CHECK(std::memcmp(a.g.dprogram[k].data(), b.g.dprogram[k].data(),
                        a.g.dprogram[k].size() * sizeof(float)) == 0);
    }
    CHECK(std::memcmp(a.g.dq.data(), b.g.dq.data(), a.g.dq.size() * sizeof(float)) == 0);
  }
}

// The forward's error on the emulated GPU, checked to be the CPU op's message under the GPU op's
// name; returned for the caller's own checks.
std::string gpu_error_as_cpu(const Inputs& in, const SdpaOptions& o) {
  std::string cpu, gpu;
  try {
    SdpaCache<double> cache;
    sdpa_forward(cache, in.q, in.k, in.v, o);
  } catch (const std::invalid_argument& e) {
    cpu = e.what();
  }
  try {
    SdpaCache<double> cache;
    auto device = emulated::make_device_ops<double>();
    sdpa_forward_cuda(*device, cache, in.q, in.k, in.v, o);
  } catch (const std::invalid_argument& e) {
    gpu = e.what();
  }
  REQUIRE(cpu.rfind("sdpa_forward: ", 0) == 0);
  CHECK(gpu == "sdpa_forward_cuda: " + cpu.substr(std::string("sdpa_forward: ").size()));
  return gpu;
}

TEST_CASE("cuda program: errors match the CPU op's") {
  const Inputs in = inputs(1, 2, 2, 6, 6, 4, 61);
  SUBCASE("a program without device launchers is refused, naming the op") {
    SdpaOptions o = relative_options(2, 1);
    o.device_program.reset();
    SdpaCache<double> cache;
    auto device = emulated::make_device_ops<double>();
    CHECK_THROWS_WITH_AS(sdpa_forward_cuda(*device, cache, in.q, in.k, in.v, o),
                         doctest::Contains("sdpa_forward_cuda: device_program expected"),
                         std::invalid_argument);
    CHECK_THROWS_WITH_AS(sdpa_forward_cuda(cache, in.q, in.k, in.v, o),
                         doctest::Contains("attention_program_kernels.cuh"), std::invalid_argument);
  }
  SdpaPath path = SdpaPath::fused;
  SUBCASE("a non-finite score at a visible key, fused") {}
  SUBCASE("a non-finite score at a visible key, reference") {
    path = SdpaPath::reference;
  }
  {
    SdpaOptions o;
    o.path = path;
    o.score_program = attention::score_program(InfAt{}, "inf at");
    o.device_program = std::make_shared<const cuda::DevicePrograms>(cuda::device_program(InfAt{}));
    const std::string gpu = gpu_error_as_cpu(in, o);
    CHECK(gpu.find("(0, 1, 3, 2)") != std::string::npos);
  }
}

TEST_CASE("cuda program: a params read past a parameter's end is the CPU op's error, both paths") {
  const std::size_t H = 2;
  const Inputs in = inputs(1, H, 2, 5, 5, 4, 67);
  for (SdpaPath path : kPaths) {
    CAPTURE(static_cast<int>(path));
    SdpaOptions o;
    o.path = path;
    o.program_params = relative_params(H, CappedRelative{}.R, 13);  // parameter 1 holds H values
    o.score_program = attention::score_program(ReadsParam1{H + 3}, "reads param 1");
    o.device_program =
        std::make_shared<const cuda::DevicePrograms>(cuda::device_program(ReadsParam1{H + 3}));
    const std::string gpu = gpu_error_as_cpu(in, o);
    CHECK(gpu.find("params(1, 5) expected an index below 2 of 2 captured parameter(s)") !=
          std::string::npos);
    // In range, the same program runs on both.
    o.score_program = attention::score_program(ReadsParam1{H - 1}, "reads param 1");
    o.device_program =
        std::make_shared<const cuda::DevicePrograms>(cuda::device_program(ReadsParam1{H - 1}));
    SdpaCache<double> cpu_cache, gpu_cache;
    auto device = emulated::make_device_ops<double>();
    const auto cpu_out = sdpa_forward(cpu_cache, in.q, in.k, in.v, o);
    const auto gpu_out = sdpa_forward_cuda(*device, gpu_cache, in.q, in.k, in.v, o);
    CHECK(test::rel_error(gpu_out, cpu_out) < 1e-12);
  }
}

TEST_CASE("cuda program: a MultiHeadAttention on the device with a score program is the CPU one") {
  for (SdpaPath path : kPaths) {
    CAPTURE(path_name(path));
    AttentionConfig c;
    c.d_model = 16;
    c.heads = 2;
    c.sdpa.causal = true;
    c.sdpa.path = path;
    const auto spec = [&] {
      const auto p = relative_params(2, CappedRelative{}.R, 13);
      return ScoreProgramSpec{
          attention::score_program(CappedRelative{}, "capped relative"),
          {{"table", p[0]}, {"slope", p[1]}},
          std::make_shared<const cuda::DevicePrograms>(cuda::device_program(CappedRelative{}))};
    };
    auto device = emulated::make_device_ops<double>();  // outlives the layer on it
    Rng r1(5), r2(5);
    MultiHeadAttention<double> cpu(c, r1), dev(c, r2);
    cpu.set_score_program(spec());
    dev.set_score_program(spec());
    dev.to(*device);
    Rng data(17);
    const auto x = randn<double, 3>({2, 70, 16}, data);  // two key tiles
    const auto dy = randn<double, 3>({2, 70, 16}, data);
    const Tensor3<double> y_cpu = cpu.forward(x), y_dev = dev.forward(x);
    CHECK(test::rel_error(y_dev, y_cpu) < 1e-12);
    const Tensor3<double> dx_cpu = cpu.backward(dy), dx_dev = dev.backward(dy);
    CHECK(test::rel_error(dx_dev, dx_cpu) < 1e-12);
    const auto pd = check_same_grads(cpu, dev);
    CHECK(pd.back().name == "program.slope");
    CHECK(xt::amax(xt::abs(pd.back().param->grad))() > 0);
  }
  // Without launchers a layer on a device refuses the program, naming what it needs.
  AttentionConfig c;
  c.d_model = 16;
  c.heads = 2;
  auto device = emulated::make_device_ops<double>();
  Rng rng(5);
  MultiHeadAttention<double> m(c, rng);
  m.set_score_program({attention::score_program(CappedRelative{}, "capped relative"),
                       {{"table", std::vector<double>(14, 0.1)}, {"slope", {0.1, 0.2}}}});
  m.to(*device);
  Rng data(3);
  CHECK_THROWS_WITH_AS(m.forward(randn<double, 3>({1, 4, 16}, data)),
                       doctest::Contains("score_program expected its GPU launchers"),
                       std::invalid_argument);
}

// Packed documents in a layer on the device: the backend's own document mask program over ids it
// uploads, the block mask at the kernels' tile built once per layout, grouped heads and RoPE
// restarting per document; the CPU layer with the same layout gives the same numbers.
TEST_CASE(
    "cuda program: a MultiHeadAttention on the device with a document layout is the CPU one") {
  // T = 140: three tiles of 64. Row 0: documents of 70 and 70 tokens (its last row block skips
  // key tile 0); row 1: 30, 100 and 10.
  const std::size_t B = 2, T = 140;
  std::vector<std::int32_t> ids(B * T);
  for (std::size_t t = 0; t < T; ++t) {
    ids[t] = t < 70 ? 0 : 1;
    ids[T + t] = t < 30 ? 0 : (t < 130 ? 1 : 2);
  }
  const SequenceLayout layout = document_layout(ids, B, T, /*restart_positions=*/true);
  for (SdpaPath path : kPaths) {
    CAPTURE(path_name(path));
    AttentionConfig c;
    c.d_model = 16;
    c.heads = 4;
    c.kv_heads = 2;
    c.rope = true;
    c.sdpa.causal = true;
    c.sdpa.path = path;
    auto device = emulated::make_device_ops<double>();  // outlives the layer on it
    Rng r1(41), r2(41);
    MultiHeadAttention<double> cpu(c, r1), dev(c, r2);
    dev.to(*device);
    Rng data(43);
    const auto x = randn<double, 3>({B, T, 16}, data);
    const auto dy = randn<double, 3>({B, T, 16}, data);
    // The layer's forward and backward, and the bytes its device copied to the host meanwhile.
    const auto run = [&](MultiHeadAttention<double>& m, std::size_t& downloaded) {
      const Buffer<double> x_b = to_buffer<double>(m.ops(), x),
                           dy_b = to_buffer<double>(m.ops(), dy);
      const std::size_t before =
          m.ops().host_memory() ? 0 : emulated::transfers(m.ops()).downloaded;
      const Buffer<double> y = m.forward(x_b, nullptr, &layout);
      const Buffer<double> dx = m.backward(dy_b);
      downloaded = m.ops().host_memory() ? 0 : emulated::transfers(m.ops()).downloaded - before;
      return std::make_pair(to_tensor<double, 3>(y, "y"), to_tensor<double, 3>(dx, "dx"));
    };
    std::size_t downloaded = 0;
    const auto [y_cpu, dx_cpu] = run(cpu, downloaded);
    const auto [y_dev, dx_dev] = run(dev, downloaded);
    CHECK(test::rel_error(y_dev, y_cpu) < 1e-12);
    CHECK(test::rel_error(dx_dev, dx_cpu) < 1e-12);
    // Only the kernels' error records came back (24 bytes a call): q, k, v, O and their gradients
    // stay on the device (one of them is 2·4·140·4 doubles, 35,840 bytes).
    CHECK(downloaded <= 4 * sizeof(cuda::DeviceProgramError));
    (void)check_same_grads(cpu, dev);
    // The layout is not the plain causal rule: without it the device layer differs.
    const Tensor3<double> causal = dev.forward(x);
    CHECK(xt::amax(xt::abs(causal - y_dev))() > 1e-3);
  }
  // block_mask_at builds a tile's mask once and keeps it with the layout.
  const auto at64 = layout.block_mask_at(64, 64);
  CHECK(at64 == layout.block_mask_at(64, 64));
  CHECK(at64 != layout.block_mask);
  CHECK(at64->tile_rows() == 64);
  CHECK(at64->count(attention::BlockState::empty) + at64->density() > 0);
  const auto& skipped = at64->row_block(0, 0, 2);  // row 0, queries 128..139: keys from 70
  CHECK(skipped.lo == 70);
  // A layout built at layout_tiles is the one the layers read: on the device at the kernels'
  // tile (no second build), on the CPU at the config's tiles.
  {
    AttentionConfig c;
    c.d_model = 16;
    c.heads = 4;
    c.sdpa.tile_rows = 32;
    auto device = emulated::make_device_ops<double>();
    const auto [rows, keys] = layout_tiles(*device, c);
    const auto kernels = device->document_mask_program(nullptr, T);
    CHECK(rows == static_cast<std::size_t>(kernels->f64.fused_tile(4, 4)));  // 16 in double
    CHECK(keys == rows);
    const SequenceLayout at_tile = document_layout(ids, B, T, true, rows, keys);
    CHECK(at_tile.block_mask_at(rows, keys) == at_tile.block_mask);
    CHECK(layout_tiles(cpu_ops<double>(), c) == std::make_pair(std::size_t{32}, std::size_t{0}));
  }

  // What a device cannot run is refused by name: a layout without document ids, and a layer's
  // score program beside the layout's mask.
  AttentionConfig c;
  c.d_model = 16;
  c.heads = 2;
  c.sdpa.causal = true;
  auto device = emulated::make_device_ops<double>();
  Rng rng(5);
  MultiHeadAttention<double> m(c, rng);
  m.to(*device);
  SequenceLayout prefix;
  prefix.block_mask = std::make_shared<const attention::BlockMask>(attention::build_block_mask(
      attention::prefix_lm_mask(2), {.B = 1, .H = 1, .Hkv = 1, .Tq = 4, .Tk = 4, .D = 1, .Dv = 1}));
  Rng data(3);
  const auto x = to_buffer<double>(*device, randn<double, 3>({1, 4, 16}, data));
  CHECK_THROWS_WITH_AS(m.forward(x, nullptr, &prefix),
                       doctest::Contains("layout.documents expected B·T = 4 document ids"),
                       std::invalid_argument);
  MultiHeadAttention<double> scored(c, rng);
  scored.set_score_program(
      {attention::score_program(CappedRelative{}, "capped relative"),
       {{"table", std::vector<double>(14, 0.1)}, {"slope", {0.1, 0.2}}},
       std::make_shared<const cuda::DevicePrograms>(cuda::device_program(CappedRelative{}))});
  scored.to(*device);
  const SequenceLayout docs = document_layout({0, 0, 1, 1}, 1, 4, false);
  CHECK_THROWS_WITH_AS(scored.forward(x, nullptr, &docs),
                       doctest::Contains("no score program beside a layout's mask"),
                       std::invalid_argument);
}

TEST_CASE("cuda program on a GPU: nvcc-compiled score and document programs match the CPU op") {
  if (!test::cuda_device_or_skip()) return;
#if defined(ATTNLAB_TEST_GPU_PROGRAMS)
  const std::size_t T = 150, H = 2;
  std::vector<std::int32_t> ids(T);
  for (std::size_t t = 0; t < T; ++t) ids[t] = t < 40 ? 0 : (t < 100 ? 1 : 2);
  auto holder = make_cuda_device_ops<double>();  // keeps the ids' device memory
  const DeviceIds held(*holder, ids);
  const auto host_ids = std::make_shared<const std::vector<std::int32_t>>(ids);
  const Inputs in = inputs(2, H, 1, T, T, 8, 71);  // grouped-query, three key tiles
  // The GPU op on the device itself (not a DeviceOps argument).
  const auto device_run = [&](const SdpaOptions& o, auto zero) {
    using F = decltype(zero);
    SdpaCache<F> cache;
    const auto q = to<F>(in.q), k = to<F>(in.k), v = to<F>(in.v);
    Run<F> r;
    r.out = sdpa_forward_cuda(cache, q, k, v, o);
    r.g = sdpa_backward_cuda(to<F>(in.dout), cache, q, k, v);
    return r;
  };
  for (SdpaPath path : kPaths) {
    CAPTURE(path_name(path));
    SdpaOptions score = relative_options(H, 5, path);
    score.device_program =
        std::make_shared<const cuda::DevicePrograms>(test::gpu_capped_relative());
    SdpaOptions documents = score;
    documents.mask_program = attention::mask_program(
        attention::masks::Document{host_ids, T, false, true}, "document", {false, false});
    documents.device_program = std::make_shared<const cuda::DevicePrograms>(
        test::gpu_capped_relative_documents(held.get()));
    for (const SdpaOptions* o : {&score, &documents}) {
      CAPTURE(o == &score ? "score" : "score and documents");
      check_close(device_run(*o, 0.0), cpu_run<double>(in, *o), 1e-10);
      const Run<float> a = device_run(*o, 0.0f), b = device_run(*o, 0.0f);
      check_close(a, cpu_run<float>(in, *o), 2e-5);
      // The parameters' gradients: the same bits run to run (no float atomics).
      REQUIRE(a.g.dprogram.size() == 2);
      for (std::size_t k = 0; k < 2; ++k) {
        CHECK(std::memcmp(a.g.dprogram[k].data(), b.g.dprogram[k].data(),
                          a.g.dprogram[k].size() * sizeof(float)) == 0);
      }
    }
  }
#else
  FAIL(
      "a CUDA device, but this build has no nvcc-compiled test programs "
      "(ATTNLAB_TEST_GPU_PROGRAMS)");
#endif
}
