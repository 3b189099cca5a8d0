// Muon (attnlab/optim/muon.hpp): trajectories against a PyTorch reference of the published
// algorithm (tests/golden/make_goldens.py, muon.json), the orthogonalisation property (each
// singular value of the normalised update goes through the quintic five times, into its band),
// the update scales, state save and restore, float against double, the emulated device against the
// CPU, and bad input.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>
#include <xtensor/xarray.hpp>

#include "attnlab/backends/emulated.hpp"
#include "attnlab/nn/transformer.hpp"
#include "attnlab/optim/muon.hpp"
#include "attnlab/random.hpp"
#include "helpers.hpp"

using namespace attnlab;
using attnlab::test::golden_file;
using attnlab::test::golden_tensor;
using attnlab::test::rel_error;

namespace {

template <class T>
xt::xarray<T> step_slice(const xt::xarray<double>& stacked, std::size_t step) {
  std::vector<std::size_t> shape(stacked.shape().begin() + 1, stacked.shape().end());
  xt::xarray<T> out(shape);
  const std::size_t n = out.size();
  std::transform(stacked.data() + step * n, stacked.data() + (step + 1) * n, out.begin(),
                 [](double x) { return static_cast<T>(x); });
  return out;
}

template <class T>
xt::xarray<T> cast(const xt::xarray<double>& x) {
  xt::xarray<T> out(x.shape());
  std::transform(x.begin(), x.end(), out.begin(), [](double v) { return static_cast<T>(v); });
  return out;
}

MuonOptions options_of(const nlohmann::json& config, double lr) {
  MuonOptions o;
  o.lr = lr;
  o.momentum = config.at("momentum");
  o.nesterov = config.at("nesterov");
  o.ns_steps = config.at("ns_steps");
  o.weight_decay = config.at("weight_decay");
  o.scale = parse_muon_scale(config.at("scale").get<std::string>());
  o.decay = parse_weight_decay_mode(config.at("decay").get<std::string>());
  return o;
}

template <class T>
void check_muon_goldens(double tol) {
  const auto& file = golden_file("muon.json");
  REQUIRE(file.at("cases").size() == 4);
  for (const auto& c : file.at("cases")) {
    const std::string name = c.at("name");
    CAPTURE(name);
    const std::size_t steps = c.at("config").at("steps");
    const auto lrs = golden_tensor(c, "lrs");
    std::vector<Parameter<T>> ps(3);
    ParameterList<T> params;
    for (std::size_t i = 0; i < ps.size(); ++i) {
      ps[i].value = cast<T>(golden_tensor(c, "p" + std::to_string(i) + "_init"));
      ps[i].grad = xt::zeros<T>(ps[i].value.shape());
      params.push_back({"p" + std::to_string(i), &ps[i]});
    }
    Muon<T> opt(params, options_of(c.at("config"), lrs(0)));
    for (std::size_t t = 0; t < steps; ++t) {
      CAPTURE(t);
      opt.set_lr(lrs(t));
      for (std::size_t i = 0; i < ps.size(); ++i)
        ps[i].grad = step_slice<T>(golden_tensor(c, "p" + std::to_string(i) + "_grads"), t);
      opt.step();
      for (std::size_t i = 0; i < ps.size(); ++i) {
        CAPTURE(i);
        const auto want =
            step_slice<double>(golden_tensor(c, "p" + std::to_string(i) + "_traj"), t);
        CHECK(rel_error(ps[i].value, want) < tol);
      }
    }
  }
}

// Eigenvalues of a symmetric matrix by cyclic Jacobi rotations (independent of BLAS and of Muon).
std::vector<double> symmetric_eigenvalues(std::vector<double> a, std::size_t n) {
  for (int sweep = 0; sweep < 100; ++sweep) {
    double off = 0;
    for (std::size_t p = 0; p < n; ++p)
      for (std::size_t q = p + 1; q < n; ++q) off += a[p * n + q] * a[p * n + q];
    if (off < 1e-30) break;
    for (std::size_t p = 0; p < n; ++p) {
      for (std::size_t q = p + 1; q < n; ++q) {
        if (a[p * n + q] == 0) continue;
        const double theta = (a[q * n + q] - a[p * n + p]) / (2 * a[p * n + q]);
        const double t =
            (theta >= 0 ? 1.0 : -1.0) / (std::abs(theta) + std::sqrt(theta * theta + 1));
        const double cs = 1 / std::sqrt(t * t + 1), sn = t * cs;
        for (std::size_t k = 0; k < n; ++k) {  // A ← A J
          const double akp = a[k * n + p], akq = a[k * n + q];
          a[k * n + p] = cs * akp - sn * akq;
          a[k * n + q] = sn * akp + cs * akq;
        }
        for (std::size_t k = 0; k < n; ++k) {  // A ← Jᵀ A
          const double apk = a[p * n + k], aqk = a[q * n + k];
          a[p * n + k] = cs * apk - sn * aqk;
          a[q * n + k] = sn * apk + cs * aqk;
        }
      }
    }
  }
  std::vector<double> out(n);
  for (std::size_t i = 0; i < n; ++i) out[i] = a[i * n + i];
  std::sort(out.begin(), out.end());
  return out;
}

// Singular values (ascending) of an (r, c) matrix: the roots of the eigenvalues of the smaller
// Gram matrix.
std::vector<double> singular_values(const xt::xarray<double>& x) {
  const std::size_t r = x.shape()[0], c = x.shape()[1], s = std::min(r, c);
  std::vector<double> gram(s * s, 0.0);
  for (std::size_t i = 0; i < s; ++i)
    for (std::size_t j = 0; j < s; ++j)
      for (std::size_t k = 0; k < std::max(r, c); ++k)
        gram[i * s + j] += r <= c ? x(i, k) * x(j, k) : x(k, i) * x(k, j);
  std::vector<double> out = symmetric_eigenvalues(gram, s);
  for (double& v : out) v = std::sqrt(std::max(v, 0.0));
  return out;
}

// A random (r, c) matrix with orthonormal columns (c <= r) or rows, by Gram–Schmidt.
xt::xarray<double> random_orthonormal(std::size_t r, std::size_t c, Rng& rng) {
  const bool cols = c <= r;
  const std::size_t count = cols ? c : r, len = cols ? r : c;
  std::vector<std::vector<double>> v(count, std::vector<double>(len));
  for (std::size_t i = 0; i < count; ++i) {
    for (double& e : v[i]) e = rng.normal();
    for (int twice = 0; twice < 2; ++twice) {
      for (std::size_t j = 0; j < i; ++j) {
        double d = 0;
        for (std::size_t k = 0; k < len; ++k) d += v[i][k] * v[j][k];
        for (std::size_t k = 0; k < len; ++k) v[i][k] -= d * v[j][k];
      }
    }
    double norm = 0;
    for (double e : v[i]) norm += e * e;
    for (double& e : v[i]) e /= std::sqrt(norm);
  }
  xt::xarray<double> out = xt::zeros<double>({r, c});
  for (std::size_t i = 0; i < count; ++i)
    for (std::size_t k = 0; k < len; ++k) (cols ? out(k, i) : out(i, k)) = v[i][k];
  return out;
}

// U diag(sigma) Vᵀ for (r, c), sigma of length min(r, c).
xt::xarray<double> with_singular_values(std::size_t r, std::size_t c,
                                        const std::vector<double>& sigma, Rng& rng) {
  const std::size_t s = std::min(r, c);
  const xt::xarray<double> u = random_orthonormal(r, s, rng), v = random_orthonormal(c, s, rng);
  xt::xarray<double> out = xt::zeros<double>({r, c});
  for (std::size_t i = 0; i < r; ++i)
    for (std::size_t j = 0; j < c; ++j)
      for (std::size_t k = 0; k < s; ++k) out(i, j) += u(i, k) * sigma[k] * v(j, k);
  return out;
}

// The update X of one Muon step on a zero weight with grad g (momentum 0, so U = G; no decay):
// W = −lr · scale · X, so X = −W / scale with lr 1.
template <class T>
xt::xarray<double> one_update(const xt::xarray<double>& g) {
  Parameter<T> p(xt::zeros<T>(g.shape()), cast<T>(g));
  MuonOptions o;
  o.lr = 1;
  o.momentum = 0;
  Muon<T> opt({{"w", &p}}, o);
  opt.step();
  const double scale = muon_update_scale(o.scale, g.shape()[0], g.shape()[1]);
  xt::xarray<double> x(g.shape());
  std::transform(p.value.begin(), p.value.end(), x.begin(),
                 [&](T w) { return -static_cast<double>(w) / scale; });
  return x;
}

}  // namespace

TEST_CASE("Muon matches a PyTorch reference of the published algorithm, double and float") {
  check_muon_goldens<double>(1e-11);
  check_muon_goldens<float>(2e-5);
}

TEST_CASE("the quintic band: five steps send every x from 1.6e-3 to 1 between 0.68 and 1.21") {
  const std::array<double, 3> k{3.4445, -4.7750, 2.0315};
  double lo = 10, hi = 0;
  for (int i = 0; i <= 200000; ++i) {
    const double x = 1.6e-3 + (1 - 1.6e-3) * i / 200000.0;
    const double y = muon_singular_value_map(x, k, 5);
    lo = std::min(lo, y);
    hi = std::max(hi, y);
  }
  CHECK(lo >= 0.68);
  CHECK(hi <= 1.21);
  CHECK(lo < 0.7);  // the band is tight: it is where the values go, not a loose bound
  CHECK(hi > 1.19);
  // Below the band's foot a singular value is amplified about a⁵ ≈ 485 times, not yet to the band.
  CHECK(muon_singular_value_map(1e-6, k, 5) ==
        doctest::Approx(std::pow(3.4445, 5) * 1e-6).epsilon(1e-4));
}

TEST_CASE("Muon orthogonalises: singular values of the update follow the quintic into its band") {
  Rng rng(41);
  const std::array<double, 3> k{3.4445, -4.7750, 2.0315};
  SUBCASE("random Gaussian matrices, wide, tall and square") {
    for (const auto& [r, c] : std::vector<std::pair<std::size_t, std::size_t>>{
             {16, 40}, {40, 16}, {24, 24}, {1, 9}, {9, 1}}) {
      CAPTURE(r);
      CAPTURE(c);
      xt::xarray<double> g(std::vector<std::size_t>{r, c});
      for (auto& e : g) e = rng.normal();
      const std::vector<double> sg = singular_values(g);
      double frob = 0;
      for (double e : g) frob += e * e;
      frob = std::sqrt(frob);
      // φ⁵ is not monotone (it overshoots 1 and comes back), so compare the sorted images.
      std::vector<double> want;
      for (double s : sg) want.push_back(muon_singular_value_map(s / (frob + 1e-7), k, 5));
      std::sort(want.begin(), want.end());
      const std::vector<double> sx = singular_values(one_update<double>(g));
      REQUIRE(sx.size() == want.size());
      for (std::size_t i = 0; i < sx.size(); ++i) {
        CAPTURE(i);
        CHECK(sx[i] == doctest::Approx(want[i]).epsilon(1e-9));
        if (r > 1 && c > 1 && std::min(r, c) < std::max(r, c)) {
          CHECK(sx[i] >= 0.68);  // well-conditioned: every singular value lands in the band
          CHECK(sx[i] <= 1.21);
        }
      }
      // The float run follows the same map.
      const std::vector<double> sf = singular_values(one_update<float>(g));
      for (std::size_t i = 0; i < sf.size(); ++i)
        CHECK(sf[i] == doctest::Approx(sx[i]).epsilon(1e-4));
    }
  }
  SUBCASE("ill-conditioned: singular values from 1 down to 1e-7") {
    for (const auto& [r, c] :
         std::vector<std::pair<std::size_t, std::size_t>>{{12, 30}, {30, 12}}) {
      std::vector<double> sigma(12);
      for (std::size_t i = 0; i < sigma.size(); ++i) sigma[i] = std::pow(10.0, -7.0 * i / 11.0);
      const xt::xarray<double> g = with_singular_values(r, c, sigma, rng);
      double frob = 0;
      for (double s : sigma) frob += s * s;
      frob = std::sqrt(frob);
      std::vector<double> want;
      for (double s : sigma) want.push_back(muon_singular_value_map(s / (frob + 1e-7), k, 5));
      std::sort(want.begin(), want.end());
      const std::vector<double> sx = singular_values(one_update<double>(g));
      std::size_t in_band = 0;
      for (std::size_t i = 0; i < sx.size(); ++i) {
        CAPTURE(i);
        CHECK(sx[i] == doctest::Approx(want[i]).epsilon(1e-7).scale(1e-12));
        if (sx[i] >= 0.68 && sx[i] <= 1.21) ++in_band;
      }
      // σ/‖σ‖ >= 1.6e-3 for the first 4 of 12 (1, 0.23, 0.053, 0.012, then 2.8e-3 and below):
      // exactly those whose σ/‖G‖ is at or above the band's foot reach the band.
      std::size_t above_foot = 0;
      for (double s : sigma) above_foot += s / frob >= 1.6e-3;
      CHECK(in_band == above_foot);
      CHECK(above_foot > 2);
      CHECK(above_foot < sigma.size());
    }
  }
}

TEST_CASE("Muon's update scale rules") {
  // spectral: √max(1, fan_out / fan_in); attnlab stores (In, Out), so (64, 256) is 2.
  CHECK(muon_update_scale(MuonScale::spectral, 64, 256) == doctest::Approx(2.0));
  CHECK(muon_update_scale(MuonScale::spectral, 256, 64) == 1.0);
  CHECK(muon_update_scale(MuonScale::spectral, 64, 64) == 1.0);
  // rms: 0.2 √max(fan_in, fan_out), Moonshot's.
  CHECK(muon_update_scale(MuonScale::rms, 64, 256) == doctest::Approx(3.2));
  CHECK(muon_update_scale(MuonScale::rms, 256, 64) == doctest::Approx(3.2));
  CHECK(parse_muon_scale("rms") == MuonScale::rms);
  CHECK(to_string(MuonScale::spectral) == "spectral");
}

namespace {
template <class T>
struct MuonRun {
  std::vector<Parameter<T>> ps;
  ParameterList<T> params;
  explicit MuonRun(std::uint64_t seed) : ps(2) {
    Rng rng(seed);
    ps[0].value = randn<T, 2>({6, 10}, rng);
    ps[1].value = randn<T, 2>({9, 4}, rng);
    for (auto& p : ps) p.grad = xt::zeros<T>(p.value.shape());
    params = {{"a.w", &ps[0]}, {"b.w", &ps[1]}};
  }
  void grads(std::size_t step) {
    for (std::size_t i = 0; i < ps.size(); ++i) {
      std::size_t e = 0;
      for (auto& g : ps[i].grad)
        g = static_cast<T>(std::sin(0.7 * static_cast<double>(step) + 1.3 * static_cast<double>(i) +
                                    0.37 * static_cast<double>(e++)));
    }
  }
};

MuonOptions test_options() {
  MuonOptions o;
  o.lr = 0.02;
  o.weight_decay = 0.1;
  return o;
}
}  // namespace

TEST_CASE("Muon's momentum state restores bit-identically") {
  MuonRun<float> full(3), first(3);
  Muon<float> a(full.params, test_options()), b(first.params, test_options());
  for (std::size_t s = 0; s < 3; ++s) {
    full.grads(s);
    a.step();
    first.grads(s);
    b.step();
  }
  const auto state = b.state_tensors();
  REQUIRE(state.size() == 2);
  CHECK(state[0].first == "optim.a.w.momentum");
  MuonRun<float> resumed(99);
  for (std::size_t i = 0; i < 2; ++i) resumed.ps[i].value = first.ps[i].value;
  Muon<float> c(resumed.params, test_options());
  c.load_state(state, b.step_count());
  CHECK(c.step_count() == 3);
  for (std::size_t s = 3; s < 6; ++s) {
    full.grads(s);
    a.step();
    resumed.grads(s);
    c.step();
  }
  for (std::size_t i = 0; i < 2; ++i) CHECK(resumed.ps[i].value == full.ps[i].value);
}

TEST_CASE("Muon in float follows Muon in double") {
  MuonRun<float> f(7);
  MuonRun<double> d(7);
  std::vector<xt::xarray<double>> start;
  for (std::size_t i = 0; i < 2; ++i) {  // the same starting values, the float ones
    std::transform(f.ps[i].value.begin(), f.ps[i].value.end(), d.ps[i].value.begin(),
                   [](float v) { return static_cast<double>(v); });
    start.push_back(d.ps[i].value);
  }
  Muon<float> of(f.params, test_options());
  Muon<double> od(d.params, test_options());
  for (std::size_t s = 0; s < 20; ++s) {
    f.grads(s);
    d.grads(s);
    of.step();
    od.step();
  }
  for (std::size_t i = 0; i < 2; ++i) {
    CHECK(rel_error(f.ps[i].value, d.ps[i].value) < 1e-5);
    CHECK(rel_error(d.ps[i].value, start[i]) > 1e-2);  // and the weights did move
  }
}

TEST_CASE("Muon on the emulated device equals the CPU, the hidden matrices of a Transformer") {
  TransformerConfig cfg;
  cfg.vocab_sizes = {5};
  cfg.out_vocab = 4;
  cfg.max_len = 4;
  cfg.layers = 2;
  cfg.block.attention.d_model = 8;
  cfg.block.attention.heads = 2;
  cfg.block.d_ff = 12;
  const auto device = emulated::make_device_ops<double>();
  std::vector<xt::xarray<double>> results[2];
  for (int on_device = 0; on_device < 2; ++on_device) {
    Rng rng(5);
    Transformer<double> model(cfg, rng);
    if (on_device) model.to(*device);
    ParameterList<double> hidden;
    for (const auto& np : model.parameters()) {
      if (np.param->value.dimension() == 2 && np.name.rfind("blocks.", 0) == 0)
        hidden.push_back(np);
    }
    REQUIRE(hidden.size() == 2 * 6);
    Muon<double> opt(hidden, test_options());
    Rng grads(6);
    for (int step = 0; step < 4; ++step) {
      for (const auto& p : hidden) {
        for (auto& g : p.param->grad) g = grads.normal();
        if (on_device)
          device->upload(p.param->device_grad.data(), p.param->grad.data(),
                         p.param->size() * sizeof(double));
      }
      opt.step();
    }
    model.copy_to_host();
    for (const auto& p : hidden) results[on_device].push_back(p.param->value);
  }
  for (std::size_t i = 0; i < results[0].size(); ++i)
    CHECK(rel_error(results[0][i], results[1][i]) < 1e-12);
}

TEST_CASE("Muon refuses bad options and parameters that are not matrices, naming them") {
  Parameter<double> m(xt::zeros<double>({3, 4}), xt::zeros<double>({3, 4}));
  Parameter<double> v(xt::zeros<double>({4}), xt::zeros<double>({4}));
  const auto bad = [&](auto mutate, const char* field) {
    MuonOptions o;
    mutate(o);
    CAPTURE(field);
    CHECK_THROWS_WITH_AS(Muon<double>({{"m", &m}}, o), doctest::Contains(field),
                         std::invalid_argument);
  };
  bad([](MuonOptions& o) { o.momentum = -0.1; }, "momentum");
  bad([](MuonOptions& o) { o.momentum = 1; }, "momentum");
  bad([](MuonOptions& o) { o.ns_steps = 0; }, "ns_steps");
  bad([](MuonOptions& o) { o.lr = -1; }, "lr");
  bad([](MuonOptions& o) { o.weight_decay = std::nan(""); }, "weight_decay");
  bad([](MuonOptions& o) { o.eps = 0; }, "eps");
  CHECK_THROWS_WITH_AS(Muon<double>({{"m", &m}, {"ln.gamma", &v}}, MuonOptions{}),
                       doctest::Contains("'ln.gamma'"), std::invalid_argument);
  CHECK_THROWS_WITH_AS(parse_muon_scale("spectal"), doctest::Contains("spectral|rms"),
                       std::invalid_argument);
}
