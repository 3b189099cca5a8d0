// Learning-rate schedules: constant; linear warmup followed by cosine decay to a floor; and
// warmup-stable-decay (linear warmup, constant, linear warm-down to a floor).
//
// References: the cosine schedule of nanoGPT's train.py (get_lr) and of Loshchilov and Hutter,
// "SGDR: Stochastic Gradient Descent with Warm Restarts", ICLR 2017, without restarts. The
// warmup-stable-decay schedule of nanochat's scripts/base_train.py (get_lr_multiplier, whose
// --warmdown-ratio defaults to 0.65) and modded-nanogpt's train_gpt.py (cooldown_frac), studied
// by Hägele et al. 2024, "Scaling Laws and Compute-Optimal Training Beyond Fixed Training
// Durations" (constant LR + cooldown matches cosine); llm.c's llmc/schedulers.h has a "wsd" whose
// last 20% decay as 1 − sqrt, where this one decays linearly.
#pragma once

#include <cstddef>
#include <string_view>

#include "attnlab/enum_table.hpp"

namespace attnlab {

enum class LrScheduleKind { constant, warmup_cosine, warmup_stable_decay };

template <>
struct EnumTable<LrScheduleKind> {
  static constexpr EnumEntry<LrScheduleKind> entries[] = {
      {LrScheduleKind::constant, "constant", "the base lr throughout"},
      {LrScheduleKind::warmup_cosine, "cosine", "linear warmup, then cosine decay"},
      {LrScheduleKind::warmup_stable_decay, "wsd",
       "linear warmup, constant, then a linear decay over the last --warmdown of the steps"},
  };
  static constexpr EnumParseText parse = {"LrSchedule", "kind", NameList::quoted_or, true};
};

// The kind named in EnumTable<LrScheduleKind>; throws std::invalid_argument otherwise.
inline LrScheduleKind parse_lr_schedule_kind(std::string_view name) {
  return parse_enum<LrScheduleKind>(name);
}

// The lr for step s (0-based: the step about to be taken), W = warmup_steps, N = total_steps:
//   constant:       base_lr
//   warmup_cosine:  base_lr * (s + 1) / W                                      s < W
//                   min_lr + (base_lr - min_lr) * (1 + cos(pi * (s - W) / (N - W))) / 2
//                                                                              W <= s < N
//                   min_lr                                                     s >= N
// so warmup climbs to base_lr at s = W - 1, decay starts from base_lr at s = W, passes the
// midpoint (base_lr + min_lr) / 2 at s = W + (N - W) / 2 and stays at the floor from s = N on.
//   warmup_stable_decay, with D = round(warmdown * N) warm-down steps (half away from zero):
//                   base_lr * (s + 1) / W                                      s < W
//                   min_lr                                                     s >= N
//                   base_lr                                     W <= s <= N - D
//                   min_lr + (base_lr - min_lr) * (N - s) / D   max(W, N - D) < s < N
// which is nanochat's get_lr_multiplier with min_lr = final_lr_frac * base_lr. The edges: the last
// flat step is s = N - D (base_lr), the first decayed one s = N - D + 1 (base_lr minus one D-th of
// the way), the last step of the run s = N - 1 takes min_lr + (base_lr - min_lr) / D, and min_lr
// holds from s = N on (where nanochat's, with D = 0, would still give base_lr). warmdown 0 is
// warmup then base_lr to the end; warmdown 1 (D = N) decays from s = 1 (from s = W with warmup).
// When the warmup reaches into the warm-down (W > N - D) the warmup wins below W, and from s = W
// the lr is on the same decay line, a step down from the warmup's base_lr.
struct LrSchedule {
  LrScheduleKind kind = LrScheduleKind::constant;
  double base_lr = 1e-3;         // finite, >= 0
  double min_lr = 0;             // the floor of the decay; finite, in [0, base_lr]
  std::size_t warmup_steps = 0;  // W
  std::size_t total_steps = 0;   // N >= W; the decay reaches min_lr here
  // warmup_stable_decay: the fraction of N that decays linearly to min_lr; finite, in [0, 1].
  // 0.65 is nanochat's default warm-down ratio.
  double warmdown = 0.65;

  static LrSchedule constant(double lr);
  static LrSchedule warmup_cosine(double base_lr, double min_lr, std::size_t warmup_steps,
                                  std::size_t total_steps);
  static LrSchedule warmup_stable_decay(double base_lr, double min_lr, std::size_t warmup_steps,
                                        std::size_t total_steps, double warmdown);

  // Throws std::invalid_argument "LrSchedule: <field> expected ..., got ..." for a bad field.
  void validate() const;
  // Validates, then returns the lr for step s: a function of the step alone, so an optimizer's
  // every parameter (group) that follows it gets the same schedule.
  double lr_at(std::size_t step) const;
  // D = round(warmdown * N), the steps of the linear decay (warmup_stable_decay; 0 otherwise).
  std::size_t warmdown_steps() const;
};

}  // namespace attnlab
