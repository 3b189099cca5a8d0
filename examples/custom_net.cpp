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
// Usage: custom_net [steps]   (default 300). Prints the loss as it falls. Exits 0 when the loss on
// a held-out batch fell during training, 1 when it did not, 2 on a bad argument.
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <string>

#include "attnlab/nn/embedding.hpp"
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
constexpr std::size_t kWidth = 32;  // C
constexpr std::size_t kHeads = 4;   // H
constexpr std::size_t kBatch = 32;  // B

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

AttentionConfig attention_config() {
  AttentionConfig config;
  config.d_model = kWidth;
  config.heads = kHeads;
  return config;
}

class AttentionPoolingClassifier {
 public:
  explicit AttentionPoolingClassifier(Rng& rng)
      : embed_(kVocab, kWidth, rng),
        attn_(attention_config(), rng),
        query_(make_parameter<float>(randn<float, 1>({kWidth}, rng))),
        head_(kWidth, kClasses, rng) {}

  // Returns logits (B, 1, K) and caches what backward needs.
  Tensor3<float> forward(const Batch& batch) {
    mask_ = batch.mask;
    const Tensor3<float> x = embed_.forward(batch.ids);  // (B, T, C)
    h_ = x + attn_.forward(x, &mask_);                   // (B, T, C)
    const std::size_t B = h_.shape()[0], T = h_.shape()[1];
    q_ = Tensor4<float>({B, 1, 1, kWidth});  // u repeated per batch row: (B, 1, 1, C)
    for (std::size_t b = 0; b < B; ++b) {
      std::copy(query_.value.begin(), query_.value.end(), &q_(b, 0, 0, 0));
    }
    kv_ = Tensor4<float>({B, 1, T, kWidth});  // (B, T, C) -> (B, 1, T, C): same memory order
    std::copy(h_.begin(), h_.end(), kv_.begin());
    const Tensor4<float> pooled = sdpa_forward(pool_cache_, q_, kv_, kv_, {}, &mask_);
    Tensor3<float> pooled3({B, 1, kWidth});  // (B, 1, 1, C) -> (B, 1, C)
    std::copy(pooled.begin(), pooled.end(), pooled3.begin());
    return head_.forward(pooled3);  // (B, 1, K)
  }

  // dlogits: (B, 1, K). ADDS into every parameter's grad, in exact reverse order of forward.
  void backward(const Tensor3<float>& dlogits) {
    const Tensor3<float> dpooled3 = head_.backward(dlogits);  // (B, 1, C)
    const std::size_t B = h_.shape()[0];
    Tensor4<float> dpooled({B, 1, 1, kWidth});
    std::copy(dpooled3.begin(), dpooled3.end(), dpooled.begin());
    const SdpaGrads<float> g = sdpa_backward(dpooled, pool_cache_, q_, kv_, kv_);
    // q_ = u repeated: du = Σ_b dq[b].
    for (std::size_t b = 0; b < B; ++b) {
      for (std::size_t c = 0; c < kWidth; ++c) query_.grad(c) += g.dq(b, 0, 0, c);
    }
    // kv_ fed both k and v: dh = dk + dv, plus the residual path through the attention layer.
    Tensor3<float> dh(h_.shape());
    for (std::size_t i = 0; i < dh.size(); ++i) dh.data()[i] = g.dk.data()[i] + g.dv.data()[i];
    const Tensor3<float> dx = dh + attn_.backward(dh);  // h = x + attn(x)
    embed_.backward(dx);
  }

  ParameterList<float> parameters() {
    ParameterList<float> out;
    embed_.collect_parameters("embed.", out);
    attn_.collect_parameters("attn.", out);
    out.push_back({"pool.query", &query_});
    head_.collect_parameters("head.", out);
    return out;
  }

 private:
  Embedding<float> embed_;
  MultiHeadAttention<float> attn_;
  Parameter<float> query_;  // (C,) the pooling query u
  Linear<float> head_;
  // Cache of the last forward.
  KeyMask mask_;
  Tensor3<float> h_;       // (B, T, C)
  Tensor4<float> q_, kv_;  // (B, 1, 1, C), (B, 1, T, C)
  SdpaCache<float> pool_cache_;
};

struct Evaluation {
  float loss = 0;
  double accuracy = 0;
};

Evaluation evaluate(AttentionPoolingClassifier& net, const Batch& batch) {
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
    Rng rng(2024);
    AttentionPoolingClassifier net(rng);
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
