// The warmup-stable-decay schedule (LrScheduleKind::warmup_stable_decay, "wsd"): its warmup, its
// flat part exactly at base_lr, the linear warm-down over the last round(warmdown · N) steps to
// min_lr, the edges (warmdown 0 and 1, a warmup reaching into the warm-down), and bad values.
#include <doctest/doctest.h>

#include <cmath>
#include <cstddef>
#include <limits>
#include <stdexcept>

#include "attnlab/optim/schedule.hpp"

using namespace attnlab;

TEST_CASE("wsd: warmup as cosine's, the flat part exactly base_lr, then a line to min_lr at N") {
  const double base = 1e-3, floor = 1e-4;
  // W 10, N 100, warmdown 0.3: D = 30 decaying steps, so steps 10..70 are flat, 71..99 decay.
  const auto s = LrSchedule::warmup_stable_decay(base, floor, 10, 100, 0.3);
  CHECK(s.warmdown_steps() == 30);
  const auto cosine = LrSchedule::warmup_cosine(base, floor, 10, 100);
  for (std::size_t t = 0; t < 10; ++t) {
    CAPTURE(t);
    CHECK(s.lr_at(t) == cosine.lr_at(t));  // the same warmup, base · (s + 1) / W
    CHECK(s.lr_at(t) == doctest::Approx(base * static_cast<double>(t + 1) / 10).epsilon(1e-15));
  }
  for (std::size_t t = 10; t <= 70; ++t) CHECK(s.lr_at(t) == base);  // exactly, not approximately
  // min + (base − min) · (N − s) / D on 70 < s < N.
  for (std::size_t t = 71; t < 100; ++t) {
    CAPTURE(t);
    const double expected = floor + (base - floor) * static_cast<double>(100 - t) / 30.0;
    CHECK(s.lr_at(t) == doctest::Approx(expected).epsilon(1e-15));
    CHECK(s.lr_at(t) < s.lr_at(t - 1));
    CHECK(s.lr_at(t) > floor);
  }
  CHECK(s.lr_at(71) == doctest::Approx(base - (base - floor) / 30).epsilon(1e-15));
  CHECK(s.lr_at(85) == doctest::Approx((base + floor) / 2).epsilon(1e-15));  // half way down
  CHECK(s.lr_at(99) == doctest::Approx(floor + (base - floor) / 30).epsilon(1e-15));
  CHECK(s.lr_at(100) == floor);  // reached at N
  CHECK(s.lr_at(1000000) == floor);

  // min_lr 0 decays to zero; nanochat's default ratio 0.65 of 1000 steps decays the last 650.
  const auto to_zero = LrSchedule::warmup_stable_decay(base, 0, 0, 1000, 0.65);
  CHECK(to_zero.warmdown_steps() == 650);
  CHECK(to_zero.lr_at(0) == base);
  CHECK(to_zero.lr_at(350) == base);
  CHECK(to_zero.lr_at(351) == doctest::Approx(base * 649 / 650).epsilon(1e-15));
  CHECK(to_zero.lr_at(999) == doctest::Approx(base / 650).epsilon(1e-15));
  CHECK(to_zero.lr_at(1000) == 0);
  // D = round(warmdown · N), halves away from zero: 0.25 · 10 = 2.5 -> 3.
  CHECK(LrSchedule::warmup_stable_decay(base, 0, 0, 10, 0.25).warmdown_steps() == 3);
  CHECK(LrSchedule::warmup_stable_decay(base, 0, 0, 10, 0.24).warmdown_steps() == 2);
  CHECK(LrSchedule::warmup_cosine(base, 0, 0, 10).warmdown_steps() == 0);  // not a wsd

  // A function of the step alone: asked in any order, twice, it answers the same.
  for (std::size_t t = 120; t-- > 0;) CHECK(s.lr_at(t) == s.lr_at(t));
  CHECK(s.lr_at(80) == LrSchedule(s).lr_at(80));
}

TEST_CASE("wsd: warmdown 0 is constant after the warmup, warmdown 1 decays over the whole run") {
  const double base = 2e-3, floor = 5e-4;
  const auto flat = LrSchedule::warmup_stable_decay(base, floor, 4, 50, 0.0);
  CHECK(flat.warmdown_steps() == 0);
  CHECK(flat.lr_at(0) == doctest::Approx(base / 4).epsilon(1e-15));
  CHECK(flat.lr_at(3) == base);
  for (std::size_t t = 4; t < 50; ++t) CHECK(flat.lr_at(t) == base);  // to the last step, N - 1
  CHECK(flat.lr_at(50) == floor);                                     // min_lr after N

  // No warmup: s = 0 is the one flat step (N − D = 0), the line runs from s = 1 to N.
  const auto line = LrSchedule::warmup_stable_decay(base, 0, 0, 50, 1.0);
  CHECK(line.warmdown_steps() == 50);
  CHECK(line.lr_at(0) == base);
  CHECK(line.lr_at(1) == doctest::Approx(base * 49 / 50).epsilon(1e-15));
  CHECK(line.lr_at(25) == doctest::Approx(base / 2).epsilon(1e-15));
  CHECK(line.lr_at(49) == doctest::Approx(base / 50).epsilon(1e-15));
  CHECK(line.lr_at(50) == 0);
  // With a warmup that reaches into the warm-down, the warmup wins below W; from W on the lr is
  // on the same line (nanochat's rule), a step down from the warmup's last value.
  const auto overlap = LrSchedule::warmup_stable_decay(base, 0, 5, 50, 1.0);
  CHECK(overlap.lr_at(4) == base);
  CHECK(overlap.lr_at(5) == doctest::Approx(base * 45 / 50).epsilon(1e-15));
  CHECK(overlap.lr_at(5) == line.lr_at(5));
  // Warmup to the end: no stable or decaying step is taken; min_lr from N.
  const auto all_warmup = LrSchedule::warmup_stable_decay(base, floor, 5, 5, 0.5);
  CHECK(all_warmup.lr_at(4) == base);
  CHECK(all_warmup.lr_at(5) == floor);
  CHECK(parse_lr_schedule_kind("wsd") == LrScheduleKind::warmup_stable_decay);
}

TEST_CASE("wsd: bad values are refused naming the field") {
  CHECK_THROWS_WITH_AS(LrSchedule::warmup_stable_decay(1e-3, 0, 0, 10, 1.5),
                       "LrSchedule: warmdown expected a finite value in [0, 1], got 1.5",
                       std::invalid_argument);
  CHECK_THROWS_WITH_AS(LrSchedule::warmup_stable_decay(1e-3, 0, 0, 10, -0.1),
                       "LrSchedule: warmdown expected a finite value in [0, 1], got -0.1",
                       std::invalid_argument);
  CHECK_THROWS_AS(
      LrSchedule::warmup_stable_decay(1e-3, 0, 0, 10, std::numeric_limits<double>::quiet_NaN()),
      std::invalid_argument);
  CHECK_THROWS_WITH_AS(
      LrSchedule::warmup_stable_decay(1e-3, 1e-2, 0, 10, 0.5),
      "LrSchedule: min_lr expected a finite value in [0, base_lr = 0.001], got 0.01",
      std::invalid_argument);
  CHECK_THROWS_WITH_AS(LrSchedule::warmup_stable_decay(1e-3, 0, 20, 10, 0.5),
                       "LrSchedule: total_steps expected >= warmup_steps = 20, got 10",
                       std::invalid_argument);
  CHECK_THROWS_WITH_AS(parse_lr_schedule_kind("linear"),
                       "LrSchedule: kind expected 'constant', 'cosine' or 'wsd', got 'linear'",
                       std::invalid_argument);
  // lr_at validates too: a field changed after construction is caught.
  auto s = LrSchedule::warmup_stable_decay(1e-3, 0, 0, 10, 0.5);
  s.warmdown = 2;
  CHECK_THROWS_WITH_AS(s.lr_at(0), "LrSchedule: warmdown expected a finite value in [0, 1], got 2",
                       std::invalid_argument);
  // Other kinds ignore the field.
  auto cosine = LrSchedule::warmup_cosine(1e-3, 0, 0, 10);
  cosine.warmdown = 2;
  CHECK_NOTHROW(cosine.lr_at(0));
}
