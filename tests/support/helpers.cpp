#include "helpers.hpp"

#include <fstream>
#include <map>
#include <stdexcept>

#include <nlohmann/json.hpp>

namespace attnlab::test {

std::string data_path(const std::string& relative) {
  return std::string(ATTNLAB_TEST_DATA_DIR) + "/" + relative;
}

const nlohmann::json& golden_file(const std::string& name) {
  static std::map<std::string, nlohmann::json> loaded;
  auto it = loaded.find(name);
  if (it == loaded.end()) {
    std::ifstream in(data_path("golden/" + name));
    if (!in) throw std::runtime_error("golden file missing: " + data_path("golden/" + name));
    it = loaded.emplace(name, nlohmann::json::parse(in)).first;
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

}  // namespace attnlab::test
