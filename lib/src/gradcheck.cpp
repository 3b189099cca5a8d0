#include "attnlab/gradcheck.hpp"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <functional>
#include <numeric>
#include <stdexcept>

namespace attnlab {

double GradcheckReport::max_rel_error() const {
  double worst = 0;
  for (const auto& r : results) {
    // NaN must fail a check, never pass one.
    if (std::isnan(r.rel_error)) return r.rel_error;
    worst = std::max(worst, r.rel_error);
  }
  return worst;
}

std::string format_index(std::size_t flat, const std::vector<std::size_t>& shape) {
  if (shape.empty()) {
    // Appended, not "(" + ...: GCC 12 at -O3 warns falsely (-Wrestrict) on const char* + string&&.
    std::string out = "(";
    out.append(std::to_string(flat)).append(")");
    return out;
  }
  std::vector<std::size_t> idx(shape.size());
  for (std::size_t i = shape.size(); i-- > 0;) {
    idx[i] = shape[i] ? flat % shape[i] : 0;
    flat = shape[i] ? flat / shape[i] : 0;
  }
  std::string out = "(";
  for (std::size_t i = 0; i < idx.size(); ++i) {
    if (i) out += ", ";
    out += std::to_string(idx[i]);
  }
  return out + ")";
}

std::string GradcheckReport::table() const {
  std::string out;
  char line[256];
  std::snprintf(line, sizeof line, "%-28s %-18s %12s %12s  %s\n", "tensor", "shape", "rel error",
                "max abs err", "worst index (analytic vs numeric)");
  out += line;
  for (const auto& r : results) {
    std::string shape = "(";
    for (std::size_t i = 0; i < r.shape.size(); ++i) {
      if (i) shape += ",";
      shape += std::to_string(r.shape[i]);
    }
    shape += ")";
    std::snprintf(line, sizeof line, "%-28s %-18s %12.3e %12.3e  %s (%.6e vs %.6e)\n",
                  r.name.c_str(), shape.c_str(), r.rel_error, r.max_abs_error,
                  format_index(r.worst_index, r.shape).c_str(), r.analytic_at_worst,
                  r.numeric_at_worst);
    out += line;
  }
  return out;
}

GradcheckReport check_gradients(const std::vector<GradcheckTensor>& tensors,
                                const std::function<double()>& loss, double eps) {
  if (!(eps > 0)) {
    throw std::invalid_argument("check_gradients: eps expected > 0, got " + std::to_string(eps));
  }
  GradcheckReport report;
  for (const auto& t : tensors) {
    if (!t.values || !t.analytic) {
      throw std::invalid_argument("check_gradients: tensor '" + t.name +
                                  "' expected values and analytic pointers, got null");
    }
    const std::size_t n =
        std::accumulate(t.shape.begin(), t.shape.end(), std::size_t{1}, std::multiplies<>());
    GradcheckResult r;
    r.name = t.name;
    r.shape = t.shape;
    double diff_sq = 0, analytic_sq = 0, numeric_sq = 0;
    for (std::size_t i = 0; i < n; ++i) {
      const double saved = t.values[i];
      t.values[i] = saved + eps;
      const double up = loss();
      t.values[i] = saved - eps;
      const double down = loss();
      t.values[i] = saved;
      const double numeric = (up - down) / (2 * eps);
      const double analytic = t.analytic[i];
      const double err = std::abs(analytic - numeric);
      if (i == 0 || err > r.max_abs_error || (std::isnan(err) && !std::isnan(r.max_abs_error))) {
        r.max_abs_error = err;
        r.worst_index = i;
        r.analytic_at_worst = analytic;
        r.numeric_at_worst = numeric;
      }
      diff_sq += err * err;
      analytic_sq += analytic * analytic;
      numeric_sq += numeric * numeric;
    }
    r.analytic_norm = std::sqrt(analytic_sq);
    r.numeric_norm = std::sqrt(numeric_sq);
    const double denom = std::max(r.analytic_norm, r.numeric_norm);
    r.rel_error =
        denom > 0 ? std::sqrt(diff_sq) / denom : (diff_sq == 0 ? 0.0 : std::sqrt(diff_sq));
    report.results.push_back(std::move(r));
  }
  return report;
}

}  // namespace attnlab
