// One attention test case for every variant's test (tests/ops/test_attention_*.cpp): the shapes and
// the switches the variants combine, the options they name, and the check of a path against the
// dense definition (dense_attention.hpp) on random inputs.
#pragma once

#include <doctest/doctest.h>

#include <cstddef>
#include <cstdint>

#include "attention_checks.hpp"
#include "attention_paths.hpp"
#include "attnlab/attention/dropout.hpp"
#include "attnlab/ops/attention.hpp"
#include "attnlab/random.hpp"
#include "dense_attention.hpp"
#include "helpers.hpp"

namespace attnlab::test {

// q (B,H,Tq,D), k (B,Hkv,Tk,D), v (B,Hkv,Tk,Dv); causal with a query offset and a window; a key
// mask (random_inputs'); ALiBi; a (1, H, Tq, Tk) additive bias; dropout with probability `dropout`.
struct AttentionCase {
  std::size_t B, H, Hkv, Tq, Tk, D, Dv;
  bool causal = false;
  std::size_t offset = 0, window = 0;
  bool mask = false, alibi = false, bias = false;
  double dropout = 0;
};

// The options a case names (dropout keyed by `dropout_seed`); a variant's test sets its own on top.
inline SdpaOptions case_options(const AttentionCase& c, std::uint64_t dropout_seed = 77) {
  SdpaOptions options;
  options.causal = c.causal;
  options.query_offset = c.offset;
  options.window = c.window;
  if (c.alibi) options.alibi_slopes = alibi_slopes(c.H);
  options.dropout_p = c.dropout;
  options.dropout_seed = dropout_seed;
  return options;
}

// `path` on q, k, v and the key mask drawn from `rng` (random_inputs, mask hiding keys first,
// first + every, ...), then a (1, H, Tq, Tk) bias drawn after them when c.bias (or `bias` as
// given), against the dense definition with dropout's keep mask, to `tolerance`. Returns the
// dense output, for a test's further checks.
inline Tensor4<double> check_case_against_dense(Path path, const AttentionCase& c,
                                                const SdpaOptions& options, Rng& rng,
                                                const Tensor4<double>* bias = nullptr,
                                                std::size_t first = 2, std::size_t every = 5,
                                                double tolerance = 1e-13) {
  CAPTURE(name_of(path));
  CAPTURE(c.causal);
  CAPTURE(c.offset);
  CAPTURE(c.window);
  CAPTURE(c.Hkv);
  CAPTURE(c.Tq);
  CAPTURE(c.dropout);
  const auto [q, k, v, mask] =
      random_inputs(rng, c.B, c.H, c.Hkv, c.Tq, c.Tk, c.D, c.Dv, first, every);
  Tensor4<double> drawn;
  if (!bias && c.bias) {
    drawn = randn<double, 4>({1, c.H, c.Tq, c.Tk}, rng);
    bias = &drawn;
  }
  const KeyMask* m = c.mask ? &mask : nullptr;
  const auto keep = sdpa_dropout_mask(options, c.B, c.H, c.Tq, c.Tk);
  const Result r = run(path, q, k, v, nullptr, options, m, bias);
  REQUIRE(all_finite(r.out));
  Tensor4<double> want = dense_attention(q, k, v, options, m, bias, &keep);
  CHECK(rel_error(r.out, want) < tolerance);
  return want;
}

}  // namespace attnlab::test
