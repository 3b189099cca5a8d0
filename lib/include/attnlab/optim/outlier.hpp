// A sliding-window z-score of a training signal (the step's loss, its gradient norm), to skip the
// update of an outlier step: llm.c's llmc/outlier_detector.h, the detector behind train_gpt2.cu's
// -sl and -sg flags (skip the update when the loss's or the gradient norm's z-score exceeds them).
//
// update(x) enters x into a window of the last N values (N = window(), kDefaultWindow = 128 as
// llm.c's OUTLIER_DETECTOR_WINDOW_SIZE) and returns the z-score of x over the window, x included,
// as llm.c computes it:
//   z = (x - mean) / std,   mean = sum(w_i) / N,   std = sqrt(sum((w_i - mean)^2) / N)
// (the population deviation), NaN while the window is not full (the first N calls: the N-th value
// fills it and still gives NaN, the (N + 1)-th replaces the oldest and gives the first z-score),
// and 0 when std is 0. Since x is one of the N values, |z| <= sqrt(N - 1) (11.27 for N = 128,
// reached by one value among N - 1 equal ones): a threshold above that never fires.
//
// Unlike llm.c, which keeps running sums (sum += x, sum -= oldest), the mean and the deviation are
// summed afresh over the window (in slot order, two passes; 2N flops per call): the z-score is a
// function of the window's contents alone, so a detector restored from state() gives bit for bit
// the z-scores of one that never stopped. A non-finite x is not entered and gives NaN (no
// decision): entered, it would make every z-score NaN for the next N calls.
#pragma once

#include <cstddef>
#include <vector>

namespace attnlab {

class OutlierDetector {
 public:
  static constexpr std::size_t kDefaultWindow = 128;

  // std::invalid_argument "OutlierDetector: window expected >= 2, got ..." for a smaller window.
  explicit OutlierDetector(std::size_t window = kDefaultWindow);

  // Enters `value` (when finite) and returns its z-score over the window, or NaN (see above).
  double update(double value);

  std::size_t window() const { return window_; }
  bool full() const { return values_.size() == window_; }

  // What the detector holds: the window's values in slot order (fewer than window() while it
  // fills) and the slot the next value goes to (values.size() while filling; once full, the slot
  // of the oldest value, which the next one replaces).
  struct State {
    std::vector<double> values;
    std::size_t position = 0;
  };
  State state() const { return {values_, position_}; }
  // Restores what state() returned, for a detector of the same window. Throws
  // std::invalid_argument "OutlierDetector: <field> expected ..., got ..." (values: at most
  // window() finite numbers; position: below window(), and values.size() while not full); the
  // detector is unchanged then.
  void set_state(const State& state);

 private:
  std::size_t window_;
  std::vector<double> values_;
  std::size_t position_ = 0;
};

}  // namespace attnlab
