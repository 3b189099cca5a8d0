#include "attnlab/optim/outlier.hpp"

#include <algorithm>
#include <cmath>
#include <limits>
#include <string>

#include "attnlab/tensor.hpp"

namespace attnlab {

OutlierDetector::OutlierDetector(std::size_t window) : window_(window) {
  check_arg(window >= 2, "OutlierDetector", "window", ">= 2", std::to_string(window));
  values_.reserve(window);
}

double OutlierDetector::update(double value) {
  constexpr double kNan = std::numeric_limits<double>::quiet_NaN();
  if (!std::isfinite(value)) return kNan;
  if (!full()) {
    values_.push_back(value);
    position_ = values_.size() % window_;  // 0 once full: the oldest value's slot
    return kNan;
  }
  values_[position_] = value;
  position_ = (position_ + 1) % window_;
  const auto n = static_cast<double>(window_);
  double sum = 0;
  for (const double v : values_) sum += v;
  const double mean = sum / n;
  double squares = 0;
  for (const double v : values_) squares += (v - mean) * (v - mean);
  const double deviation = std::sqrt(squares / n);
  if (deviation == 0) return 0;
  return (value - mean) / deviation;
}

void OutlierDetector::set_state(const State& state) {
  const char* op = "OutlierDetector";
  check_arg(state.values.size() <= window_, op, "values",
            "at most window = " + std::to_string(window_) + " values",
            std::to_string(state.values.size()) + " values");
  const auto bad = std::find_if(state.values.begin(), state.values.end(),
                                [](double v) { return !std::isfinite(v); });
  check_arg(bad == state.values.end(), op, "values", "finite numbers",
            "a non-finite value at index " + std::to_string(bad - state.values.begin()));
  const bool filling = state.values.size() < window_;
  check_arg(filling ? state.position == state.values.size() : state.position < window_, op,
            "position",
            filling ? "values.size() = " + std::to_string(state.values.size()) + " while not full"
                    : "below window = " + std::to_string(window_),
            std::to_string(state.position));
  values_ = state.values;
  position_ = state.position;
}

}  // namespace attnlab
