#include "train_backend.hpp"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <exception>
#include <stdexcept>

#include <omp.h>

#include "attnlab/nn/module.hpp"
#include "attnlab/nn/transformer.hpp"
#include "attnlab/optim/clip.hpp"
#include "attnlab/threads.hpp"

namespace attnlab::app {

double tensor_norm(const xt::xarray<float>& a) {
  double s = 0;
  for (float x : a) s += static_cast<double>(x) * x;
  return std::sqrt(s);
}

// A copy of the model for the batch-parallel step: its own activations, gradients and loss; its
// parameters read the model's values.
struct TrainBackend::Replica {
  Replica(const TransformerConfig& config, double z_loss, Rng& rng)
      : model(config, rng), params(model.parameters()), loss(z_loss) {}
  Model model;
  ParameterList<float> params;
  CrossEntropyLoss<float> loss;
};

TrainBackend::TrainBackend(Model& model, OptimizerGroups<float>& optimizer, double z_loss)
    : model_(model), opt_(optimizer), params_(model.parameters()), loss_(z_loss) {}

TrainBackend::~TrainBackend() = default;

void TrainBackend::use_batch_threads(const TransformerConfig& config, int threads) {
  check_arg(threads >= 1, "use_batch_threads", "threads", ">= 1", std::to_string(threads));
  check_arg(threads == 1 || &model_.ops() == &cpu_ops<float>(), "use_batch_threads", "backend",
            "the CPU backend (a device parallelises each op)", model_.ops().name());
  replicas_.clear();
  Rng rng(0);  // the replicas' own draws are freed: they read the model's weights
  for (int t = 1; t < threads; ++t) {
    replicas_.push_back(std::make_unique<Replica>(config, loss_.z_loss(), rng));
    const ParameterList<float>& mine = replicas_.back()->params;
    check_arg(mine.size() == params_.size(), "use_batch_threads", "config",
              "the model's own config (" + std::to_string(params_.size()) + " parameters)",
              "one with " + std::to_string(mine.size()));
    for (std::size_t i = 0; i < mine.size(); ++i) {
      check_arg(
          mine[i].name == params_[i].name && mine[i].param->size() == params_[i].param->size(),
          "use_batch_threads", "config",
          "the model's own config (parameter '" + params_[i].name + "')", "'" + mine[i].name + "'");
    }
    for (std::size_t i = 0; i < mine.size(); ++i) mine[i].param->read_values_of(*params_[i].param);
  }
  zero_replica_grads();  // forward_backward keeps them zero between parts
}

std::vector<TrainBackend::Loss> TrainBackend::forward_backward(std::span<const Batch> parts,
                                                               std::span<const double> weights,
                                                               std::uint64_t first_step) {
  const int P = static_cast<int>(parts.size());
  check_arg(P >= 1 && P <= batch_threads() && weights.size() == parts.size(), "forward_backward",
            "parts", "1 to " + std::to_string(batch_threads()) + " parts with a weight each",
            std::to_string(P) + " parts, " + std::to_string(weights.size()) + " weights");
  std::vector<Loss> losses(static_cast<std::size_t>(P));
  std::exception_ptr error;
  // The parameters laid end to end; ranges of that flat index are cut among the threads below.
  std::vector<std::size_t> offset(params_.size() + 1, 0);
  for (std::size_t i = 0; i < params_.size(); ++i)
    offset[i + 1] = offset[i] + params_[i].param->size();
  const std::size_t total = offset.back();
  // f(i, lo, hi) for the elements [lo, hi) of parameter i that lie in share c of n of the flat
  // index.
  const auto for_share = [&](int c, int n, auto&& f) {
    const std::size_t e0 = total * static_cast<std::size_t>(c) / static_cast<std::size_t>(n);
    const std::size_t e1 = total * static_cast<std::size_t>(c + 1) / static_cast<std::size_t>(n);
    std::size_t i = static_cast<std::size_t>(std::upper_bound(offset.begin(), offset.end(), e0) -
                                             offset.begin() - 1);
    for (std::size_t e = e0; e < e1; ++i) {
      const std::size_t lo = e - offset[i], hi = std::min(e1, offset[i + 1]) - offset[i];
      f(i, lo, hi);
      e = offset[i] + hi;
    }
  };
  // One thread per part; every op inside runs on its calling thread (a count of 1, and oneDNN and
  // OpenBLAS run single-threaded inside a parallel region). The replicas read the model's weights,
  // which nothing writes until the region ends.
#pragma omp parallel num_threads(P)
  {
    const int threads = omp_get_num_threads(), me = omp_get_thread_num();
    for (int t = me; t < P; t += threads) {
      try {
        const ThreadScope one(1);
        Model& m = t == 0 ? model_ : replicas_[static_cast<std::size_t>(t - 1)]->model;
        CrossEntropyLoss<float>& loss =
            t == 0 ? loss_ : replicas_[static_cast<std::size_t>(t - 1)]->loss;
        const auto u = static_cast<std::size_t>(t);
        m.train_mode(seed_, first_step + u);
        loss.forward(m.ops(), m.forward_on_backend(parts[u]), parts[u].targets, weights[u]);
        losses[u] = {loss.cross_entropy(), loss.z_term()};
        if (std::isfinite(losses[u].total())) m.backward(loss.dlogits());
      } catch (...) {
#pragma omp critical(attnlab_forward_backward)
        if (!error) error = std::current_exception();
      }
    }
  }
  if (error) {
    zero_replica_grads();
    std::rethrow_exception(error);
  }
  if (P == 1) return losses;
    // The model's grads += each replica's, in replica order, each element summed in that order
    // whatever the cut (so the bits do not depend on it); each replica's grad is zeroed as it is
    // read, ready for its next part (its backward adds into it).
#pragma omp parallel for num_threads(P) schedule(static)
  for (int c = 0; c < P; ++c) {
    for_share(c, P, [&](std::size_t i, std::size_t lo, std::size_t hi) {
      float* g = params_[i].param->grad.data();
      for (int r = 1; r < P; ++r) {
        float* h = replicas_[static_cast<std::size_t>(r - 1)]->params[i].param->grad.data();
        for (std::size_t j = lo; j < hi; ++j) {
          g[j] += h[j];
          h[j] = 0.0f;
        }
      }
    });
  }
  return losses;
}

void TrainBackend::zero_replica_grads() {
  for (const auto& r : replicas_)
    for (const auto& np : r->params) std::fill(np.param->grad.begin(), np.param->grad.end(), 0.0f);
}

std::string TrainBackend::name() const {
  return model_.ops().name();
}

void TrainBackend::set_lr(double lr) {
  opt_.set_lr(lr);
}

void TrainBackend::set_step(std::uint64_t seed, std::uint64_t step) {
  seed_ = seed;
  step_ = step;
}

TrainBackend::Loss TrainBackend::forward_loss(const Batch& batch, double weight) {
  model_.train_mode(seed_, step_);
  loss_.forward(model_.ops(), model_.forward_on_backend(batch), batch.targets, weight);
  return {loss_.cross_entropy(), loss_.z_term()};
}

void TrainBackend::zero_grad() {
  model_.zero_grad();
}

void TrainBackend::backward() {
  model_.backward(loss_.dlogits());
}

double TrainBackend::grad_norm(const std::string& parameter) {
  for (const auto& p : params_)
    if (p.name == parameter) return attnlab::grad_norm(ParameterList<float>{p});
  throw std::invalid_argument("grad_norm: no parameter '" + parameter + "'");
}

double TrainBackend::grad_norm() {
  return attnlab::grad_norm(params_);
}

void TrainBackend::clip_grad_norm(double max_norm) {
  attnlab::clip_grad_norm(params_, max_norm);
}

void TrainBackend::step() {
  opt_.step();
}

void TrainBackend::synchronize() {
  model_.ops().synchronize();
}

Tensor3<float> TrainBackend::eval_logits(const Batch& batch) {
  model_.eval_mode();
  return to_tensor<float, 3>(model_.forward_on_backend(batch), "eval");
}

LayerAttention TrainBackend::attention(std::size_t layer) {
  LayerAttention a{model_.attention_weights(layer),
                   model_.attention_logits(layer),
                   {},
                   model_.attention_queries(layer),
                   model_.attention_keys(layer)};
  if (layer == 0) a.dots = model_.attention_dots(0);
  return a;
}

void TrainBackend::sync_host() {
  model_.copy_to_host();
}

std::string TrainBackend::locate_nonfinite(const Batch& batch) {
  model_.train_mode(seed_, step_);  // the failed step's forward, its dropout masks included
  return model_.locate_nonfinite(batch);
}

}  // namespace attnlab::app
