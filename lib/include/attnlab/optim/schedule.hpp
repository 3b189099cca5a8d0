// Learning-rate schedules: constant, and linear warmup followed by cosine decay to a floor.
//
// Reference: the schedule of nanoGPT's train.py (get_lr) and of Loshchilov and Hutter, "SGDR:
// Stochastic Gradient Descent with Warm Restarts", ICLR 2017, without restarts.
#pragma once

#include <cstddef>
#include <string_view>

namespace attnlab {

enum class LrScheduleKind { constant, warmup_cosine };

// "constant" or "cosine" (warmup_cosine); throws std::invalid_argument otherwise.
LrScheduleKind parse_lr_schedule_kind(std::string_view name);

// The lr for step s (0-based: the step about to be taken), W = warmup_steps, N = total_steps:
//   constant:       base_lr
//   warmup_cosine:  base_lr * (s + 1) / W                                      s < W
//                   min_lr + (base_lr - min_lr) * (1 + cos(pi * (s - W) / (N - W))) / 2
//                                                                              W <= s < N
//                   min_lr                                                     s >= N
// so warmup climbs to base_lr at s = W - 1, decay starts from base_lr at s = W, passes the
// midpoint (base_lr + min_lr) / 2 at s = W + (N - W) / 2 and stays at the floor from s = N on.
struct LrSchedule {
  LrScheduleKind kind = LrScheduleKind::constant;
  double base_lr = 1e-3;         // finite, >= 0
  double min_lr = 0;             // the floor of the cosine; finite, in [0, base_lr]
  std::size_t warmup_steps = 0;  // W
  std::size_t total_steps = 0;   // N >= W; the cosine reaches min_lr here

  static LrSchedule constant(double lr);
  static LrSchedule warmup_cosine(double base_lr, double min_lr, std::size_t warmup_steps,
                                  std::size_t total_steps);

  // Throws std::invalid_argument "LrSchedule: <field> expected ..., got ..." for a bad field.
  void validate() const;
  // Validates, then returns the lr for step s.
  double lr_at(std::size_t step) const;
};

}  // namespace attnlab
