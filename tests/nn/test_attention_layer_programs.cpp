// MultiHeadAttention with attention programs: a score program whose captured parameters are the
// layer's own, and a per-forward SequenceLayout (packed documents' block mask and RoPE positions).
#include <doctest/doctest.h>

#include <cmath>
#include <string>
#include <vector>

#include "attnlab/attention/programs.hpp"
#include "attnlab/nn/gradcheck_module.hpp"
#include "attnlab/nn/multi_head_attention.hpp"
#include "attnlab/nn/transformer.hpp"
#include "helpers.hpp"

using namespace attnlab;

namespace {

AttentionConfig small_attention(bool causal, SdpaPath path) {
  AttentionConfig c;
  c.d_model = 8;
  c.heads = 2;
  c.sdpa.causal = causal;
  c.sdpa.path = path;
  c.sdpa.tile_rows = 4;  // small tiles: the fused path crosses tile edges on short inputs
  c.sdpa.tile_keys = 4;
  return c;
}

// A learned relative-position bias (attention::programs::RelativeBias) with max distance R: the
// layer's parameter "program.table" holds H rows of 2R + 1 entries.
ScoreProgramSpec relative_bias(std::size_t heads, std::size_t R, Rng& rng) {
  std::vector<double> table(heads * (2 * R + 1));
  for (double& v : table) v = 0.5 * rng.normal();
  return {attention::relative_bias_program(R), {{"table", table}}};
}

Tensor3<double> rows(const Tensor3<double>& x, std::size_t b, std::size_t t0, std::size_t n) {
  const std::size_t C = x.shape()[2];
  Tensor3<double> out({1, n, C});
  std::copy(x.data() + (b * x.shape()[1] + t0) * C, x.data() + (b * x.shape()[1] + t0 + n) * C,
            out.data());
  return out;
}

std::vector<double> grads_of(MultiHeadAttention<double>& m) {
  std::vector<double> g;
  for (const auto& p : m.parameters())
    g.insert(g.end(), p.param->grad.begin(), p.param->grad.end());
  return g;
}

// The largest |a − b| over two containers of the same size (vectors or tensors).
template <class A, class B>
double max_abs_diff(const A& a, const B& b) {
  REQUIRE(a.size() == b.size());
  double worst = 0;
  auto j = b.begin();
  for (auto i = a.begin(); i != a.end(); ++i, ++j) worst = std::max(worst, std::abs(*i - *j));
  return worst;
}

}  // namespace

TEST_CASE("MultiHeadAttention: a score program's parameters are the layer's, gradient-checked") {
  for (const SdpaPath path : {SdpaPath::reference, SdpaPath::fused}) {
    CAPTURE(to_string(path));
    Rng rng(201);
    MultiHeadAttention<double> m(small_attention(true, path), rng);
    Rng init(203);
    m.set_score_program(relative_bias(2, 3, init));
    const ParameterList<double> params = m.parameters();
    REQUIRE(params.size() == 5);
    CHECK(params.back().name == "program.table");
    CHECK(params.back().param->size() == 2 * 7);

    Rng data(207);
    const auto x = randn<double, 3>({2, 9, 8}, data);
    const auto report = check_module_gradients(m, x);
    INFO(report.table());
    CHECK(report.passed(1e-7));
    bool table_row = false;
    for (const auto& r : report.results) table_row = table_row || r.name == "program.table";
    CHECK(table_row);

    // The program is in the forward: changing the table changes the output.
    const Tensor3<double> y = m.forward(x);
    m.program_parameter(0).value(3) += 1.0;
    CHECK(test::rel_error(m.forward(x), y) > 1e-4);
  }
}

TEST_CASE("MultiHeadAttention: a score program refuses what it replaces and late registration") {
  Rng rng(211), init(213);
  AttentionConfig alibi = small_attention(true, SdpaPath::reference);
  alibi.alibi = true;
  MultiHeadAttention<double> with_alibi(alibi, rng);
  CHECK_THROWS_WITH_AS(with_alibi.set_score_program(relative_bias(2, 2, init)),
                       doctest::Contains("no alibi and no sdpa.softcap"), std::invalid_argument);
  MultiHeadAttention<double> m(small_attention(true, SdpaPath::reference), rng);
  CHECK_THROWS_WITH_AS(m.set_score_program({attention::relative_bias_program(2), {{"a.b", {1.0}}}}),
                       doctest::Contains("without '.'"), std::invalid_argument);
  m.set_score_program(relative_bias(2, 2, init));
  CHECK_THROWS_AS(m.set_score_program(relative_bias(2, 2, init)), std::logic_error);
  KVCache<double> cache;
  CHECK_THROWS_WITH_AS(
      m.forward_cached(to_buffer<double>(m.ops(), randn<double, 3>({1, 2, 8}, rng)), cache),
      doctest::Contains("none with a KV cache"), std::invalid_argument);
}

// The defining property of packed documents: attention restricted to each document, causal
// within it, with RoPE restarting at each document, gives every token the output (and every
// weight the gradient) it gets when each document runs alone.
TEST_CASE("MultiHeadAttention: a document layout equals running each document alone") {
  const std::size_t B = 2, T = 12;
  // Row 0: three documents (5, 3, 4 tokens); row 1: two (7, 5); ids compare within a row only.
  const std::vector<std::int32_t> ids = {0, 0, 0, 0, 0, 1, 1, 1, 2, 2, 2, 2,
                                         5, 5, 5, 5, 5, 5, 5, 0, 0, 0, 0, 0};
  const std::vector<std::vector<std::size_t>> starts = {{0, 5, 8, 12}, {0, 7, 12}};
  for (const SdpaPath path : {SdpaPath::reference, SdpaPath::fused}) {
    CAPTURE(to_string(path));
    AttentionConfig c = small_attention(true, path);
    c.rope = true;
    Rng rng(221);
    MultiHeadAttention<double> m(c, rng);
    Rng data(223);
    const auto x = randn<double, 3>({B, T, 8}, data);
    const auto dy = randn<double, 3>({B, T, 8}, data);
    const SequenceLayout layout = document_layout(ids, B, T, /*restart_positions=*/true, 4, 4);
    CHECK(layout.positions == std::vector<std::size_t>{0, 1, 2, 3, 4, 0, 1, 2, 0, 1, 2, 3,
                                                       0, 1, 2, 3, 4, 5, 6, 0, 1, 2, 3, 4});
    // Tiles of 4 × 4 over 12 keys: the fused path computes under half the scores (causal alone:
    // 6 of 9 tiles, 0.67), skipping the keys of earlier documents.
    CHECK(layout.block_mask->density() < 0.5);

    m.zero_grad();
    const Tensor3<double> y =
        to_tensor<double, 3>(m.forward(to_buffer<double>(m.ops(), x), nullptr, &layout), "test");
    const Tensor3<double> dx =
        to_tensor<double, 3>(m.backward(to_buffer<double>(m.ops(), dy)), "test");
    const std::vector<double> packed_grads = grads_of(m);

    m.zero_grad();
    double worst_y = 0, worst_dx = 0;
    for (std::size_t b = 0; b < B; ++b) {
      for (std::size_t d = 0; d + 1 < starts[b].size(); ++d) {
        const std::size_t t0 = starts[b][d], n = starts[b][d + 1] - t0;
        const Tensor3<double> y_doc = m.forward(rows(x, b, t0, n));
        const Tensor3<double> dx_doc = m.backward(rows(dy, b, t0, n));
        worst_y = std::max(worst_y, max_abs_diff(y_doc, rows(y, b, t0, n)));
        worst_dx = std::max(worst_dx, max_abs_diff(dx_doc, rows(dx, b, t0, n)));
      }
    }
    CHECK(worst_y < 1e-12);
    CHECK(worst_dx < 1e-12);
    CHECK(max_abs_diff(grads_of(m), packed_grads) < 1e-12);

    // Without the layout the same packed input is one causal sequence: a different output.
    CHECK(max_abs_diff(m.forward(x), y) > 1e-3);
  }
}

TEST_CASE("MultiHeadAttention: a document layout with RoPE positions needs them to fit") {
  Rng rng(231);
  AttentionConfig c = small_attention(true, SdpaPath::reference);
  c.rope = true;
  MultiHeadAttention<double> m(c, rng);
  const auto x = to_buffer<double>(m.ops(), randn<double, 3>({1, 4, 8}, rng));
  SequenceLayout layout = document_layout({0, 0, 1, 1}, 1, 4, true);
  layout.positions.pop_back();
  CHECK_THROWS_WITH_AS(m.forward(x, nullptr, &layout), doctest::Contains("layout.positions"),
                       std::invalid_argument);
  // A block mask for another length is refused.
  const SequenceLayout other = document_layout({0, 0, 1}, 1, 3, false);
  CHECK_THROWS_AS(m.forward(x, nullptr, &other), std::invalid_argument);
  // A window cannot be replaced silently.
  AttentionConfig w = small_attention(true, SdpaPath::reference);
  w.sdpa.window = 2;
  MultiHeadAttention<double> windowed(w, rng);
  const SequenceLayout fits = document_layout({0, 0, 1, 1}, 1, 4, false);
  CHECK_THROWS_WITH_AS(windowed.forward(x, nullptr, &fits), doctest::Contains("sdpa.window"),
                       std::invalid_argument);
  CHECK_THROWS_WITH_AS(document_layout({0, 0, 1}, 1, 4, false),
                       doctest::Contains("document_layout: documents expected B·T = 4"),
                       std::invalid_argument);
}

TEST_CASE("Transformer: one document layout for every block, positions need RoPE") {
  TransformerConfig c;
  c.vocab_sizes = {11};
  c.out_vocab = 11;
  c.max_len = 8;
  c.layers = 2;
  c.block.attention.d_model = 8;
  c.block.attention.heads = 2;
  c.block.attention.sdpa.causal = true;
  c.block.d_ff = 16;
  c.positions = PositionEncoding::rope;
  Rng rng(241);
  Transformer<double> net(c, rng);
  TokenIds ids = TokenIds::from_shape({1, 8});
  for (std::size_t t = 0; t < 8; ++t) ids(0, t) = static_cast<int>(t + 1);
  const std::vector<std::int32_t> docs = {0, 0, 0, 1, 1, 1, 1, 1};
  const SequenceLayout layout = document_layout(docs, 1, 8, true);
  const Tensor3<double> packed =
      to_tensor<double, 3>(net.forward(net.upload_fields({ids}), nullptr, &layout), "test");
  // The second document alone gives the same logits as its rows of the packed forward.
  TokenIds second = TokenIds::from_shape({1, 5});
  for (std::size_t t = 0; t < 5; ++t) second(0, t) = ids(0, t + 3);
  const Tensor3<double> alone = net.forward({second});
  double worst = 0;
  for (std::size_t t = 0; t < 5; ++t) {
    for (std::size_t v = 0; v < 11; ++v) {
      worst = std::max(worst, std::abs(alone(0, t, v) - packed(0, t + 3, v)));
    }
  }
  CHECK(worst < 1e-12);

  c.positions = PositionEncoding::learned;
  Transformer<double> learned(c, rng);
  CHECK_THROWS_WITH_AS(learned.forward(learned.upload_fields({ids}), nullptr, &layout),
                       doctest::Contains("layout.positions expected positions = rope"),
                       std::invalid_argument);
}
