// Central-difference gradient checking, a public facility: users prove their own backward passes
// with the same checker the test suite uses. Double precision only.
//
// For each checked tensor x with analytic gradient g, every element is perturbed by ±eps and
//   ĝ_i = (L(x + eps·e_i) − L(x − eps·e_i)) / (2·eps).
// Reported per tensor: the max absolute error max_i |g_i − ĝ_i| (and its index), and the relative
// error ‖g − ĝ‖₂ / max(‖g‖₂, ‖ĝ‖₂) (0 when both are exactly zero).
#pragma once

#include <cstddef>
#include <functional>
#include <string>
#include <vector>

namespace attnlab {

struct GradcheckTensor {
  std::string name;
  double* values = nullptr;          // perturbed in place, restored afterwards
  const double* analytic = nullptr;  // the backward's gradient, same size
  std::vector<std::size_t> shape;    // for printing the worst index
};

struct GradcheckResult {
  std::string name;
  std::vector<std::size_t> shape;
  double max_abs_error = 0;
  double rel_error = 0;
  std::size_t worst_index = 0;  // flat, row-major
  double analytic_at_worst = 0;
  double numeric_at_worst = 0;
  double analytic_norm = 0;
  double numeric_norm = 0;
};

struct GradcheckReport {
  std::vector<GradcheckResult> results;
  double max_rel_error() const;
  bool passed(double tolerance) const { return max_rel_error() <= tolerance; }
  // One row per tensor: name, shape, rel error, max abs error, worst index, analytic vs numeric.
  std::string table() const;
};

// Checks each tensor against central differences of `loss`, which must recompute the loss from the
// current values (it is called 2 × total elements times). Throws std::invalid_argument on eps <= 0
// or a tensor with null pointers.
GradcheckReport check_gradients(const std::vector<GradcheckTensor>& tensors,
                                const std::function<double()>& loss, double eps = 1e-6);

// "(1, 0, 3)" for a flat index into `shape`.
std::string format_index(std::size_t flat, const std::vector<std::size_t>& shape);

}  // namespace attnlab
