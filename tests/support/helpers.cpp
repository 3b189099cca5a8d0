#include "helpers.hpp"

#include <fstream>
#include <functional>
#include <map>
#include <stdexcept>

#include <nlohmann/json.hpp>

namespace attnlab::test {

std::string data_path(const std::string& relative) {
  return std::string(ATTNLAB_TEST_DATA_DIR) + "/" + relative;
}

// Takes a string_view, not a const std::string&: a reference parameter bound to the temporary
// string of a literal makes GCC 13 warn -Wdangling-reference at every golden_file("x").at(...).
const nlohmann::json& golden_file(std::string_view name) {
  static std::map<std::string, nlohmann::json, std::less<>> loaded;
  auto it = loaded.find(name);
  if (it == loaded.end()) {
    const std::string path = data_path("golden/" + std::string(name));
    std::ifstream in(path);
    if (!in) throw std::runtime_error("golden file missing: " + path);
    it = loaded.emplace(std::string(name), nlohmann::json::parse(in)).first;
  }
  return it->second;
}

xt::xarray<double> golden_tensor(const nlohmann::json& test_case, const std::string& key) {
  const auto& t = test_case.at("tensors").at(key);
  const auto shape = t.at("shape").get<std::vector<std::size_t>>();
  const auto data = t.at("data").get<std::vector<double>>();
  xt::xarray<double> out(shape);
  if (out.size() != data.size())
    throw std::runtime_error("golden tensor " + key + ": size mismatch");
  std::copy(data.begin(), data.end(), out.begin());
  return out;
}

TransformerConfig transformer_config(std::size_t vocab, std::size_t max_len, std::size_t d_model,
                                     std::size_t heads, std::size_t d_ff, std::size_t layers,
                                     std::size_t out_vocab, bool causal) {
  TransformerConfig c;
  c.vocab_sizes = {vocab};
  c.max_len = max_len;
  c.block.attention.d_model = d_model;
  c.block.attention.heads = heads;
  c.block.d_ff = d_ff;
  c.layers = layers;
  c.out_vocab = out_vocab;
  c.block.attention.sdpa.causal = causal;
  return c;
}

TransformerConfig threads_test_config(bool causal) {
  return transformer_config(11, 260, 64, 2, 128, 1, 11, causal);
}

void sgd_step(const ParameterList<float>& params, float lr) {
  for (const auto& p : params) {
    float* w = p.param->value.data();
    const float* g = p.param->grad.data();
    for (std::size_t i = 0; i < p.param->value.size(); ++i) w[i] -= lr * g[i];
  }
}

TokenIds random_ids(std::size_t batch, std::size_t length, std::size_t vocab, Rng& rng) {
  TokenIds ids({batch, length});
  for (auto& id : ids) id = static_cast<int>(rng.below(vocab));
  return ids;
}

}  // namespace attnlab::test
