#include "attnlab/app/progress.hpp"

#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <memory>

namespace attnlab::app {

std::string format_duration(double s) {
  char buf[32];
  if (!std::isfinite(s) || s < 0) return "?";
  if (s < 60)
    std::snprintf(buf, sizeof buf, "%.0fs", s);
  else if (s < 3600)
    std::snprintf(buf, sizeof buf, "%dm%02ds", static_cast<int>(s) / 60, static_cast<int>(s) % 60);
  else
    std::snprintf(buf, sizeof buf, "%dh%02dm", static_cast<int>(s) / 3600,
                  static_cast<int>(s) % 3600 / 60);
  return buf;
}

ProgressFn terminal_progress() {
  const bool tty = isatty(fileno(stdout));
  // Ends the bar's line once the reporter goes away (the job is over).
  struct BarLine {
    bool drawn = false;
    ~BarLine() {
      if (drawn) std::printf("\n");
    }
  };
  auto line = std::make_shared<BarLine>();
  return [tty, line](const ProgressUpdate& u) {
    if (!tty && !u.milestone) return;
    const double rate = static_cast<double>(u.done - u.start) / std::max(u.seconds, 1e-9);
    const double eta = static_cast<double>(u.total - u.done) / rate;
    const std::string times = format_duration(u.seconds) + " elapsed, ETA " + format_duration(eta);
    if (tty) {
      const std::size_t width = 24;
      const std::size_t filled = u.total ? width * u.done / u.total : width;
      std::printf("\r\033[K[%s%s] %s %zu/%zu %s (%s)", std::string(filled, '#').c_str(),
                  std::string(width - filled, '.').c_str(), u.unit, u.done, u.total,
                  u.detail.c_str(), times.c_str());
      line->drawn = true;
    } else {
      std::printf("%s %zu/%zu %s (%s)\n", u.unit, u.done, u.total, u.detail.c_str(), times.c_str());
    }
    std::fflush(stdout);
  };
}

}  // namespace attnlab::app
