// Small shared helpers for the test suite.
#pragma once

#include <algorithm>
#include <cmath>
#include <string>
#include <string_view>

#include <nlohmann/json_fwd.hpp>
#include <xtensor/xarray.hpp>

#include "attnlab/nn/transformer.hpp"
#include "attnlab/random.hpp"
#include "attnlab/tensor.hpp"

namespace attnlab::test {

// ‖a − b‖₂ / max(‖a‖₂, ‖b‖₂): the relative error used throughout the suite (0 if both are 0).
template <class A, class B>
double rel_error(const A& a, const B& b) {
  double diff = 0, na = 0, nb = 0;
  auto ia = a.begin();
  auto ib = b.begin();
  for (; ia != a.end() && ib != b.end(); ++ia, ++ib) {
    const double x = static_cast<double>(*ia), y = static_cast<double>(*ib);
    diff += (x - y) * (x - y);
    na += x * x;
    nb += y * y;
  }
  const double denom = std::sqrt(std::max(na, nb));
  return denom > 0 ? std::sqrt(diff) / denom : std::sqrt(diff);
}

template <class E>
bool all_finite(const E& e) {
  return std::all_of(e.begin(), e.end(),
                     [](auto x) { return std::isfinite(static_cast<double>(x)); });
}

// Path of a committed test data file.
std::string data_path(const std::string& relative);

// Golden files (tests/data/golden/*.json, made by tests/golden/make_goldens.py).
const nlohmann::json& golden_file(std::string_view name);
xt::xarray<double> golden_tensor(const nlohmann::json& test_case, const std::string& key);

// A Transformer config from its sizes (one input field, LayerNorm, learned positions).
TransformerConfig transformer_config(std::size_t vocab, std::size_t max_len, std::size_t d_model,
                                     std::size_t heads, std::size_t d_ff, std::size_t layers,
                                     std::size_t out_vocab, bool causal = false);

// The 1-layer, 2-head, d_model 64 model of the thread tests on T = 260 tokens of 11 symbols: B·T =
// 520 rows split the projections' gemms over threads, and causal runs the fused path (automatic at
// that T), non-causal the reference one.
TransformerConfig threads_test_config(bool causal);

// w -= lr · g for every parameter: plain SGD, written out so tests need no optimizer.
void sgd_step(const ParameterList<float>& params, float lr);

// (B, T) ids drawn uniformly from [0, vocab).
TokenIds random_ids(std::size_t batch, std::size_t length, std::size_t vocab, Rng& rng);

}  // namespace attnlab::test
