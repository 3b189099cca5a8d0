#include "attnlab/app/tasks.hpp"

#include "attnlab/app/text.hpp"

#include <algorithm>
#include <cstdint>
#include <numeric>
#include <stdexcept>
#include <string>

namespace attnlab::app {

namespace {
void require(bool ok, const char* field, const std::string& what, int got) {
  check_arg(ok, "task", field, what, std::to_string(got));
}

// k distinct ids from [0, n) in random order (partial Fisher-Yates).
std::vector<int> distinct(int n, int k, Rng& rng) {
  std::vector<int> ids(static_cast<std::size_t>(n));
  std::iota(ids.begin(), ids.end(), 0);
  for (int i = 0; i < k; ++i) {
    const auto j = static_cast<std::size_t>(i) + rng.below(static_cast<std::uint64_t>(n - i));
    std::swap(ids[static_cast<std::size_t>(i)], ids[j]);
  }
  ids.resize(static_cast<std::size_t>(k));
  return ids;
}
}  // namespace

TaskShape task_shape(const TaskConfig& c) {
  TaskShape s;
  switch (c.kind) {
    case TaskKind::recall:
      require(c.keys >= 1, "keys", ">= 1", c.keys);
      require(c.values >= 1, "values", ">= 1", c.values);
      require(c.pairs >= 1 && c.pairs <= c.keys, "pairs", "in [1, keys]", c.pairs);
      s.field_vocab = {c.keys, c.values};
      s.output_vocab = c.values;
      s.seq_len = c.pairs + 1;
      break;
    case TaskKind::mqar:
      require(c.keys >= 1, "keys", ">= 1", c.keys);
      require(c.values >= 1, "values", ">= 1", c.values);
      require(c.pairs >= 1 && c.pairs <= c.keys, "pairs", "in [1, keys]", c.pairs);
      require(c.queries >= 1 && c.queries <= c.pairs, "queries", "in [1, pairs]", c.queries);
      s.field_vocab = {c.keys + c.values};
      s.output_vocab = c.keys + c.values;
      s.seq_len = 2 * c.pairs + c.queries;
      break;
    case TaskKind::reverse:
    case TaskKind::sort:
      require(c.symbols >= 2, "symbols", ">= 2", c.symbols);
      require(c.length >= 1, "length", ">= 1", c.length);
      s.field_vocab = {c.symbols};
      s.output_vocab = c.symbols;
      s.seq_len = c.length;
      break;
    case TaskKind::text: {
      require(c.block >= 1, "block", ">= 1", c.block);
      const int V = static_cast<int>(TextVocab(c).size());
      s.field_vocab = {V};
      s.output_vocab = V;
      s.seq_len = c.block;
      break;
    }
  }
  return s;
}

Batch generate_batch(const TaskConfig& c, std::size_t batch, Rng& rng) {
  check_arg(c.kind != TaskKind::text, "generate_batch", "task", "a generated task",
            "text (its batches come from the text: text_batch)");
  const TaskShape shape = task_shape(c);
  const auto T = static_cast<std::size_t>(shape.seq_len);
  Batch out;
  for (std::size_t f = 0; f < shape.field_vocab.size(); ++f)
    out.fields.push_back(TokenIds::from_shape({batch, T}));
  out.targets = TokenIds::from_shape({batch, T});
  out.targets.fill(kIgnoreIndex);
  for (std::size_t b = 0; b < batch; ++b) {
    switch (c.kind) {
      case TaskKind::recall: {
        const auto keys = distinct(c.keys, c.pairs, rng);
        for (int i = 0; i < c.pairs; ++i) {
          out.fields[0](b, i) = keys[static_cast<std::size_t>(i)];
          out.fields[1](b, i) = static_cast<int>(rng.below(static_cast<std::uint64_t>(c.values)));
        }
        const auto q = static_cast<std::size_t>(rng.below(static_cast<std::uint64_t>(c.pairs)));
        out.fields[0](b, T - 1) = keys[q];
        out.fields[1](b, T - 1) = kAbsent;
        out.targets(b, T - 1) = out.fields[1](b, q);
        break;
      }
      case TaskKind::mqar: {
        const auto keys = distinct(c.keys, c.pairs, rng);
        std::vector<int> values(keys.size());
        for (int i = 0; i < c.pairs; ++i) {
          const auto si = static_cast<std::size_t>(i);
          values[si] = c.keys + static_cast<int>(rng.below(static_cast<std::uint64_t>(c.values)));
          out.fields[0](b, 2 * si) = keys[si];
          out.fields[0](b, 2 * si + 1) = values[si];
        }
        const auto picks = distinct(c.pairs, c.queries, rng);
        for (int j = 0; j < c.queries; ++j) {
          const auto pos = static_cast<std::size_t>(2 * c.pairs + j);
          const auto pick = static_cast<std::size_t>(picks[static_cast<std::size_t>(j)]);
          out.fields[0](b, pos) = keys[pick];
          out.targets(b, pos) = values[pick];
        }
        break;
      }
      case TaskKind::reverse:
      case TaskKind::sort: {
        std::vector<int> x(T);
        for (auto& v : x) v = static_cast<int>(rng.below(static_cast<std::uint64_t>(c.symbols)));
        std::vector<int> y = x;
        if (c.kind == TaskKind::reverse)
          std::reverse(y.begin(), y.end());
        else
          std::sort(y.begin(), y.end());
        for (std::size_t t = 0; t < T; ++t) {
          out.fields[0](b, t) = x[t];
          out.targets(b, t) = y[t];
        }
        break;
      }
      case TaskKind::text:
        break;  // refused above
    }
  }
  return out;
}

Batch eval_batch(const TaskConfig& config, std::size_t n) {
  Rng rng(kEvalSeed + static_cast<std::uint64_t>(config.kind));
  return generate_batch(config, n, rng);
}

Batch gather_batch(const Batch& batch, const std::vector<std::size_t>& rows) {
  const std::size_t T = batch.length();
  Batch out;
  auto copy = [&](const TokenIds& src) {
    TokenIds dst = TokenIds::from_shape({rows.size(), T});
    for (std::size_t i = 0; i < rows.size(); ++i)
      std::copy_n(src.data() + rows[i] * T, T, dst.data() + i * T);
    return dst;
  };
  for (const auto& f : batch.fields) out.fields.push_back(copy(f));
  out.targets = copy(batch.targets);
  if (batch.documents.size() != 0) out.documents = copy(batch.documents);
  out.restart_positions = batch.restart_positions;
  return out;
}

Batch slice_batch(const Batch& batch, std::size_t begin, std::size_t end) {
  std::vector<std::size_t> rows(end - begin);
  std::iota(rows.begin(), rows.end(), begin);
  return gather_batch(batch, rows);
}

std::vector<int> recall_key_positions(const Batch& batch) {
  const std::size_t B = batch.size(), T = batch.length();
  std::vector<int> pos(B, -1);
  if (batch.fields.empty() || T < 2) return pos;
  const TokenIds& keys = batch.fields[0];
  for (std::size_t b = 0; b < B; ++b)
    for (std::size_t j = 0; j + 1 < T; ++j)
      if (keys(b, j) == keys(b, T - 1)) {
        pos[b] = static_cast<int>(j);
        break;
      }
  return pos;
}

}  // namespace attnlab::app
