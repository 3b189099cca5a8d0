#include "attnlab/optim/schedule.hpp"

#include <cmath>
#include <numbers>
#include <string>

#include "attnlab/tensor.hpp"
#include "option_checks.hpp"

namespace attnlab {

namespace {

// A validated schedule from its fields (warmdown: warmup_stable_decay's alone).
LrSchedule make_schedule(LrScheduleKind kind, double base_lr, double min_lr = 0,
                         std::size_t warmup_steps = 0, std::size_t total_steps = 0,
                         double warmdown = LrSchedule{}.warmdown) {
  const LrSchedule s{.kind = kind,
                     .base_lr = base_lr,
                     .min_lr = min_lr,
                     .warmup_steps = warmup_steps,
                     .total_steps = total_steps,
                     .warmdown = warmdown};
  s.validate();
  return s;
}

}  // namespace

LrSchedule LrSchedule::constant(double lr) {
  return make_schedule(LrScheduleKind::constant, lr);
}

LrSchedule LrSchedule::warmup_cosine(double base_lr, double min_lr, std::size_t warmup_steps,
                                     std::size_t total_steps) {
  return make_schedule(LrScheduleKind::warmup_cosine, base_lr, min_lr, warmup_steps, total_steps);
}

LrSchedule LrSchedule::warmup_stable_decay(double base_lr, double min_lr, std::size_t warmup_steps,
                                           std::size_t total_steps, double warmdown) {
  return make_schedule(LrScheduleKind::warmup_stable_decay, base_lr, min_lr, warmup_steps,
                       total_steps, warmdown);
}

void LrSchedule::validate() const {
  option_checks::finite_non_negative("LrSchedule", "base_lr", base_lr);
  if (kind == LrScheduleKind::constant) return;
  check_arg(std::isfinite(min_lr) && min_lr >= 0 && min_lr <= base_lr, "LrSchedule", "min_lr",
            "a finite value in [0, base_lr = " + number_text(base_lr) + "]", number_text(min_lr));
  check_arg(total_steps >= warmup_steps, "LrSchedule", "total_steps",
            ">= warmup_steps = " + std::to_string(warmup_steps), std::to_string(total_steps));
  if (kind != LrScheduleKind::warmup_stable_decay) return;
  check_arg(std::isfinite(warmdown) && warmdown >= 0 && warmdown <= 1, "LrSchedule", "warmdown",
            "a finite value in [0, 1]", number_text(warmdown));
}

std::size_t LrSchedule::warmdown_steps() const {
  if (kind != LrScheduleKind::warmup_stable_decay) return 0;
  // In [0, N] for warmdown in [0, 1]; std::round rounds halves away from zero (Python's round,
  // nanochat's, rounds them to even: the two differ only when warmdown * N is exactly k + 1/2).
  return static_cast<std::size_t>(std::round(warmdown * static_cast<double>(total_steps)));
}

double LrSchedule::lr_at(std::size_t step) const {
  validate();
  if (kind == LrScheduleKind::constant) return base_lr;
  if (step < warmup_steps) {
    return base_lr * static_cast<double>(step + 1) / static_cast<double>(warmup_steps);
  }
  if (step >= total_steps) return min_lr;
  if (kind == LrScheduleKind::warmup_stable_decay) {
    const std::size_t decay = warmdown_steps();       // D
    if (step + decay <= total_steps) return base_lr;  // s <= N - D: the stable part
    // N - D < s < N: (N - s) / D in (0, 1), 1 at the last flat step, 0 at s = N.
    const double left = static_cast<double>(total_steps - step) / static_cast<double>(decay);
    return min_lr + (base_lr - min_lr) * left;
  }
  const double progress = static_cast<double>(step - warmup_steps) /
                          static_cast<double>(total_steps - warmup_steps);  // [0, 1)
  return min_lr + (base_lr - min_lr) * 0.5 * (1 + std::cos(std::numbers::pi * progress));
}

}  // namespace attnlab
