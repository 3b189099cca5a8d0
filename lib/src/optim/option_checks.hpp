// Private to lib/src/optim: the checks of the optimizers' and schedules' numeric options, each
// worded one way (check_arg's std::invalid_argument "<op>: <name> expected <what>, got <value>").
#pragma once

#include <cmath>
#include <string_view>

#include "attnlab/tensor.hpp"

namespace attnlab::option_checks {

// A learning rate, weight decay or multiplier: finite and >= 0.
inline void finite_non_negative(std::string_view op, std::string_view name, double value) {
  check_arg(std::isfinite(value) && value >= 0, op, name, "a finite value >= 0",
            number_text(value));
}

// An epsilon: finite and > 0.
inline void finite_positive(std::string_view op, std::string_view name, double value) {
  check_arg(std::isfinite(value) && value > 0, op, name, "a finite value > 0", number_text(value));
}

// A momentum or a moment's decay rate: in [0, 1).
inline void below_one(std::string_view op, std::string_view name, double value) {
  check_arg(value >= 0 && value < 1, op, name, "a value in [0, 1)", number_text(value));
}

}  // namespace attnlab::option_checks
