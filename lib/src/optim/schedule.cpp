#include "attnlab/optim/schedule.hpp"

#include <cmath>
#include <numbers>
#include <sstream>
#include <string>

#include "attnlab/tensor.hpp"

namespace attnlab {

namespace {
template <class V>
std::string to_text(V x) {
  std::ostringstream out;
  out << x;
  return out.str();
}
}  // namespace

LrScheduleKind parse_lr_schedule_kind(std::string_view name) {
  if (name == "constant") return LrScheduleKind::constant;
  if (name == "cosine") return LrScheduleKind::warmup_cosine;
  // Appended, not "'" + ...: GCC 12 at -O3 warns falsely (-Wrestrict) on const char* + string&&.
  std::string quoted = "'";
  quoted.append(name).append("'");
  check_arg(false, "LrSchedule", "kind", "'constant' or 'cosine'", quoted);
  return LrScheduleKind::constant;  // unreachable
}

LrSchedule LrSchedule::constant(double lr) {
  LrSchedule s;
  s.kind = LrScheduleKind::constant;
  s.base_lr = lr;
  s.validate();
  return s;
}

LrSchedule LrSchedule::warmup_cosine(double base_lr, double min_lr, std::size_t warmup_steps,
                                     std::size_t total_steps) {
  LrSchedule s;
  s.kind = LrScheduleKind::warmup_cosine;
  s.base_lr = base_lr;
  s.min_lr = min_lr;
  s.warmup_steps = warmup_steps;
  s.total_steps = total_steps;
  s.validate();
  return s;
}

void LrSchedule::validate() const {
  check_arg(std::isfinite(base_lr) && base_lr >= 0, "LrSchedule", "base_lr", "a finite value >= 0",
            to_text(base_lr));
  if (kind == LrScheduleKind::constant) return;
  check_arg(std::isfinite(min_lr) && min_lr >= 0 && min_lr <= base_lr, "LrSchedule", "min_lr",
            "a finite value in [0, base_lr = " + to_text(base_lr) + "]", to_text(min_lr));
  check_arg(total_steps >= warmup_steps, "LrSchedule", "total_steps",
            ">= warmup_steps = " + to_text(warmup_steps), to_text(total_steps));
}

double LrSchedule::lr_at(std::size_t step) const {
  validate();
  if (kind == LrScheduleKind::constant) return base_lr;
  if (step < warmup_steps) {
    return base_lr * static_cast<double>(step + 1) / static_cast<double>(warmup_steps);
  }
  if (step >= total_steps) return min_lr;
  const double progress = static_cast<double>(step - warmup_steps) /
                          static_cast<double>(total_steps - warmup_steps);  // [0, 1)
  return min_lr + (base_lr - min_lr) * 0.5 * (1 + std::cos(std::numbers::pi * progress));
}

}  // namespace attnlab
