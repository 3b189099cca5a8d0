// Small shared helpers for the test suite.
#pragma once

#include <algorithm>
#include <cmath>
#include <string>

#include <nlohmann/json_fwd.hpp>
#include <xtensor/xarray.hpp>

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
const nlohmann::json& golden_file(const std::string& name);
xt::xarray<double> golden_tensor(const nlohmann::json& test_case, const std::string& key);

}  // namespace attnlab::test
