// One model, two backends: the Transformer and the optimizers moved to a device (Module::to)
// against the same Transformer and optimizers on the CPU. Only the backend differs; the model code
// is one.
//
// On every machine they run on the emulated device (attnlab/backends/emulated.hpp: the CUDA kernel
// sources on the CPU, BLAS for the GEMMs), which checks the device path (buffers, the parameter
// arena, gradient routing) and the kernels' arithmetic, and on a separate CPU backend instance
// (attnlab/backends/cpu.hpp: the CPU ops), one body over both (device_backends.hpp); on a machine
// with a GPU the same checks run once more on the CUDA backend, and are reported as skipped
// elsewhere.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <stdexcept>
#include <string>
#include <vector>

#include <xtensor/xmath.hpp>

#include "attnlab/backends/emulated.hpp"
#include "attnlab/distributed.hpp"
#include "attnlab/gradcheck.hpp"
#include "attnlab/nn/cross_entropy.hpp"
#include "attnlab/nn/transformer.hpp"
#include "attnlab/ops/cross_entropy.hpp"
#include "attnlab/optim/adamw.hpp"
#include "attnlab/optim/clip.hpp"
#include "attnlab/optim/sgd.hpp"
#include "attnlab/random.hpp"
#include "cuda_helpers.hpp"
#include "device_backends.hpp"
#include "helpers.hpp"

using namespace attnlab;

namespace {

using test::rel_error;

TransformerConfig small_config() {
  return test::transformer_config(7, 9, 8, 2, 12, 2, 5);
}

// Ids in [0, vocab) with a few absent tokens (kNoToken) and targets with ignored positions.
TokenIds random_ids(std::size_t B, std::size_t T, std::size_t vocab, Rng& rng, bool absent) {
  TokenIds ids = TokenIds::from_shape({B, T});
  for (std::size_t i = 0; i < ids.size(); ++i) {
    ids.data()[i] = static_cast<int>(rng.below(vocab));
    if (absent && rng.below(6) == 0) ids.data()[i] = kNoToken;
  }
  return ids;
}

TokenIds random_targets(std::size_t B, std::size_t T, std::size_t V, Rng& rng) {
  TokenIds t = random_ids(B, T, V, rng, false);
  for (std::size_t i = 0; i < t.size(); ++i)
    if (rng.below(4) == 0) t.data()[i] = kIgnoreIndex;
  return t;
}

struct Batch {
  std::vector<TokenIds> fields;
  TokenIds targets;
  KeyMask mask;
  bool use_mask = false;
};

Batch random_batch(const TransformerConfig& c, std::size_t B, std::size_t T, Rng& rng,
                   bool use_mask) {
  Batch b;
  for (std::size_t f = 0; f < c.vocab_sizes.size(); ++f)
    b.fields.push_back(random_ids(B, T, c.vocab_sizes[f], rng, f > 0));
  b.targets = random_targets(B, T, c.out_vocab, rng);
  b.use_mask = use_mask;
  b.mask = KeyMask::from_shape({B, T});
  for (std::size_t i = 0; i < b.mask.size(); ++i) b.mask.data()[i] = rng.below(4) != 0;
  for (std::size_t t = 0; t < T; ++t) b.mask(0, t) = false;  // one batch row sees no key
  return b;
}

// A Transformer with `source`'s weights, moved to `ops`, driven as a training loop drives it
// (upload the ids, forward, CrossEntropyLoss, backward), with copies to and from host lists.
template <class Real>
class OnBackend {
 public:
  OnBackend(Transformer<Real>& source, DeviceOps<Real>& ops, double z_loss = 0)
      : rng_(0), net_(source.config(), rng_), loss_(z_loss) {
    copy_values(source.parameters(), net_.parameters());
    net_.to(ops);
  }
  Transformer<Real>& net() { return net_; }
  // Host values into the model (same names and shapes, std::invalid_argument otherwise).
  void upload_parameters(const ParameterList<Real>& params) {
    net_.copy_to_host(true);
    copy_values(params, net_.parameters());
    net_.copy_to_device();
  }
  void download_parameters(const ParameterList<Real>& params) {
    net_.copy_to_host();
    copy_values(net_.parameters(), params);
  }
  void download_gradients(const ParameterList<Real>& params) {
    net_.copy_to_host(true);
    const ParameterList<Real> mine = net_.parameters();
    for (std::size_t i = 0; i < mine.size(); ++i) params[i].param->grad = mine[i].param->grad;
  }
  void forward(const std::vector<TokenIds>& fields, const KeyMask* key_mask = nullptr) {
    Buffer<unsigned char> mask;
    if (key_mask) {
      check_shape("test", "key_mask", *key_mask,
                  {std::ptrdiff_t(fields[0].shape()[0]), std::ptrdiff_t(fields[0].shape()[1])});
      mask = to_byte_mask(net_.ops(), *key_mask);
    }
    logits_ = net_.forward(net_.upload_fields(fields), key_mask ? &mask : nullptr);
  }
  Tensor3<Real> logits() const { return to_tensor<Real, 3>(logits_); }
  double loss(const TokenIds& targets, double weight = 1) {
    if (logits_.empty()) throw std::logic_error("loss before forward");
    return loss_.forward(net_.ops(), logits_, targets, weight);
  }
  // accumulate: add to the gradients instead of replacing them.
  void backward(bool accumulate = false) {
    const Buffer<Real>& dlogits = loss_.dlogits();  // std::logic_error before loss
    if (!accumulate) net_.zero_grad();
    net_.backward(dlogits);
  }
  double grad_norm() { return attnlab::grad_norm(net_.parameters()); }
  double grad_norm(const std::string& name) {
    for (const auto& p : net_.parameters())
      if (p.name == name) return attnlab::grad_norm(ParameterList<Real>{p});
    throw std::invalid_argument("grad_norm: no parameter '" + name + "'");
  }
  double clip_grad_norm(double max_norm) {
    return attnlab::clip_grad_norm(net_.parameters(), max_norm);
  }

 private:
  static void copy_values(const ParameterList<Real>& from, const ParameterList<Real>& to) {
    check_arg(from.size() == to.size(), "upload_parameters", "params",
              std::to_string(to.size()) + " parameters", std::to_string(from.size()));
    for (std::size_t i = 0; i < from.size(); ++i) {
      check_arg(from[i].name == to[i].name, "upload_parameters", "parameter",
                "'" + to[i].name + "'", "'" + from[i].name + "'");
      to[i].param->value = from[i].param->value;
    }
  }

  Rng rng_;
  Transformer<Real> net_;
  Buffer<Real> logits_;
  CrossEntropyLoss<Real> loss_;
};

// One forward/loss/backward on the CPU model and on the device model built from it; compares the
// logits, the loss and every gradient.
template <class Real>
void check_step_matches(const TransformerConfig& config, DeviceOps<Real>& ops, bool use_mask,
                        double tolerance, double z_loss = 0) {
  Rng rng(11);
  Transformer<Real> cpu(config, rng);
  OnBackend<Real> dev(cpu, ops, z_loss);
  Rng data(5);
  const Batch b = random_batch(config, 3, 6, data, use_mask);
  const KeyMask* mask = use_mask ? &b.mask : nullptr;

  const Tensor3<Real> logits = cpu.forward(b.fields, mask);
  auto ce = softmax_cross_entropy<Real, 3>(logits, b.targets, kIgnoreIndex, Real(z_loss));
  CHECK((z_loss > 0 ? ce.z_term > 0 : ce.z_term == 0));
  cpu.zero_grad();
  cpu.backward(ce.dlogits);

  dev.forward(b.fields, mask);
  CHECK(rel_error(dev.logits(), logits) < tolerance);
  const double loss = dev.loss(b.targets);
  CHECK(std::abs(loss - static_cast<double>(ce.loss)) <= tolerance * std::abs(ce.loss));
  dev.backward();

  Rng rng2(11);
  Transformer<Real> grads(config, rng2);  // same names and shapes, receives the device's grads
  const ParameterList<Real> mine = grads.parameters();
  dev.download_gradients(mine);
  const ParameterList<Real> theirs = cpu.parameters();
  REQUIRE(mine.size() == theirs.size());
  for (std::size_t i = 0; i < mine.size(); ++i) {
    INFO("parameter " << theirs[i].name);
    const double err = rel_error(mine[i].param->grad, theirs[i].param->grad);
    // k_norm.beta has an exactly zero true gradient (a shift common to all keys cancels), unless
    // RoPE turns the shift by each key's position.
    if (theirs[i].name.find("k_norm.beta") != std::string::npos &&
        config.positions != PositionEncoding::rope) {
      for (std::size_t j = 0; j < mine[i].param->grad.size(); ++j) {
        CHECK(std::abs(mine[i].param->grad.data()[j]) < 50 * tolerance);
        CHECK(std::abs(theirs[i].param->grad.data()[j]) < 50 * tolerance);
      }
    } else {
      CHECK(err < tolerance);
    }
    CHECK(test::all_finite(mine[i].param->grad));
  }
  CHECK(std::abs(dev.grad_norm() - grad_norm(theirs)) <= tolerance * grad_norm(theirs));
  CHECK(std::abs(dev.grad_norm(theirs[0].name) -
                 std::sqrt(static_cast<double>(
                     xt::sum(theirs[0].param->grad * theirs[0].param->grad)()))) <=
        tolerance * dev.grad_norm(theirs[0].name));
}

template <class Real>
void check_variants(DeviceOps<Real>& ops, double tolerance) {
  SUBCASE("pre-LN LayerNorm blocks with MLP, sqrt_dk") {
    check_step_matches<Real>(small_config(), ops, false, tolerance);
  }
  SUBCASE("no biases: the MLP's and the LayerNorms' beta, causal") {
    auto c = small_config();
    c.block.bias = false;
    c.block.attention.sdpa.causal = true;
    check_step_matches<Real>(c, ops, false, tolerance);
  }
  SUBCASE("RMSNorm, attention-only, unscaled, key mask") {
    auto c = small_config();
    c.block.norm = Norm::rmsnorm;
    c.block.attn_only = true;
    c.block.attention.sdpa.scaling = Scaling::none;
    check_step_matches<Real>(c, ops, true, tolerance);
  }
  SUBCASE("no norm, 1/d_k, causal, sinusoidal positions, two fields, d_k != d_v") {
    auto c = small_config();
    c.block.norm = Norm::none;
    c.block.attention.sdpa.scaling = Scaling::dk;
    c.block.attention.sdpa.causal = true;
    c.positions = PositionEncoding::sinusoidal;
    c.vocab_sizes = {7, 4};
    c.block.attention.d_k = 3;
    c.block.attention.d_v = 5;
    check_step_matches<Real>(c, ops, false, tolerance);
  }
  SUBCASE("QK-norm, learnable per-head scale, causal and key mask") {
    auto c = small_config();
    c.block.attention.qk_norm = true;
    c.block.attention.learnable_scale = true;
    c.block.attention.sdpa.causal = true;
    check_step_matches<Real>(c, ops, true, tolerance);
  }
  SUBCASE("multi-query attention (kv_heads 1), causal, key mask") {
    auto c = small_config();
    c.block.attention.kv_heads = 1;
    c.block.attention.sdpa.causal = true;
    check_step_matches<Real>(c, ops, true, tolerance);
  }
  SUBCASE("grouped-query attention on the fused path") {
    auto c = small_config();
    c.block.attention.heads = 4;
    c.block.attention.kv_heads = 2;
    c.block.attention.sdpa.path = SdpaPath::fused;
    check_step_matches<Real>(c, ops, false, tolerance);
  }
  SUBCASE("sliding window of 3, key mask, on the fused path") {
    auto c = small_config();
    c.block.attention.sdpa.causal = true;
    c.block.attention.sdpa.window = 3;
    c.block.attention.sdpa.path = SdpaPath::fused;
    check_step_matches<Real>(c, ops, true, tolerance);
  }
  SUBCASE("ALiBi without positions, causal, key mask") {
    auto c = small_config();
    c.block.attention.alibi = true;
    c.block.attention.sdpa.causal = true;
    c.positions = PositionEncoding::none;
    check_step_matches<Real>(c, ops, true, tolerance);
  }
  SUBCASE("causal with a query offset, key mask") {
    auto c = small_config();
    c.block.attention.sdpa.causal = true;
    c.block.attention.sdpa.query_offset = 2;
    check_step_matches<Real>(c, ops, true, tolerance);
  }
  SUBCASE("tied embedding and head, causal") {
    auto c = small_config();
    c.out_vocab = c.vocab_sizes[0];
    c.tie_embeddings = true;
    c.block.attention.sdpa.causal = true;
    check_step_matches<Real>(c, ops, true, tolerance);
  }
  SUBCASE("output-logit softcap") {
    auto c = small_config();
    c.logit_softcap = 0.5;
    check_step_matches<Real>(c, ops, true, tolerance);
  }
  SUBCASE("attention softcap with ALiBi and a learnable scale, causal, key mask") {
    auto c = small_config();
    c.block.attention.sdpa.softcap = 0.6;
    c.block.attention.sdpa.causal = true;
    c.block.attention.alibi = true;
    c.block.attention.learnable_scale = true;
    c.positions = PositionEncoding::none;
    check_step_matches<Real>(c, ops, true, tolerance);
  }
  SUBCASE("attention softcap on the fused path, grouped-query") {
    auto c = small_config();
    c.block.attention.sdpa.softcap = 0.6;
    c.block.attention.heads = 4;
    c.block.attention.kv_heads = 2;
    c.block.attention.sdpa.path = SdpaPath::fused;
    check_step_matches<Real>(c, ops, true, tolerance);
  }
  SUBCASE("SwiGLU MLP without biases") {
    auto c = small_config();
    c.block.mlp = MlpActivation::swiglu;
    c.block.bias = false;
    check_step_matches<Real>(c, ops, true, tolerance);
  }
  SUBCASE("z-loss on softcapped logits, key mask") {
    auto c = small_config();
    c.logit_softcap = 2.0;
    check_step_matches<Real>(c, ops, true, tolerance, 0.05);
  }
  SUBCASE("ReLU² MLP") {
    auto c = small_config();
    c.block.mlp = MlpActivation::relu2;
    check_step_matches<Real>(c, ops, true, tolerance);
  }
  SUBCASE("rotary positions after QK-norm, partial and interleaved") {
    auto c = small_config();
    c.positions = PositionEncoding::rope;
    c.block.attention.qk_norm = true;
    c.block.attention.rope_fraction = 0.5;
    c.block.attention.rope_interleaved = true;
    c.block.attention.rope_theta = 100.0;
    check_step_matches<Real>(c, ops, true, tolerance);
  }
  SUBCASE("fused attention path, explicit scale, no positions") {
    auto c = small_config();
    c.block.attention.sdpa.path = SdpaPath::fused;
    c.block.attention.sdpa.scale = 0.7;
    c.positions = PositionEncoding::none;
    check_step_matches<Real>(c, ops, true, tolerance);
  }
}

// `steps` AdamW (or SGD) steps with clipping on the CPU and on the device from the same weights and
// batches; returns the per-step losses of both and checks the final weights and optimizer state.
template <class Real>
void check_training_curve(DeviceOps<Real>& ops, int steps, bool sgd, double loss_tol,
                          double weight_tol, DecayParams decay = DecayParams::all) {
  auto config = small_config();
  config.vocab_sizes = {6, 3};
  Rng rng(3);
  Transformer<Real> cpu(config, rng);
  OnBackend<Real> dev(cpu, ops);
  const ParameterList<Real> params = cpu.parameters();
  std::unique_ptr<Optimizer<Real>> opt, dopt;  // the same optimizer class on each backend
  const double base_lr = sgd ? 0.1 : 3e-3;
  if (sgd) {
    const SgdOptions o{base_lr, 0.9, 1e-3, decay};
    opt = std::make_unique<SGD<Real>>(params, o);
    dopt = std::make_unique<SGD<Real>>(dev.net().parameters(), o);
  } else {
    const AdamWOptions o{base_lr, 0.9, 0.95, 1e-8, 0.01, decay};
    opt = std::make_unique<AdamW<Real>>(params, o);
    dopt = std::make_unique<AdamW<Real>>(dev.net().parameters(), o);
  }
  Rng data(9);
  double max_loss_diff = 0, first = 0, last = 0;
  for (int step = 0; step < steps; ++step) {
    const Batch b = random_batch(config, 4, 8, data, false);
    // The task: predict the first field's token (learnable, so the loss must fall).
    TokenIds targets = b.fields[0];
    for (std::size_t i = 0; i < targets.size(); ++i)
      targets.data()[i] = targets.data()[i] % static_cast<int>(config.out_vocab);
    const double lr = base_lr * (1.0 - 0.5 * step / steps);
    opt->set_lr(lr);
    dopt->set_lr(lr);

    const Tensor3<Real> logits = cpu.forward(b.fields);
    auto ce = softmax_cross_entropy<Real, 3>(logits, targets);
    cpu.zero_grad();
    cpu.backward(ce.dlogits);
    const double cpu_norm = clip_grad_norm(params, 1.0);
    opt->step();

    dev.forward(b.fields);
    const double loss = dev.loss(targets);
    dev.backward();
    const double dev_norm = dev.clip_grad_norm(1.0);
    dopt->step();

    INFO("step " << step << ": cpu loss " << ce.loss << ", device loss " << loss);
    CHECK(std::abs(dev_norm - cpu_norm) <= loss_tol * cpu_norm);
    max_loss_diff = std::max(max_loss_diff, std::abs(loss - static_cast<double>(ce.loss)));
    if (step == 0) first = loss;
    last = loss;
  }
  MESSAGE(ops.name() << ": " << steps << " steps, loss " << first << " -> " << last
                     << ", max |device - cpu| loss " << max_loss_diff);
  CHECK(max_loss_diff <= loss_tol * first);
  CHECK(last < 0.8 * first);  // it trains
  CHECK(dopt->step_count() == opt->step_count());
  Rng rng2(3);
  Transformer<Real> mirror(config, rng2);
  const ParameterList<Real> mp = mirror.parameters();
  dev.download_parameters(mp);
  for (std::size_t i = 0; i < mp.size(); ++i) {
    INFO("parameter " << params[i].name);
    CHECK(rel_error(mp[i].param->value, params[i].param->value) < weight_tol);
  }
  const auto mine = dopt->state_tensors();
  const auto theirs = opt->state_tensors();
  REQUIRE(mine.size() == theirs.size());
  for (std::size_t i = 0; i < mine.size(); ++i) {
    INFO("state " << theirs[i].first);
    CHECK(mine[i].first == theirs[i].first);
    CHECK(rel_error(mine[i].second, theirs[i].second) < weight_tol * 10);
  }
}

}  // namespace

TEST_CASE_TEMPLATE("one model on a device: one step matches the CPU model, double", Backend,
                   test::EmulatedBackend, test::CpuBackend) {
  const auto device = Backend::template make<double>();
  auto& ops = *device;
  check_variants<double>(ops, 1e-10);
}

TEST_CASE_TEMPLATE("one model on a device: one step matches the CPU model, float", Backend,
                   test::EmulatedBackend, test::CpuBackend) {
  const auto device = Backend::template make<float>();
  auto& ops = *device;
  check_variants<float>(ops, 2e-5);
}

TEST_CASE_TEMPLATE("one model on a device: central-difference gradient check of every parameter",
                   Backend, test::EmulatedBackend, test::CpuBackend) {
  // The device backward on its own terms, in double: every element of every parameter against
  // (L(θ + ε) − L(θ − ε)) / 2ε of the device's own forward and loss, with every feature on.
  const auto device = Backend::template make<double>();
  auto& ops = *device;
  TransformerConfig c;
  c.vocab_sizes = {5, 3};
  c.max_len = 4;
  c.block.attention.d_model = 4;
  c.block.attention.heads = 2;
  c.block.attention.d_k = 4;  // QK-norm over D = 2 would leave q and k almost no gradient to check
  c.block.d_ff = 6;
  c.layers = 1;
  c.out_vocab = 4;
  c.block.attention.qk_norm = true;
  c.block.attention.learnable_scale = true;
  c.block.attention.sdpa.causal = true;
  Rng rng(21);
  Transformer<double> host(c, rng);
  OnBackend<double> dev(host, ops, 0.05);  // with a z-loss
  Rng data(4);
  const Batch b = random_batch(c, 2, 3, data, true);
  const ParameterList<double> params = host.parameters();
  dev.forward(b.fields, &b.mask);
  dev.loss(b.targets);
  dev.backward();
  dev.download_gradients(params);
  std::vector<GradcheckTensor> tensors;
  for (const auto& p : params) {
    const auto& shape = p.param->value.shape();
    tensors.push_back({p.name, p.param->value.data(), p.param->grad.data(),
                       std::vector<std::size_t>(shape.begin(), shape.end())});
  }
  const auto loss = [&] {
    dev.upload_parameters(params);
    dev.forward(b.fields, &b.mask);
    return dev.loss(b.targets);
  };
  const GradcheckReport report = check_gradients(tensors, loss);
  INFO(report.table());
  for (const auto& r : report.results) {
    INFO("parameter " << r.name);
    if (r.name.find("k_norm.beta") != std::string::npos) {
      CHECK(r.max_abs_error < 1e-8);  // its true gradient is exactly zero
    } else {
      CHECK(r.rel_error < 1e-6);
      CHECK(r.analytic_norm > 0);
    }
  }
}

TEST_CASE_TEMPLATE("gradient accumulation: 3 weighted micro-batches give one batch's gradients",
                   Backend, test::EmulatedBackend, test::CpuBackend) {
  // Three micro-batches with uneven key masks and label counts, each backward adding its
  // gradient weighted by labelled_share (what the trainer and the MPI path weight by), against
  // the gradient of the mean loss of the one batch that concatenates them: equal to 1e-12 in
  // double, with and without a z-loss.
  const auto device = Backend::template make<double>();
  auto& ops = *device;
  auto config = small_config();
  config.block.attention.sdpa.causal = true;
  const std::size_t N = 3, B = 2, T = 6;
  Rng data(31);
  std::vector<Batch> micro;
  for (std::size_t k = 0; k < N; ++k) micro.push_back(random_batch(config, B, T, data, true));
  for (std::size_t t = 0; t < T; ++t) micro[1].targets(0, t) = kIgnoreIndex;  // uneven counts
  micro[2].targets(1, 0) = micro[2].targets(1, 1) = kIgnoreIndex;
  micro[2].mask(1, 2) = false;
  // The one batch: the micro-batches' rows in order.
  Batch all;
  all.fields.resize(micro[0].fields.size());
  for (std::size_t f = 0; f < all.fields.size(); ++f) {
    all.fields[f] = TokenIds::from_shape({N * B, T});
    for (std::size_t k = 0; k < N; ++k)
      std::copy(micro[k].fields[f].begin(), micro[k].fields[f].end(),
                all.fields[f].begin() + static_cast<std::ptrdiff_t>(k * B * T));
  }
  all.targets = TokenIds::from_shape({N * B, T});
  all.mask = KeyMask::from_shape({N * B, T});
  std::vector<std::size_t> labelled(N, 0);
  for (std::size_t k = 0; k < N; ++k) {
    std::copy(micro[k].targets.begin(), micro[k].targets.end(),
              all.targets.begin() + static_cast<std::ptrdiff_t>(k * B * T));
    std::copy(micro[k].mask.begin(), micro[k].mask.end(),
              all.mask.begin() + static_cast<std::ptrdiff_t>(k * B * T));
    for (const int t : micro[k].targets) labelled[k] += t != kIgnoreIndex;
  }
  const std::size_t total = labelled[0] + labelled[1] + labelled[2];
  CHECK(labelled[0] != labelled[1]);
  CHECK(labelled[1] != labelled[2]);

  for (const double z_loss : {0.0, 0.05}) {
    CAPTURE(z_loss);
    Rng rng(13);
    Transformer<double> source(config, rng);
    OnBackend<double> dev(source, ops, z_loss);
    const auto gradients = [&] {
      Rng again(13);
      Transformer<double> holder(config, again);
      dev.download_gradients(holder.parameters());
      std::vector<xt::xarray<double>> g;
      for (const auto& p : holder.parameters()) g.push_back(p.param->grad);
      return g;
    };
    dev.forward(all.fields, &all.mask);
    const double loss_all = dev.loss(all.targets);
    dev.backward();
    const auto want = gradients();

    double loss_sum = 0;
    for (std::size_t k = 0; k < N; ++k) {
      const double w = labelled_share(labelled[k], B, total, N * B);
      dev.forward(micro[k].fields, &micro[k].mask);
      loss_sum += w * dev.loss(micro[k].targets, w);
      dev.backward(k > 0);  // adds from the second on
    }
    const auto got = gradients();
    CHECK(std::abs(loss_sum - loss_all) <= 1e-13 * loss_all);
    REQUIRE(got.size() == want.size());
    double worst = 0;
    for (std::size_t i = 0; i < got.size(); ++i) {
      INFO("parameter " << i);
      CHECK(xt::amax(xt::abs(want[i]))() > 0);
      worst = std::max(worst, rel_error(got[i], want[i]));
    }
    MESSAGE(ops.name() << ", z-loss " << z_loss << ": worst relative gradient error " << worst);
    CHECK(worst < 1e-12);

    // The weighting matters: equal weights (1/3 each) give another gradient.
    for (std::size_t k = 0; k < N; ++k) {
      dev.forward(micro[k].fields, &micro[k].mask);
      dev.loss(micro[k].targets, 1.0 / N);
      dev.backward(k > 0);
    }
    const auto unweighted = gradients();
    double unweighted_error = 0;
    for (std::size_t i = 0; i < got.size(); ++i)
      unweighted_error = std::max(unweighted_error, rel_error(unweighted[i], want[i]));
    CHECK(unweighted_error > 1e-3);
  }
}

TEST_CASE_TEMPLATE("one model on a device: 50 AdamW steps with clipping follow the CPU loss curve",
                   Backend, test::EmulatedBackend, test::CpuBackend) {
  const auto device = Backend::template make<float>();
  auto& ops = *device;
  check_training_curve<float>(ops, 50, false, 1e-4, 1e-4);
}

TEST_CASE_TEMPLATE("one model on a device: SGD with momentum and weight decay, double", Backend,
                   test::EmulatedBackend, test::CpuBackend) {
  const auto device = Backend::template make<double>();
  auto& ops = *device;
  check_training_curve<double>(ops, 20, true, 1e-10, 1e-10);
}

TEST_CASE_TEMPLATE("one model on a device: AdamW decaying the matrices only, double", Backend,
                   test::EmulatedBackend, test::CpuBackend) {
  const auto device = Backend::template make<double>();
  auto& ops = *device;
  check_training_curve<double>(ops, 50, false, 1e-10, 1e-10, DecayParams::matrices);
}

TEST_CASE("one model on a device (CUDA): one step matches the CPU model") {
  if (!test::cuda_device_or_skip()) return;
  check_variants<double>(*make_cuda_device_ops<double>(), 1e-10);
  check_variants<float>(*make_cuda_device_ops<float>(), 2e-5);
}

TEST_CASE("one model on a device (CUDA): 50 AdamW steps with clipping follow the CPU loss curve") {
  if (!test::cuda_device_or_skip()) return;
  check_training_curve<float>(*make_cuda_device_ops<float>(), 50, false, 1e-4, 1e-4);
  check_training_curve<double>(*make_cuda_device_ops<double>(), 20, true, 1e-10, 1e-10);
}

TEST_CASE("one model on a device: checkpoints interchange with the CPU optimizer state") {
  const auto device = emulated::make_device_ops<double>();
  auto& ops = *device;
  auto config = small_config();
  Rng rng(1);
  Transformer<double> cpu(config, rng);
  const ParameterList<double> params = cpu.parameters();
  AdamW<double> opt(params, AdamWOptions{});
  // Some state on the CPU: two steps from random gradients.
  Rng g(2);
  for (int s = 0; s < 2; ++s) {
    for (const auto& p : params) p.param->grad = randn<double, 1>({p.param->value.size()}, g);
    for (const auto& p : params) p.param->grad.reshape(p.param->value.shape());
    opt.step();
  }
  OnBackend<double> dev(cpu, ops);
  AdamW<double> dopt(dev.net().parameters(), AdamWOptions{});
  dopt.load_state(opt.state_tensors(), opt.step_count());
  CHECK(dopt.step_count() == 2);
  const auto back = dopt.state_tensors();
  const auto orig = opt.state_tensors();
  REQUIRE(back.size() == orig.size());
  for (std::size_t i = 0; i < back.size(); ++i) {
    CHECK(back[i].first == orig[i].first);
    CHECK(rel_error(back[i].second, orig[i].second) == 0.0);
  }

  SUBCASE("a bad state is refused before anything is copied") {
    auto missing = orig;
    missing.pop_back();
    CHECK_THROWS_WITH_AS(dopt.load_state(missing, 5), doctest::Contains("missing"),
                         std::invalid_argument);
    auto unknown = orig;
    unknown.back().first = "optim.nope.exp_avg";
    CHECK_THROWS_WITH_AS(dopt.load_state(unknown, 5), doctest::Contains("optim.nope.exp_avg"),
                         std::invalid_argument);
    auto shaped = orig;
    shaped[0].second = xt::xarray<double>::from_shape({1});
    CHECK_THROWS_AS(dopt.load_state(shaped, 5), ShapeError);
    CHECK(dopt.step_count() == 2);
    const auto still = dopt.state_tensors();
    for (std::size_t i = 0; i < still.size(); ++i)
      CHECK(rel_error(still[i].second, orig[i].second) == 0.0);
  }
  SUBCASE("parameters round-trip and mismatched lists are refused") {
    Rng other(77);
    Transformer<double> cpu2(config, other);
    dev.upload_parameters(cpu2.parameters());
    Rng rng3(1);
    Transformer<double> mirror(config, rng3);
    dev.download_parameters(mirror.parameters());
    const auto a = mirror.parameters(), b = cpu2.parameters();
    for (std::size_t i = 0; i < a.size(); ++i)
      CHECK(rel_error(a[i].param->value, b[i].param->value) == 0.0);
    auto c2 = config;
    c2.layers = 1;
    Rng rng4(1);
    Transformer<double> smaller(c2, rng4);
    CHECK_THROWS_AS(dev.upload_parameters(smaller.parameters()), std::invalid_argument);
  }
}

TEST_CASE("one model on a device: bad input is refused with the CPU model's errors") {
  const auto device = emulated::make_device_ops<float>();
  auto& ops = *device;
  auto config = small_config();
  Rng rng(1);
  Transformer<float> cpu(config, rng);
  OnBackend<float> dev(cpu, ops);
  CHECK_THROWS_AS(dev.loss(TokenIds::from_shape({2, 3})), std::logic_error);
  TokenIds ids = xt::zeros<int>({2, 3});
  dev.forward({ids});
  CHECK_THROWS_AS(dev.backward(), std::logic_error);  // before loss
  ids(1, 2) = 7;                                      // vocab is 7
  CHECK_THROWS_WITH_AS(dev.forward({ids}), doctest::Contains("[1, 2]"), std::invalid_argument);
  CHECK_THROWS_AS(dev.forward({ids, ids}), std::invalid_argument);
  CHECK_THROWS_WITH_AS(dev.forward({TokenIds(xt::zeros<int>({1, 10}))}),
                       doctest::Contains("max_len"), std::invalid_argument);
  dev.forward({TokenIds(xt::zeros<int>({2, 3}))});
  TokenIds targets = xt::zeros<int>({2, 3});
  targets(0, 1) = 5;  // out_vocab is 5
  CHECK_THROWS_WITH_AS(dev.loss(targets), doctest::Contains("[0, 1]"), std::invalid_argument);
  CHECK_THROWS_AS(dev.loss(TokenIds(xt::zeros<int>({2, 4}))), ShapeError);
  KeyMask mask = KeyMask::from_shape({2, 4});
  CHECK_THROWS_AS(dev.forward({TokenIds(xt::zeros<int>({2, 3}))}, &mask), ShapeError);
  CHECK_THROWS_AS(dev.clip_grad_norm(0.0), std::invalid_argument);
  CHECK_THROWS_AS(dev.grad_norm("nope"), std::invalid_argument);
}

TEST_CASE("one model on a device: device memory is released") {
  const auto device = emulated::make_device_ops<float>();
  auto& ops = *device;
  {
    auto config = small_config();
    Rng rng(1);
    Transformer<float> cpu(config, rng);
    OnBackend<float> dev(cpu, ops);
    AdamW<float> opt(dev.net().parameters(), AdamWOptions{});
    Rng data(2);
    for (std::size_t B : {2, 5, 3}) {  // growing and shrinking batches
      const Batch b = random_batch(config, B, 4, data, false);
      dev.forward(b.fields);
      dev.loss(b.targets);
      dev.backward();
      opt.step();
    }
    CHECK(emulated::live_allocations(ops) > 0);
  }
  CHECK(emulated::live_allocations(ops) == 0);
}

TEST_CASE("one model on a device: without a device, make_cuda_device_ops says why") {
  if (cuda_available()) return;  // covered by the CUDA cases above
  CHECK_THROWS_AS((void)make_cuda_device_ops<float>(), CudaError);
}
