// Attention programs (attnlab/attention/program.hpp) on the CPU reference and fused paths: dual
// numbers, score programs with captured parameters under double central-difference gradient
// checks, mask programs through block masks against the same mask given densely, the built-in
// variants re-expressed as programs (bit for bit), determinism across thread counts, and the
// errors. The CUDA paths refuse programs in this version (checked here too).
#include <doctest/doctest.h>

#include <cmath>
#include <cstdint>
#include <limits>
#include <stdexcept>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>
#include <xtensor/xbuilder.hpp>

#include "attnlab/attention/programs.hpp"
#include "attnlab/gradcheck.hpp"
#include "attnlab/ops/attention.hpp"
#include "attnlab/ops/attention_cuda.hpp"
#include "attnlab/random.hpp"
#include "attnlab/threads.hpp"
#include "helpers.hpp"
#include "sdpa_paths.hpp"

using namespace attnlab;
using attention::BlockState;
using attention::Dual;

namespace {

constexpr SdpaPath kCpuPaths[] = {SdpaPath::reference, SdpaPath::fused};

struct Inputs {
  Tensor4<double> q, k, v, r;
};

Inputs make_inputs(std::size_t B, std::size_t H, std::size_t Hkv, std::size_t Tq, std::size_t Tk,
                   std::size_t D, std::size_t Dv, std::uint64_t seed) {
  Rng rng(seed);
  Inputs in;
  in.q = randn<double, 4>({B, H, Tq, D}, rng);
  in.k = randn<double, 4>({B, Hkv, Tk, D}, rng);
  in.v = randn<double, 4>({B, Hkv, Tk, Dv}, rng);
  in.r = randn<double, 4>({B, H, Tq, Dv}, rng);
  return in;
}

// L = Σ O ⊙ r, and its gradients with respect to q, k, v and every captured parameter, checked
// against central differences in double.
void check_program_gradients(const Inputs& in0, SdpaOptions options,
                             const KeyMask* mask = nullptr) {
  Inputs in = in0;
  const auto loss = [&]() {
    SdpaCache<double> cache;
    const Tensor4<double> out = sdpa_forward(cache, in.q, in.k, in.v, options, mask);
    double l = 0;
    for (std::size_t e = 0; e < out.size(); ++e) l += out.data()[e] * in.r.data()[e];
    return l;
  };
  SdpaCache<double> cache;
  sdpa_forward(cache, in.q, in.k, in.v, options, mask);
  const SdpaGrads<double> g = sdpa_backward(in.r, cache, in.q, in.k, in.v);
  REQUIRE(g.dprogram.size() == options.program_params.size());
  std::vector<GradcheckTensor> tensors = {
      {"q", in.q.data(), g.dq.data(), {in.q.shape().begin(), in.q.shape().end()}},
      {"k", in.k.data(), g.dk.data(), {in.k.shape().begin(), in.k.shape().end()}},
      {"v", in.v.data(), g.dv.data(), {in.v.shape().begin(), in.v.shape().end()}}};
  for (std::size_t k = 0; k < options.program_params.size(); ++k) {
    tensors.push_back({"params[" + std::to_string(k) + "]",
                       options.program_params[k].data(),
                       g.dprogram[k].data(),
                       {options.program_params[k].size()}});
  }
  const GradcheckReport report = check_gradients(tensors, loss);
  INFO(report.table());
  CHECK(report.passed(1e-7));
}

// A program of the kind FlexAttention's examples show, with two captured parameters read in one
// score: a relative-position bias table (parameter 0, H rows of 2R + 1) and a learnable per-head
// cap (parameter 1): S = c_h · tanh(u / c_h) + table_h[clamp(j − i)].
struct CappedRelativeBias {
  std::size_t R = 2;
  template <class S>
  S operator()(S u, std::size_t, std::size_t h, std::size_t i, std::size_t j,
               const attention::ProgramParams<S>& p) const {
    using std::tanh;
    const auto r = static_cast<std::ptrdiff_t>(R);
    std::ptrdiff_t rel = static_cast<std::ptrdiff_t>(j) - static_cast<std::ptrdiff_t>(i);
    rel = rel < -r ? -r : (rel > r ? r : rel);
    const S c = p(1, h);
    return c * tanh(u / c) + p(0, h * (2 * R + 1) + static_cast<std::size_t>(rel + r));
  }
};

std::vector<double> random_values(std::size_t n, std::uint64_t seed, double scale,
                                  double shift = 0) {
  Rng rng(seed);
  const auto t = randn<double, 1>({n}, rng);
  std::vector<double> out(n);
  for (std::size_t e = 0; e < n; ++e) out[e] = shift + scale * t(e);
  return out;
}

template <class T>
SdpaGrads<T> forward_backward(const Tensor4<T>& q, const Tensor4<T>& k, const Tensor4<T>& v,
                              const Tensor4<T>& dout, const SdpaOptions& options, Tensor4<T>& out,
                              const KeyMask* mask = nullptr, const Tensor4<T>* bias = nullptr) {
  SdpaCache<T> cache;
  out = sdpa_forward(cache, q, k, v, options, mask, bias);
  return sdpa_backward(dout, cache, q, k, v);
}

template <class A, class B>
bool same_bits(const A& a, const B& b) {
  if (a.size() != b.size()) return false;
  for (std::size_t e = 0; e < a.size(); ++e) {
    const auto x = a.data()[e], y = b.data()[e];
    if (!(x == y || (std::isnan(x) && std::isnan(y)))) return false;
  }
  return true;
}

}  // namespace

TEST_CASE("attention programs: dual numbers carry exact derivatives") {
  Dual<double> u(0.7);
  u.ds = 1.0;
  const double a = 1.3;
  // f = exp(u) · tanh(u / a) + log(u + 2) − sqrt(u + 1) / u, f' by hand.
  const Dual<double> f = exp(u) * tanh(u / a) + log(u + 2.0) - sqrt(u + 1.0) / u;
  const double x = 0.7, t = std::tanh(x / a);
  const double fx = std::exp(x) * t + std::log(x + 2) - std::sqrt(x + 1) / x;
  const double df = std::exp(x) * t + std::exp(x) * (1 - t * t) / a + 1 / (x + 2) -
                    (0.5 / std::sqrt(x + 1) * x - std::sqrt(x + 1)) / (x * x);
  CHECK(f.v == doctest::Approx(fx).epsilon(1e-15));
  CHECK(f.ds == doctest::Approx(df).epsilon(1e-14));
  // Parameters: slots merge by id; a product of two parameter elements carries both partials.
  Dual<double> p(2.0), r(-3.0);
  p.n = 1, p.id[0] = attention::param_id(0, 4), p.dp[0] = 1;
  r.n = 1, r.id[0] = attention::param_id(1, 0), r.dp[0] = 1;
  const Dual<double> g = p * r + p * 5.0;  // ∂/∂p = r + 5 = 2, ∂/∂r = p = 2
  CHECK(g.n == 2);
  CHECK(g.partial(attention::param_id(0, 4)) == 2.0);
  CHECK(g.partial(attention::param_id(1, 0)) == 2.0);
  CHECK(g.partial(attention::param_id(1, 1)) == 0.0);
  // More parameter elements than slots: marked, never silently dropped.
  Dual<double> sum(0.0);
  for (std::size_t e = 0; e <= attention::kDualSlots; ++e) {
    Dual<double> x_e(1.0);
    x_e.n = 1, x_e.id[0] = attention::param_id(0, e), x_e.dp[0] = 1;
    sum = sum + x_e;
  }
  CHECK(sum.n == -1);
  // Comparisons read values, so a branch picks a piece and its derivative.
  CHECK((u > 0.5));
  CHECK_FALSE((u < 0.5));
}

TEST_CASE("attention programs: a score program's gradients pass the gradcheck on both CPU paths") {
  const std::size_t B = 2, H = 2, Tq = 5, Tk = 6, D = 3, Dv = 2, R = 2;
  const Inputs in = make_inputs(B, H, H, Tq, Tk, D, Dv, 211);
  KeyMask mask = xt::ones<bool>({B, Tk});
  mask(1, 3) = false;
  for (SdpaPath path : kCpuPaths) {
    for (bool causal : {false, true}) {
      CAPTURE(path);
      CAPTURE(causal);
      SdpaOptions options = test::with_path({}, path);
      options.causal = causal;
      options.query_offset = causal ? 1 : 0;
      options.score_program =
          attention::score_program(CappedRelativeBias{R}, "capped relative bias");
      options.program_params = {random_values(H * (2 * R + 1), 5, 0.5),
                                random_values(H, 7, 0.3, 2.0)};
      check_program_gradients(in, options, causal ? &mask : nullptr);
    }
  }
}

TEST_CASE("attention programs: mask programs through block masks match the dense mask") {
  // Documents of 3, 5 and 4 positions packed in T = 12, causal within each; prefix-LM with a
  // prefix of 4. Against the same visibility given as a -inf bias on the built-in path.
  const std::size_t B = 2, H = 2, T = 12, D = 4, Dv = 3;
  const std::vector<std::int32_t> ids = {0, 0, 0, 1, 1, 1, 1, 1, 2, 2, 2, 2};
  const auto doc = attention::document_mask(ids, T);
  const auto prefix = attention::prefix_lm_mask(4);
  for (const auto& mask : {doc, prefix}) {
    CAPTURE(mask->name());
    const Inputs in = make_inputs(B, H, H, T, T, D, Dv, 223);
    Tensor4<double> bias = xt::zeros<double>({std::size_t{1}, std::size_t{1}, T, T});
    std::vector<unsigned char> vis(T * T);
    mask->evaluate(vis.data(), attention::ProgramTile{0, 0, 0, T, 0, T});
    for (std::size_t e = 0; e < T * T; ++e) {
      if (vis[e] == 0) bias.data()[e] = -std::numeric_limits<double>::infinity();
    }
    SdpaOptions dense = test::with_path({}, SdpaPath::reference);
    dense.bias_requires_grad = false;
    Tensor4<double> out_dense;
    const auto g_dense = forward_backward(in.q, in.k, in.v, in.r, dense, out_dense, nullptr, &bias);
    for (SdpaPath path : kCpuPaths) {
      for (std::size_t tiles : {std::size_t{0}, std::size_t{1}}) {
        CAPTURE(path);
        CAPTURE(tiles);
        SdpaOptions options = test::with_path({}, path);
        if (tiles == 1) options.tile_rows = 4, options.tile_keys = 4;
        AttentionSizes sizes;
        sizes.B = B, sizes.H = H, sizes.Tq = sizes.Tk = T;
        if (path == SdpaPath::fused) {
          options.block_mask = std::make_shared<const attention::BlockMask>(
              attention::build_block_mask(mask, sizes, options.tile_rows, options.tile_keys));
        } else {
          options.mask_program = mask;
        }
        Tensor4<double> out;
        const auto g = forward_backward(in.q, in.k, in.v, in.r, options, out);
        CHECK(test::rel_error(out, out_dense) < 1e-13);
        CHECK(test::rel_error(g.dq, g_dense.dq) < 1e-13);
        CHECK(test::rel_error(g.dk, g_dense.dk) < 1e-13);
        CHECK(test::rel_error(g.dv, g_dense.dv) < 1e-13);
      }
    }
    // And a program with parameters on top, through the gradcheck.
    for (SdpaPath path : kCpuPaths) {
      SdpaOptions options = test::with_path({}, path);
      options.mask_program = mask;
      options.score_program = attention::relative_bias_program(3);
      options.program_params = {random_values(H * 7, 11, 0.4)};
      check_program_gradients(in, options);
    }
  }
}

TEST_CASE("attention programs: block masks record ranges and states, and skip empty tiles") {
  // A strided mask (visible iff i/4 and j/4 have the same parity) leaves whole empty tiles between
  // visible ones; the causal document mask leaves ranges that start at the document.
  const std::size_t T = 16;
  const auto strided =
      attention::mask_program([](std::size_t, std::size_t, std::size_t i,
                                 std::size_t j) { return (i / 4) % 2 == (j / 4) % 2; },
                              "strided", {false, false});
  AttentionSizes sizes;
  sizes.B = 3, sizes.H = 2, sizes.Tq = sizes.Tk = T;
  const attention::BlockMask m = attention::build_block_mask(strided, sizes, 4, 4);
  // Brute force: for each row block, [lo, hi) and each tile's state.
  for (std::size_t rb = 0; rb < 4; ++rb) {
    const auto& r = m.row_block(2, 1, rb);  // the mask reads neither b nor h
    CHECK(r.lo == (rb % 2) * 4);
    CHECK(r.hi == (rb % 2 == 0 ? 12u : 16u));
    for (std::size_t t = 0; r.lo + t * 4 < r.hi; ++t) {
      const std::size_t kb = (r.lo + t * 4) / 4;
      CHECK(m.state(r, t) == (kb % 2 == rb % 2 ? BlockState::full : BlockState::empty));
    }
  }
  CHECK(m.count(BlockState::empty) == 4);
  CHECK(m.count(BlockState::full) == 8);
  CHECK(m.density() == doctest::Approx(0.5));
  // The fused path over it equals the reference path, which evaluates every position.
  const Inputs in = make_inputs(3, 2, 2, T, T, 4, 3, 227);
  SdpaOptions fused = test::with_path({}, SdpaPath::fused);
  fused.block_mask = std::make_shared<const attention::BlockMask>(m);
  SdpaOptions reference = test::with_path({}, SdpaPath::reference);
  reference.mask_program = strided;
  Tensor4<double> out_f, out_r;
  const auto gf = forward_backward(in.q, in.k, in.v, in.r, fused, out_f);
  const auto gr = forward_backward(in.q, in.k, in.v, in.r, reference, out_r);
  CHECK(test::rel_error(out_f, out_r) < 1e-13);
  CHECK(test::rel_error(gf.dq, gr.dq) < 1e-13);
  CHECK(test::rel_error(gf.dk, gr.dk) < 1e-13);
  // Causal documents: a row block inside a document starts at the document's first key.
  const auto doc = attention::document_mask({0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1}, T);
  const attention::BlockMask dm = attention::build_block_mask(doc, sizes, 4, 4);
  CHECK(dm.row_block(0, 0, 2).lo == 6);  // rows 8..11: keys 6..11
  CHECK(dm.row_block(0, 0, 2).hi == 12);
  CHECK(dm.row_block(0, 0, 1).lo == 0);  // rows 4..7 straddle the boundary
  CHECK(dm.row_block(0, 0, 1).hi == 8);
  CHECK(dm.density() < 0.5);
}

TEST_CASE("attention programs: a block mask is built in parallel, the same at any thread count") {
  // A per-batch, per-head mask over 3·2 slices of 5 row blocks: 30 parts built by the threads, then
  // joined in order. Every row block's range and every tile's state match a one-thread build.
  const std::size_t T = 37;
  const auto mask =
      attention::mask_program([](std::size_t b, std::size_t h, std::size_t i,
                                 std::size_t j) { return j <= i && (i - j) % (2 + b + h) != 1; },
                              "odd window", {true, true});
  AttentionSizes sizes;
  sizes.B = 3, sizes.H = 2, sizes.Tq = sizes.Tk = T;
  const auto build = [&](int threads) {
    const ThreadScope scope(threads);
    return attention::build_block_mask(mask, sizes, 8, 4);
  };
  const attention::BlockMask one = build(1), two = build(2);
  CHECK(one.density() == two.density());
  bool same = true;
  for (std::size_t b = 0; b < 3; ++b) {
    for (std::size_t h = 0; h < 2; ++h) {
      for (std::size_t rb = 0; rb < 5; ++rb) {
        const auto &r1 = one.row_block(b, h, rb), &r2 = two.row_block(b, h, rb);
        same = same && r1.lo == r2.lo && r1.hi == r2.hi && r1.first_tile == r2.first_tile;
        for (std::size_t t = 0; r1.lo + t * 4 < r1.hi; ++t) {
          same = same && one.state(r1, t) == two.state(r2, t);
        }
      }
    }
  }
  CHECK(same);
  CHECK(one.count(BlockState::partial) > 0);
  // A mask that throws on one thread: the build rethrows it on the caller's.
  const auto throwing = attention::mask_program(
      [](std::size_t, std::size_t, std::size_t i, std::size_t) -> bool {
        if (i == 30) throw std::runtime_error("mask failed at row 30");
        return true;
      },
      "throwing", {false, false});
  const ThreadScope scope(2);
  CHECK_THROWS_WITH_AS(attention::build_block_mask(throwing, sizes, 8, 4), "mask failed at row 30",
                       std::runtime_error);
}

TEST_CASE("attention programs: the built-in variants as programs give the same bits") {
  // float, both CPU paths, the default tiles and tiny ones: causal with an offset, the window, the
  // key mask (mask programs), the softcap, ALiBi and the bias (score programs); outputs and
  // gradients bit for bit, and the bias's and ALiBi's parameter gradients against the built-in's.
  const std::size_t B = 2, H = 2, Tq = 37, Tk = 41, D = 8, Dv = 8;
  Rng rng(229);
  const auto q = randn<float, 4>({B, H, Tq, D}, rng);
  const auto k = randn<float, 4>({B, H, Tk, D}, rng);
  const auto v = randn<float, 4>({B, H, Tk, Dv}, rng);
  const auto dout = randn<float, 4>({B, H, Tq, Dv}, rng);
  const auto bias = randn<float, 4>({1, H, Tq, Tk}, rng);
  KeyMask key_mask = xt::ones<bool>({B, Tk});
  key_mask(0, 5) = key_mask(1, 17) = key_mask(1, 40) = false;
  std::vector<unsigned char> mask_bytes(B * Tk);
  for (std::size_t e = 0; e < B * Tk; ++e) mask_bytes[e] = key_mask.data()[e] ? 1 : 0;
  AttentionSizes sizes;
  sizes.B = B, sizes.H = H, sizes.Tq = Tq, sizes.Tk = Tk;
  for (SdpaPath path : kCpuPaths) {
    for (std::size_t tiles : {std::size_t{0}, std::size_t{5}}) {
      CAPTURE(path);
      CAPTURE(tiles);
      SdpaOptions base;
      base.path = path;
      base.tile_rows = tiles, base.tile_keys = tiles == 0 ? 0 : 7;
      const auto with_mask = [&](SdpaOptions o, std::shared_ptr<const attention::MaskProgram> m) {
        o.mask_program = m;
        if (path == SdpaPath::fused) {
          o.block_mask = std::make_shared<const attention::BlockMask>(
              attention::build_block_mask(m, sizes, o.tile_rows, o.tile_keys));
        }
        return o;
      };
      struct Pair {
        const char* name;
        SdpaOptions builtin, program;
        bool key_mask, bias;
      };
      std::vector<Pair> pairs;
      SdpaOptions causal = base;
      causal.causal = true, causal.query_offset = 4;
      pairs.push_back({"causal", causal, with_mask(base, attention::causal_mask(4)), false, false});
      SdpaOptions window = causal;
      window.window = 9;
      pairs.push_back(
          {"window", window, with_mask(base, attention::sliding_window_mask(9, 4)), false, false});
      pairs.push_back({"key mask", base,
                       with_mask(base, attention::key_padding_mask(mask_bytes, Tk)), true, false});
      SdpaOptions cap = causal;
      cap.softcap = 2.5;
      SdpaOptions cap_program = causal;
      cap_program.score_program = attention::softcap_program(2.5);
      pairs.push_back({"softcap", cap, cap_program, false, false});
      SdpaOptions alibi = causal;
      alibi.alibi_slopes = {0.5, 0.125};
      SdpaOptions alibi_program = causal;
      alibi_program.score_program = attention::alibi_program(4);
      alibi_program.program_params = {{0.5, 0.125}};
      pairs.push_back({"alibi", alibi, alibi_program, false, false});
      SdpaOptions bias_program = base;
      bias_program.score_program = attention::bias_program(H, Tq, Tk, false, true);
      bias_program.program_params = {std::vector<double>(bias.begin(), bias.end())};
      pairs.push_back({"bias", base, bias_program, false, true});
      for (const Pair& pair : pairs) {
        const std::string pair_name = pair.name;
        CAPTURE(pair_name);
        Tensor4<float> out_b, out_p;
        const auto gb =
            forward_backward(q, k, v, dout, pair.builtin, out_b,
                             pair.key_mask ? &key_mask : nullptr, pair.bias ? &bias : nullptr);
        const auto gp = forward_backward(q, k, v, dout, pair.program, out_p);
        CHECK(same_bits(out_b, out_p));
        CHECK(same_bits(gb.dq, gp.dq));
        CHECK(same_bits(gb.dk, gp.dk));
        CHECK(same_bits(gb.dv, gp.dv));
        if (pair.bias) {
          REQUIRE(gp.dprogram.size() == 1);
          CHECK(same_bits(gb.dbias, gp.dprogram[0]));
        }
      }
    }
  }
  // The softcap program gives its own value and slope (the built-in's formula), and that slope is
  // the dual numbers' derivative.
  static_assert(attention::program_detail::OwnSlope<attention::programs::Softcap, float>::value);
  const auto cap = attention::ScoreFunction<attention::programs::Softcap>({2.5}, "softcap");
  AttentionSizes one;
  one.B = one.H = one.Tq = one.Tk = 1;
  CHECK(attention::check_program_slope(cap, {-40.0, -3.0, -0.1, 0.0, 0.7, 5.0, 90.0}, one) < 1e-15);
}

TEST_CASE("attention programs: the backward is the same bits at any thread count and run") {
  const std::size_t B = 3, H = 4, Hkv = 2, T = 29, D = 8, R = 4;
  Rng rng(233);
  const auto q = randn<float, 4>({B, H, T, D}, rng);
  const auto k = randn<float, 4>({B, Hkv, T, D}, rng);
  const auto v = randn<float, 4>({B, Hkv, T, D}, rng);
  const auto dout = randn<float, 4>({B, H, T, D}, rng);
  for (SdpaPath path : kCpuPaths) {
    CAPTURE(path);
    SdpaOptions options;
    options.path = path;
    options.tile_rows = 8, options.tile_keys = 8;
    options.score_program = attention::score_program(CappedRelativeBias{R}, "capped relative");
    options.program_params = {random_values(H * (2 * R + 1), 13, 0.5),
                              random_values(H, 17, 0.3, 2.0)};
    options.mask_program = attention::document_mask(
        {0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1, 1, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 3, 3, 3, 3}, T);
    std::vector<SdpaGrads<float>> runs;
    for (int threads : {1, 2, 2}) {
      const ThreadScope scope(threads);
      Tensor4<float> out;
      runs.push_back(forward_backward(q, k, v, dout, options, out));
    }
    for (std::size_t r = 1; r < runs.size(); ++r) {
      CHECK(same_bits(runs[0].dq, runs[r].dq));
      CHECK(same_bits(runs[0].dk, runs[r].dk));
      for (std::size_t p = 0; p < 2; ++p)
        CHECK(same_bits(runs[0].dprogram[p], runs[r].dprogram[p]));
    }
  }
}

TEST_CASE("attention programs: bad programs and bad combinations give clear errors") {
  const Inputs in = make_inputs(1, 2, 2, 4, 5, 3, 2, 239);
  SdpaCache<double> cache;
  for (SdpaPath path : kCpuPaths) {
    CAPTURE(path);
    SdpaOptions options = test::with_path({}, path);
    // A program that returns NaN at a visible key: the program, the position and the input.
    options.score_program = attention::score_program(
        [](auto u, std::size_t, std::size_t h, std::size_t i, std::size_t j) {
          return h == 1 && i == 2 && j == 3 ? u * std::numeric_limits<double>::quiet_NaN() : u;
        },
        "nan at one key");
    CHECK_THROWS_WITH_AS(sdpa_forward(cache, in.q, in.k, in.v, options),
                         doctest::Contains("score program 'nan at one key' returned nan at (b, h, "
                                           "i, j) = (0, 1, 2, 3)"),
                         std::invalid_argument);
    // Returning -inf hides the key instead, as a bias of -inf does.
    options.score_program = attention::score_program(
        [](auto u, std::size_t, std::size_t, std::size_t, std::size_t j) {
          return j == 0 ? u - std::numeric_limits<double>::infinity() : u;
        },
        "hide key 0");
    const Tensor4<double> out = sdpa_forward(cache, in.q, in.k, in.v, options);
    CHECK(test::all_finite(out));
    // A parameter index out of range.
    options.score_program = attention::relative_bias_program(3);
    options.program_params = {std::vector<double>(5, 0.1)};  // needs H · 7 = 14
    CHECK_THROWS_WITH_AS(sdpa_forward(cache, in.q, in.k, in.v, options),
                         doctest::Contains("expected an index below 5"), std::invalid_argument);
    // Non-finite parameter values.
    options.program_params = {std::vector<double>(14, std::nan(""))};
    CHECK_THROWS_WITH_AS(sdpa_forward(cache, in.q, in.k, in.v, options),
                         doctest::Contains("program_params[0] expected finite values"),
                         std::invalid_argument);
    // A score program beside the built-in softcap; a mask program beside causal.
    options.program_params = {std::vector<double>(14, 0.1)};
    options.softcap = 3;
    CHECK_THROWS_WITH_AS(sdpa_forward(cache, in.q, in.k, in.v, options),
                         doctest::Contains("score_program expected no softcap"),
                         std::invalid_argument);
    SdpaOptions masked = test::with_path({}, path);
    masked.mask_program = attention::prefix_lm_mask(2);
    masked.causal = true;
    CHECK_THROWS_WITH_AS(sdpa_forward(cache, in.q, in.k, in.v, masked),
                         doctest::Contains("mask_program expected no causal or window"),
                         std::invalid_argument);
    // A block mask built for another shape.
    masked.causal = false;
    AttentionSizes other;
    other.B = 1, other.H = 2, other.Tq = 4, other.Tk = 6;
    masked.block_mask = std::make_shared<const attention::BlockMask>(
        attention::build_block_mask(masked.mask_program, other, 2, 3));
    CHECK_THROWS_WITH_AS(sdpa_forward(cache, in.q, in.k, in.v, masked),
                         doctest::Contains("block_mask expected one built for the call's B = 1, "
                                           "H = 2, Tq = 4, Tk = 5"),
                         std::invalid_argument);
    // A mask that hides every key of a query: that row is 0 with zero gradients, never NaN.
    SdpaOptions empty_row = test::with_path({}, path);
    empty_row.mask_program = attention::mask_program(
        [](std::size_t, std::size_t, std::size_t i, std::size_t) { return i != 1; }, "no row 1",
        {false, false});
    Tensor4<double> o;
    const auto g = forward_backward(in.q, in.k, in.v, in.r, empty_row, o);
    CHECK(test::all_finite(o));
    CHECK(test::all_finite(g.dq));
    for (std::size_t c = 0; c < 2; ++c) CHECK(o(0, 0, 1, c) == 0.0);
  }
  // The raw device calls refuse programs instead of ignoring them, and so does the CUDA op
  // without the program's GPU launchers (SdpaOptions::device_program).
  SdpaOptions options;
  options.score_program = attention::softcap_program(2);
  SdpaCache<double> c;
  CHECK_THROWS_WITH_AS(sdpa_forward_cuda(c, in.q, in.k, in.v, options),
                       doctest::Contains("sdpa_forward_cuda: device_program expected"),
                       std::invalid_argument);
  AttentionParams<double> p;
  p.B = p.H = p.Hkv = p.Tq = p.Tk = p.D = p.Dv = 1;
  p.score_program = options.score_program.get();
  CHECK_THROWS_WITH_AS(check_attention_params(p, "raw"), doctest::Contains("raw device call"),
                       std::invalid_argument);
}

TEST_CASE("golden: attention programs match PyTorch's FlexAttention on both CPU paths") {
  // tests/golden/make_goldens.py flex.json: FlexAttention's forward (score_mod, mask_mod through
  // create_block_mask), gradients by autograd of the same programs written densely, float64.
  const auto& file = test::golden_file("flex.json");
  REQUIRE(file.at("cases").size() >= 3);
  for (const auto& c : file.at("cases")) {
    const std::string name = c.at("name");
    CAPTURE(name);
    const auto& config = c.at("config");
    const std::string score = config.at("score"), mask = config.at("mask");
    const auto radius = config.at("radius").get<std::size_t>();
    const Tensor4<double> q = test::golden_tensor(c, "q"), k = test::golden_tensor(c, "k"),
                          v = test::golden_tensor(c, "v"), r = test::golden_tensor(c, "r");
    const std::size_t T = q.shape()[2];
    for (SdpaPath path : kCpuPaths) {
      CAPTURE(path);
      SdpaOptions options = test::with_path({}, path);
      if (score == "capped_relative") {
        options.score_program = attention::score_program(CappedRelativeBias{radius}, score);
      } else if (score == "relative") {
        options.score_program = attention::relative_bias_program(radius);
      } else if (score == "alibi") {
        options.score_program = attention::alibi_program();
      }
      for (std::size_t p = 0; p < config.at("params").get<std::size_t>(); ++p) {
        const xt::xarray<double> values = test::golden_tensor(c, "param" + std::to_string(p));
        options.program_params.emplace_back(values.begin(), values.end());
      }
      if (mask == "document") {
        options.mask_program =
            attention::document_mask(config.at("documents").get<std::vector<std::int32_t>>(), T);
      } else if (mask == "prefix_lm") {
        options.mask_program = attention::prefix_lm_mask(config.at("prefix").get<std::size_t>());
      }
      Tensor4<double> out;
      const auto g = forward_backward(q, k, v, r, options, out);
      CHECK(test::rel_error(out, test::golden_tensor(c, "out")) < 1e-12);
      CHECK(test::rel_error(g.dq, test::golden_tensor(c, "dq")) < 1e-12);
      CHECK(test::rel_error(g.dk, test::golden_tensor(c, "dk")) < 1e-12);
      CHECK(test::rel_error(g.dv, test::golden_tensor(c, "dv")) < 1e-12);
      REQUIRE(g.dprogram.size() == options.program_params.size());
      for (std::size_t p = 0; p < g.dprogram.size(); ++p) {
        CHECK(test::rel_error(g.dprogram[p], test::golden_tensor(c, "dparam" + std::to_string(p))) <
              1e-12);
      }
    }
  }
}
