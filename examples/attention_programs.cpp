// attention_programs: attention programs written in your own C++ (attnlab/attention/program.hpp),
// run inside MultiHeadAttention on the CPU paths and trained with AdamW.
//
//  - a score program, LearnedRelativeBias: S_ij = u_ij + table[h][clamp(j − i, −R, R) + R], the
//    table a parameter of the layer ("attn.program.table"), its gradient from the dual numbers;
//  - a mask program, PrefixLM: every query sees the prefix (bidirectional), and later keys
//    causally. It is evaluated once into a BlockMask and handed to every forward in a
//    SequenceLayout.
//
// Task (synthetic copy): the input is x_0 .. x_{P−1}, SEP, x_0 .. x_{P−2}; the model predicts
// x_0 .. x_{P−1} at positions P .. 2P − 1 (no target on the prefix). The answer to the query at
// P + k is the key at k, a fixed distance P back: the model has no position encoding, so only the
// learned relative bias can find it.
//
// Model, shapes with B batch, T = 2P sequence, C width, V vocabulary:
//   x      = Embedding(ids)                                    (B, T) -> (B, T, C)
//   h      = x + MultiHeadAttention(x; PrefixLM, LearnedRelativeBias)
//   logits = Linear(h)                                         (B, T, C) -> (B, T, V)
//
// Before training, the layer with both programs is gradient-checked in double (every parameter,
// the table included, and the input). Usage: attention_programs [steps] (default 300). Exits 0
// when the check passed and the held-out loss fell below half its start, 1 otherwise, 2 on a bad
// argument.
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <memory>
#include <string>
#include <vector>

#include "attnlab/nn/embedding.hpp"
#include "attnlab/nn/gradcheck_module.hpp"
#include "attnlab/nn/linear.hpp"
#include "attnlab/nn/multi_head_attention.hpp"
#include "attnlab/ops/cross_entropy.hpp"
#include "attnlab/optim/adamw.hpp"
#include "attnlab/random.hpp"
#include "attnlab/threads.hpp"

using namespace attnlab;

namespace {

constexpr std::size_t kSymbols = 10;          // x in [0, 10); SEP = 10
constexpr std::size_t kVocab = kSymbols + 1;  // V
constexpr std::size_t kPrefix = 8;            // P
constexpr std::size_t kLength = 2 * kPrefix;  // T
// R, the largest distance the bias tells apart: every distance up to T − 1 has its own entry
// (with R = P the distances beyond P would share P's, and the copy could not find its key).
constexpr std::size_t kMaxDistance = kLength - 1;
constexpr std::size_t kWidth = 32;  // C
constexpr std::size_t kHeads = 2;   // H
constexpr std::size_t kBatch = 32;  // B
constexpr int kSep = static_cast<int>(kSymbols);

// The score program: a learned bias per head and clamped distance j − i. Templated on the score
// type S (T in the forward, a dual number in the backward); params(0, e) reads the table.
struct LearnedRelativeBias {
  std::size_t max_distance = 0;  // R
  template <class S>
  S operator()(S u, std::size_t, std::size_t h, std::size_t i, std::size_t j,
               const attention::ProgramParams<S>& params) const {
    const auto r = static_cast<std::ptrdiff_t>(max_distance);
    const std::ptrdiff_t rel =
        std::clamp(static_cast<std::ptrdiff_t>(j) - static_cast<std::ptrdiff_t>(i), -r, r);
    return u + params(0, h * (2 * max_distance + 1) + static_cast<std::size_t>(rel + r));
  }
};

// The mask program: the first `prefix` keys are seen by every query, the rest causally.
struct PrefixLM {
  std::size_t prefix = 0;
  bool operator()(std::size_t, std::size_t, std::size_t i, std::size_t j) const {
    return j < prefix || j <= i;
  }
};

// The prefix mask reads neither b nor h: one block mask serves any batch size and head count.
SequenceLayout prefix_layout() {
  SequenceLayout layout;
  layout.block_mask = std::make_shared<const attention::BlockMask>(attention::build_block_mask(
      attention::mask_program(PrefixLM{kPrefix + 1}, "prefix-LM", {false, false}),
      {.B = 1, .H = 1, .Hkv = 1, .Tq = kLength, .Tk = kLength, .D = 1, .Dv = 1}, 4, 4));
  return layout;
}

AttentionConfig attention_config(std::size_t width, std::size_t heads) {
  AttentionConfig config;
  config.d_model = width;
  config.heads = heads;
  config.sdpa.causal = false;  // the mask program carries the causality
  return config;
}

// The layer's score program, its table drawn from rng: a parameter of the layer from here on.
template <class T>
void add_relative_bias(MultiHeadAttention<T>& attn, Rng& rng) {
  std::vector<double> table(attn.config().heads * (2 * kMaxDistance + 1));
  for (double& v : table) v = 0.1 * rng.normal();
  attn.set_score_program(
      {attention::score_program(LearnedRelativeBias{kMaxDistance}, "learned relative bias"),
       {{"table", table}}});
}

struct Batch {
  TokenIds ids;      // (B, T)
  TokenIds targets;  // (B, T); -100 on the prefix
};

Batch make_batch(std::size_t batch, Rng& rng) {
  Batch out{TokenIds({batch, kLength}), TokenIds({batch, kLength})};
  for (std::size_t b = 0; b < batch; ++b) {
    std::vector<int> x(kPrefix);
    for (int& v : x) v = static_cast<int>(rng.below(kSymbols));
    for (std::size_t t = 0; t < kLength; ++t) {
      out.ids(b, t) = t < kPrefix ? x[t] : t == kPrefix ? kSep : x[t - kPrefix - 1];
      out.targets(b, t) = t < kPrefix ? -100 : x[t - kPrefix];
    }
  }
  return out;
}

template <class T>
class CopyNet : public Module<T> {
 public:
  explicit CopyNet(Rng& rng)
      : embed_(kVocab, kWidth, rng),
        attn_(attention_config(kWidth, kHeads), rng),
        head_(kWidth, kVocab, rng),
        layout_(prefix_layout()) {
    add_relative_bias(attn_, rng);
  }

  Tensor3<T> forward(const TokenIds& ids) {
    const Tensor3<T> x = embed_.forward(ids);
    const Buffer<T> a = attn_.forward(to_buffer<T>(attn_.ops(), x), nullptr, &layout_);
    return head_.forward(Tensor3<T>(x + to_tensor<T, 3>(a, "CopyNet")));
  }
  void backward(const Tensor3<T>& dlogits) {
    const Tensor3<T> dh = head_.backward(dlogits);
    embed_.backward(Tensor3<T>(dh + attn_.backward(dh)));  // h = x + attn(x)
  }
  void collect_parameters(const std::string& prefix, ParameterList<T>& out) override {
    embed_.collect_parameters(prefix + "embed.", out);
    attn_.collect_parameters(prefix + "attn.", out);
    head_.collect_parameters(prefix + "head.", out);
  }

 private:
  Embedding<T> embed_;
  MultiHeadAttention<T> attn_;
  Linear<T> head_;
  SequenceLayout layout_;
};

// The layer with both programs against central differences, in double.
bool gradcheck_layer() {
  Rng rng(7);
  MultiHeadAttention<double> attn(attention_config(8, 2), rng);
  add_relative_bias(attn, rng);
  const SequenceLayout layout = prefix_layout();
  const Tensor3<double> x = randn<double, 3>({2, kLength, 8}, rng);
  const GradcheckReport report = check_module_gradients(
      attn, x,
      [&](const Tensor3<double>& in) {
        return to_tensor<double, 3>(
            attn.forward(to_buffer<double>(attn.ops(), in), nullptr, &layout), "gradcheck");
      },
      [&](const Tensor3<double>& dy) { return attn.backward(dy); });
  const bool ok = report.passed(1e-6);
  std::printf("gradient check of the layer with both programs (double): max rel error %.2e %s\n",
              report.max_rel_error(), ok ? "ok" : "FAILED");
  if (!ok) std::printf("%s", report.table().c_str());
  return ok;
}

float loss_of(CopyNet<float>& net, const Batch& batch) {
  CrossEntropyCache<float, 3> cache;
  return cross_entropy_forward(cache, net.forward(batch.ids), batch.targets);
}

}  // namespace

int main(int argc, char** argv) {
  std::size_t steps = 300;
  if (argc > 2 ||
      (argc == 2 && (std::string(argv[1]).find_first_not_of("0123456789") != std::string::npos ||
                     std::string(argv[1]).empty() || std::atol(argv[1]) < 1))) {
    std::fprintf(stderr, "attention_programs: error: usage: attention_programs [steps >= 1]\n");
    return 2;
  }
  if (argc == 2) steps = static_cast<std::size_t>(std::atol(argv[1]));
  try {
    set_num_threads(1);
    if (!gradcheck_layer()) return 1;
    Rng rng(2024);
    CopyNet<float> net(rng);
    ParameterList<float> params = net.parameters();
    AdamWOptions options;
    options.lr = 1e-2;
    options.weight_decay = 0;
    AdamW<float> optimizer(params, options);
    Rng held_out_rng(99);
    const Batch held_out = make_batch(256, held_out_rng);
    const float initial = loss_of(net, held_out);
    std::printf("step %5zu  held-out loss %.4f\n", std::size_t{0}, initial);
    const std::size_t log_every = std::max<std::size_t>(1, steps / 10);
    for (std::size_t step = 1; step <= steps; ++step) {
      const Batch batch = make_batch(kBatch, rng);
      const auto result = softmax_cross_entropy<float, 3>(net.forward(batch.ids), batch.targets);
      optimizer.zero_grad();
      net.backward(result.dlogits);
      optimizer.step();
      if (step % log_every == 0 || step == steps) {
        std::printf("step %5zu  train loss %.4f\n", step, result.loss);
      }
    }
    const float final_loss = loss_of(net, held_out);
    std::printf("step %5zu  held-out loss %.4f (from %.4f)\n", steps, final_loss, initial);
    return final_loss < 0.5f * initial ? 0 : 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "attention_programs: error: %s\n", e.what());
    return 1;
  }
}
