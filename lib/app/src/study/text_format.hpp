// The number formats of the study's tables and reports (summary, proxy checks, saturation): a
// printf format applied to one double, with intervals and proportions. Internal to the app
// (lib/app/src/study).
#pragma once

#include <cmath>
#include <cstdio>
#include <string>

#include "attnlab/app/study_stats.hpp"

namespace attnlab::app {

// x in the printf format f ("%.3f").
inline std::string fmt(const char* f, double x) {
  char buf[64];
  std::snprintf(buf, sizeof buf, f, x);
  return buf;
}

// A number in format f, or in %.3g when it is too large for f's fixed point to read well (an SGD
// run whose loss blew up to 1e24 without becoming non-finite).
inline std::string num(const char* f, double x) {
  return std::fabs(x) >= 1e5 ? fmt("%.3g", x) : fmt(f, x);
}

inline std::string with_ci(const char* f, double m, const Interval& ci) {
  if (!std::isfinite(ci.lo)) return num(f, m);
  return num(f, m) + " [" + num(f, ci.lo) + ", " + num(f, ci.hi) + "]";
}

inline std::string proportion(int k, int n) {
  const Interval w = wilson_interval(k, n);
  return std::to_string(k) + "/" + std::to_string(n) + " [" + fmt("%.2f", w.lo) + ", " +
         fmt("%.2f", w.hi) + "]";
}

}  // namespace attnlab::app
