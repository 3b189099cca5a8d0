// custom_net: a network that is not a Transformer, built from attnlab's layers and trained with
// AdamW. It shows how to reuse the attention layer in your own model: compose Modules, write the
// forward and the backward of your own glue (here, attention pooling on the raw sdpa op), collect
// the named parameters and hand them to an optimizer.
//
// Task (synthetic): each sequence hides one class token c in [0, K) at a random position among
// noise tokens in [K, V); sequences have random lengths and are padded. Predict c.
//
// Model, shapes with B batch, T sequence, C width, K classes:
//   x      = Embedding(ids)                      (B, T) -> (B, T, C)   padding rows are 0
//   h      = x + MultiHeadAttention(x, mask)     (B, T, C)             residual self-attention
//   pooled = sdpa(u, h, h, mask)                 (B,1,1,C) x (B,1,T,C) -> (B,1,1,C)
//            attention pooling: one learned query u (C,) attends over the valid positions
//   logits = Linear(pooled)                      (B, 1, C) -> (B, 1, K)
//   loss   = cross_entropy(logits, c)
//
// Before training, the hand-written backward is proved with the library's gradient checker in
// double precision at a tiny size (every parameter, central differences).
//
// Usage: custom_net [steps]   (default 300). Prints the loss as it falls. Exits 0 when the
// gradient check passed and the loss on a held-out batch fell during training, 1 otherwise, 2 on
// a bad argument.
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <string>

#include "attnlab/nn/embedding.hpp"
#include "attnlab/nn/gradcheck_module.hpp"
#include "attnlab/nn/linear.hpp"
#include "attnlab/nn/multi_head_attention.hpp"
#include "attnlab/ops/attention.hpp"
#include "attnlab/ops/cross_entropy.hpp"
#include "attnlab/optim/adamw.hpp"
#include "attnlab/optim/clip.hpp"
#include "attnlab/optim/schedule.hpp"
#include "attnlab/random.hpp"
#include "attnlab/threads.hpp"

using namespace attnlab;

namespace {

constexpr std::size_t kClasses = 4;  // K
constexpr std::size_t kVocab = 16;   // V: class tokens [0, K), noise tokens [K, V)
constexpr std::size_t kLength = 12;  // T, the padded length
constexpr std::size_t kMinLength = 4;
constexpr std::size_t kWidth = 32;            // C
constexpr std::size_t kHeads = 4;             // H
constexpr double kGradcheckTolerance = 1e-6;  // max relative error of the double-precision check
constexpr std::size_t kBatch = 32;            // B

struct Batch {
  TokenIds ids;      // (B, T); kNoToken at padding
  KeyMask mask;      // (B, T); true = may attend (a real token)
  TokenIds targets;  // (B, 1); the class token
};

Batch make_batch(std::size_t batch, Rng& rng) {
  Batch out{TokenIds({batch, kLength}), KeyMask({batch, kLength}), TokenIds({batch, 1})};
  for (std::size_t b = 0; b < batch; ++b) {
    const std::size_t length = kMinLength + rng.below(kLength - kMinLength + 1);
    const std::size_t where = rng.below(length);
    const int label = static_cast<int>(rng.below(kClasses));
    for (std::size_t t = 0; t < kLength; ++t) {
      out.mask(b, t) = t < length;
      out.ids(b, t) = t >= length  ? kNoToken
                      : t == where ? label
                                   : static_cast<int>(kClasses + rng.below(kVocab - kClasses));
    }
    out.targets(b, 0) = label;
  }
  return out;
}

AttentionConfig attention_config(std::size_t width, std::size_t heads) {
  AttentionConfig config;
  config.d_model = width;
  config.heads = heads;
  return config;
}

// A Module like the library's own: named parameters, forward caches, backward adds into grads.
template <class T>
class AttentionPoolingClassifier : public Module<T> {
 public:
  AttentionPoolingClassifier(std::size_t width, std::size_t heads, Rng& rng)
      : width_(width),
        embed_(kVocab, width, rng),
        attn_(attention_config(width, heads), rng),
        query_(make_parameter<T>(randn<T, 1>({width}, rng))),
        head_(width, kClasses, rng) {}

  // Returns logits (B, 1, K) and caches what backward needs.
  Tensor3<T> forward(const Batch& batch) {
    mask_ = batch.mask;
    const Tensor3<T> x = embed_.forward(batch.ids);  // (B, T, C)
    h_ = x + attn_.forward(x, &mask_);               // (B, T, C)
    const std::size_t B = h_.shape()[0], length = h_.shape()[1];
    q_ = Tensor4<T>({B, 1, 1, width_});  // u repeated per batch row: (B, 1, 1, C)
    for (std::size_t b = 0; b < B; ++b) {
      std::copy(query_.value.begin(), query_.value.end(), &q_(b, 0, 0, 0));
    }
    kv_ = Tensor4<T>({B, 1, length, width_});  // (B, T, C) -> (B, 1, T, C): same memory order
    std::copy(h_.begin(), h_.end(), kv_.begin());
    const Tensor4<T> pooled = sdpa_forward(pool_cache_, q_, kv_, kv_, {}, &mask_);
    Tensor3<T> pooled3({B, 1, width_});  // (B, 1, 1, C) -> (B, 1, C)
    std::copy(pooled.begin(), pooled.end(), pooled3.begin());
    return head_.forward(pooled3);  // (B, 1, K)
  }

  // dlogits: (B, 1, K). ADDS into every parameter's grad, in exact reverse order of forward.
  void backward(const Tensor3<T>& dlogits) {
    const Tensor3<T> dpooled3 = head_.backward(dlogits);  // (B, 1, C)
    const std::size_t B = h_.shape()[0];
    Tensor4<T> dpooled({B, 1, 1, width_});
    std::copy(dpooled3.begin(), dpooled3.end(), dpooled.begin());
    const SdpaGrads<T> g = sdpa_backward(dpooled, pool_cache_, q_, kv_, kv_);
    // q_ = u repeated: du = Σ_b dq[b].
    for (std::size_t b = 0; b < B; ++b) {
      for (std::size_t c = 0; c < width_; ++c) query_.grad(c) += g.dq(b, 0, 0, c);
    }
    // kv_ fed both k and v: dh = dk + dv, plus the residual path through the attention layer.
    Tensor3<T> dh(h_.shape());
    for (std::size_t i = 0; i < dh.size(); ++i) dh.data()[i] = g.dk.data()[i] + g.dv.data()[i];
    const Tensor3<T> dx = dh + attn_.backward(dh);  // h = x + attn(x)
    embed_.backward(dx);
  }

  void collect_parameters(const std::string& prefix, ParameterList<T>& out) override {
    embed_.collect_parameters(prefix + "embed.", out);
    attn_.collect_parameters(prefix + "attn.", out);
    out.push_back({prefix + "pool.query", &query_});
    head_.collect_parameters(prefix + "head.", out);
  }

 private:
  std::size_t width_;  // C
  Embedding<T> embed_;
  MultiHeadAttention<T> attn_;
  Parameter<T> query_;  // (C,) the pooling query u
  Linear<T> head_;
  // Cache of the last forward.
  KeyMask mask_;
  Tensor3<T> h_;       // (B, T, C)
  Tensor4<T> q_, kv_;  // (B, 1, 1, C), (B, 1, T, C)
  SdpaCache<T> pool_cache_;
};

struct Evaluation {
  float loss = 0;
  double accuracy = 0;
};

Evaluation evaluate(AttentionPoolingClassifier<float>& net, const Batch& batch) {
  const Tensor3<float> logits = net.forward(batch);
  CrossEntropyCache<float, 3> cache;
  Evaluation e;
  e.loss = cross_entropy_forward(cache, logits, batch.targets);
  std::size_t correct = 0;
  for (std::size_t b = 0; b < logits.shape()[0]; ++b) {
    std::size_t best = 0;
    for (std::size_t k = 1; k < kClasses; ++k) {
      if (logits(b, 0, k) > logits(b, 0, best)) best = k;
    }
    correct += static_cast<int>(best) == batch.targets(b, 0);
  }
  e.accuracy = static_cast<double>(correct) / static_cast<double>(logits.shape()[0]);
  return e;
}

// Proves the classifier's backward (the glue above and every layer under it) against central
// differences of the cross-entropy loss, in double at a tiny width.
bool gradcheck_classifier() {
  Rng rng(7);
  AttentionPoolingClassifier<double> net(8, 2, rng);
  const Batch batch = make_batch(3, rng);
  const GradcheckReport report = check_parameter_gradients(net, [&](bool with_backward) {
    const Tensor3<double> logits = net.forward(batch);
    CrossEntropyCache<double, 3> cache;
    const double loss = cross_entropy_forward(cache, logits, batch.targets);
    if (with_backward) net.backward(cross_entropy_backward(cache));
    return loss;
  });
  const bool ok = report.passed(kGradcheckTolerance);
  std::printf("gradient check of every parameter (double, C=8, H=2, B=3): max rel error %.2e %s\n",
              report.max_rel_error(), ok ? "ok" : "FAILED");
  if (!ok) std::printf("%s", report.table().c_str());
  return ok;
}

}  // namespace

int main(int argc, char** argv) {
  std::size_t steps = 300;
  if (argc > 2 ||
      (argc == 2 && (std::string(argv[1]).find_first_not_of("0123456789") != std::string::npos ||
                     std::string(argv[1]).empty() || std::atol(argv[1]) < 1))) {
    std::fprintf(stderr, "custom_net: error: usage: custom_net [steps >= 1]\n");
    return 2;
  }
  if (argc == 2) steps = static_cast<std::size_t>(std::atol(argv[1]));

  try {
    set_num_threads(1);
    if (!gradcheck_classifier()) return 1;
    Rng rng(2024);
    AttentionPoolingClassifier<float> net(kWidth, kHeads, rng);
    ParameterList<float> params = net.parameters();
    AdamWOptions options;
    options.lr = 3e-3;
    options.weight_decay = 0.01;
    AdamW<float> optimizer(params, options);
    const auto schedule = LrSchedule::warmup_cosine(options.lr, options.lr / 10,
                                                    std::min<std::size_t>(20, steps / 5), steps);
    std::size_t count = 0;
    for (const auto& p : params) count += p.param->value.size();
    std::printf("custom_net: attention-pooling classifier, %zu parameters in %zu tensors\n", count,
                params.size());

    Rng held_out_rng(99);
    const Batch held_out = make_batch(256, held_out_rng);
    const Evaluation initial = evaluate(net, held_out);
    std::printf("step %5zu  held-out loss %.4f  accuracy %.3f\n", std::size_t{0}, initial.loss,
                initial.accuracy);

    const std::size_t log_every = std::max<std::size_t>(1, steps / 10);
    float running = 0;  // summed train loss since the last log line
    std::size_t since_log = 0;
    for (std::size_t step = 0; step < steps; ++step) {
      const Batch batch = make_batch(kBatch, rng);
      const auto result = softmax_cross_entropy<float, 3>(net.forward(batch), batch.targets);
      optimizer.zero_grad();
      net.backward(result.dlogits);
      const double norm = clip_grad_norm(params, 1.0);
      optimizer.set_lr(schedule.lr_at(step));
      optimizer.step();
      running += result.loss;
      ++since_log;
      if ((step + 1) % log_every == 0 || step + 1 == steps) {
        std::printf("step %5zu  train loss %.4f  grad norm %.3f  lr %.2e\n", step + 1,
                    running / static_cast<float>(since_log), norm, optimizer.lr());
        running = 0;
        since_log = 0;
      }
    }

    const Evaluation final_eval = evaluate(net, held_out);
    std::printf("step %5zu  held-out loss %.4f  accuracy %.3f\n", steps, final_eval.loss,
                final_eval.accuracy);
    if (!(final_eval.loss < initial.loss)) {
      std::fprintf(stderr, "custom_net: the held-out loss did not fall (%.4f -> %.4f)\n",
                   initial.loss, final_eval.loss);
      return 1;
    }
    std::printf("custom_net: held-out loss fell from %.4f to %.4f\n", initial.loss,
                final_eval.loss);
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "custom_net: error: %s\n", e.what());
    return 1;
  }
}
