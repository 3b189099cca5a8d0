// What the proxies checks (proxy_checks.cpp, the pre-registered C1–C6) and their amendments
// (proxy_amendments.cpp) share: the thresholds, one family's runs by width, arm and LR
// (FamilyView), and the text helpers. Internal to the app (lib/app/src/study); the definitions
// are in attnlab/app/proxy_checks.hpp.
#pragma once

#include <algorithm>
#include <cmath>
#include <limits>
#include <map>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "attnlab/app/proxy_checks.hpp"
#include "text_format.hpp"

namespace attnlab::app::proxy_detail {

inline constexpr double kFailMargin = 0.5;               // nats above best_w: a failed run or cell
inline constexpr double kNearBest = 0.1;                 // nats: "within 0.1 of the best"
inline constexpr double kDkMargin = 0.2;                 // C4: dk's loss at 0.3 above qk_norm's
inline constexpr double kEntropyShare = 0.5;             // C5
inline constexpr double kSlopeLo = 0.7, kSlopeHi = 1.3;  // C6, C6a
inline constexpr double kAbsoluteLogitShare = 0.1;       // C2a: qk-norm's max logit over 1/√d_k's
inline constexpr double kHighLr = 0.3, kMidLr = 0.1;
inline constexpr int kMidLrFromWidth = 128;

// The median of the finite values (NaN for none).
inline double finite_median(std::vector<double> x) {
  x.erase(std::remove_if(x.begin(), x.end(), [](double v) { return !std::isfinite(v); }), x.end());
  if (x.empty()) return std::numeric_limits<double>::quiet_NaN();
  std::sort(x.begin(), x.end());
  const std::size_t n = x.size();
  return n % 2 == 1 ? x[n / 2] : 0.5 * (x[n / 2 - 1] + x[n / 2]);
}

inline bool same_lr(double a, double b) {
  return std::abs(a - b) <= 1e-9 * std::max(std::abs(a), std::abs(b));
}

// The runs of one family at its budget, by width, arm and LR.
class FamilyView {
 public:
  FamilyView(const std::vector<RunRecord>& runs, const WidthFamily& f) : f_(f) {
    for (const auto& r : runs) {
      if (r.steps != f.steps) continue;
      const auto it = std::find(f.groups.begin(), f.groups.end(), r.group);
      if (it == f.groups.end()) continue;
      const int w = f.widths[static_cast<std::size_t>(it - f.groups.begin())];
      by_width_[w].push_back(&r);
    }
  }

  const std::vector<int>& widths() const { return f_.widths; }
  const std::string& group(int w) const {
    return f_.groups[static_cast<std::size_t>(std::find(f_.widths.begin(), f_.widths.end(), w) -
                                              f_.widths.begin())];
  }

  std::vector<const RunRecord*> cell(int w, const std::string& arm, double lr) const {
    std::vector<const RunRecord*> out;
    const auto it = by_width_.find(w);
    if (it == by_width_.end()) return out;
    for (const auto* r : it->second)
      if (r->mode == arm && same_lr(r->lr, lr)) out.push_back(r);
    return out;
  }

  std::vector<double> lrs(int w, const std::string& arm) const {
    std::vector<double> v;
    const auto it = by_width_.find(w);
    if (it == by_width_.end()) return v;
    for (const auto* r : it->second)
      if (r->mode == arm &&
          std::none_of(v.begin(), v.end(), [&](double x) { return same_lr(x, r->lr); }))
        v.push_back(r->lr);
    std::sort(v.begin(), v.end());
    return v;
  }

  bool has_arm(int w, const std::string& arm) const { return !lrs(w, arm).empty(); }

  static double loss(const std::vector<const RunRecord*>& rs) {
    if (rs.empty()) return std::numeric_limits<double>::quiet_NaN();
    double sum = 0;
    for (const auto* r : rs) sum += effective_loss(*r);
    return sum / static_cast<double>(rs.size());
  }

  // best_w: the lowest cell loss over every arm and LR at width w.
  double best(int w) const {
    double b = std::numeric_limits<double>::infinity();
    const auto it = by_width_.find(w);
    if (it == by_width_.end()) return b;
    std::map<std::pair<std::string, double>, std::vector<const RunRecord*>> cells;
    for (const auto* r : it->second) cells[{r->mode, r->lr}].push_back(r);
    for (const auto& [key, rs] : cells) b = std::min(b, loss(rs));
    return b;
  }

  double arm_best(int w, const std::string& arm) const {
    double b = std::numeric_limits<double>::infinity();
    for (double lr : lrs(w, arm)) b = std::min(b, loss(cell(w, arm, lr)));
    return b;
  }

  // The largest LR whose cell loss is within kNearBest of the arm's best at width w (0: none).
  double good_lr(int w, const std::string& arm) const {
    const double b = arm_best(w, arm);
    double good = 0;
    for (double lr : lrs(w, arm))
      if (loss(cell(w, arm, lr)) <= b + kNearBest) good = lr;
    return good;
  }

  double sensitivity(int w, const std::string& arm) const {
    const auto it = by_width_.find(w);
    int d_k = 0;
    if (it != by_width_.end())
      for (const auto* r : it->second)
        if (r->mode == arm) d_k = r->d_k;
    return sensitivity_stat(runs_of(w), {group(w), f_.steps, arm, d_k}).total;
  }

  bool run_failed_here(const RunRecord& r, int w) const {
    return run_diverged(r) || r.final_eval_loss >= best(w) + kFailMargin;
  }

  bool cell_failed(int w, const std::string& arm, double lr) const {
    const auto rs = cell(w, arm, lr);
    return std::any_of(rs.begin(), rs.end(), [](const RunRecord* r) { return run_diverged(*r); }) ||
           loss(rs) >= best(w) + kFailMargin;
  }

  // A run's layer-0 max-logit growth: +inf for a diverged run, NaN when not measured.
  static double growth(const RunRecord& r) {
    const double init = r.layer0_init.max_logit, fin = r.layer0_final.max_logit;
    if (!(std::isfinite(init) && init > 0)) return std::numeric_limits<double>::quiet_NaN();
    if (run_diverged(r)) return std::numeric_limits<double>::infinity();
    return std::isfinite(fin) ? fin / init : std::numeric_limits<double>::quiet_NaN();
  }

  // The smallest and largest growth over a cell's runs (both NaN if any is unknown, or no runs).
  static std::pair<double, double> growth_range(const std::vector<const RunRecord*>& rs) {
    constexpr double nan = std::numeric_limits<double>::quiet_NaN();
    if (rs.empty()) return {nan, nan};
    double lo = std::numeric_limits<double>::infinity(), hi = 0;
    for (const auto* r : rs) {
      const double x = growth(*r);
      if (std::isnan(x)) return {nan, nan};
      lo = std::min(lo, x);
      hi = std::max(hi, x);
    }
    return {lo, hi};
  }
  static double min_growth(const std::vector<const RunRecord*>& rs) {
    return growth_range(rs).first;
  }
  static double max_growth(const std::vector<const RunRecord*>& rs) {
    return growth_range(rs).second;
  }

  // The runs of one width, as a record list for sensitivity_stat.
  std::vector<RunRecord> runs_of(int w) const {
    std::vector<RunRecord> out;
    const auto it = by_width_.find(w);
    if (it != by_width_.end())
      for (const auto* r : it->second) out.push_back(*r);
    return out;
  }

  // The cells C1 reads: sqrt_dk at 0.3 everywhere, at 0.1 from width 128.
  std::vector<std::pair<int, double>> c1_cells() const {
    std::vector<std::pair<int, double>> cells;
    for (int w : widths()) {
      cells.emplace_back(w, kHighLr);
      if (w >= kMidLrFromWidth) cells.emplace_back(w, kMidLr);
    }
    return cells;
  }

  // C1's failed runs: the runs of its cells that failed (run_failed_here).
  std::vector<std::pair<int, const RunRecord*>> c1_failures() const {
    std::vector<std::pair<int, const RunRecord*>> out;
    for (const auto& [w, lr] : c1_cells())
      for (const auto* r : cell(w, "sqrt_dk", lr))
        if (run_failed_here(*r, w)) out.emplace_back(w, r);
    return out;
  }

  // The qk_norm run at r's width, LR and seed.
  const RunRecord* qk_twin(int w, const RunRecord& r) const {
    for (const auto* q : cell(w, "qk_norm", r.lr))
      if (q->seed == r.seed) return q;
    return nullptr;
  }

 private:
  const WidthFamily& f_;
  std::map<int, std::vector<const RunRecord*>> by_width_;
};

// A check's result before its numbers, at `verdict` until the check decides; an amendment's
// (written after the results) with its reason.
inline CheckResult new_check(std::string id, std::string claim, Verdict verdict = Verdict::holds) {
  return {std::move(id), std::move(claim), verdict, "", false, ""};
}
inline CheckResult new_amendment(std::string id, std::string claim, std::string reason,
                                 Verdict verdict = Verdict::holds) {
  return {std::move(id), std::move(claim), verdict, "", true, std::move(reason)};
}

inline std::string growth_text(double g) {
  if (std::isnan(g)) return "unknown";
  if (std::isinf(g)) return "inf (diverged)";
  return fmt("%.3g", g) + "x";
}

inline std::string join(const std::vector<std::string>& parts, const char* sep = "; ") {
  std::string out;
  for (const auto& p : parts) out += (out.empty() ? "" : sep) + p;
  return out;
}

inline std::string width_label(int w) {
  return "w" + std::to_string(w);
}

// The least-squares slope of ys on xs; nullopt with fewer than 3 points or no spread in xs.
inline std::optional<double> slope_of(const std::vector<double>& xs,
                                      const std::vector<double>& ys) {
  const std::size_t n = xs.size();
  if (n < 3) return std::nullopt;
  double mx = 0, my = 0;
  for (std::size_t i = 0; i < n; ++i) {
    mx += xs[i];
    my += ys[i];
  }
  mx /= static_cast<double>(n);
  my /= static_cast<double>(n);
  double sxx = 0, sxy = 0;
  for (std::size_t i = 0; i < n; ++i) {
    sxx += (xs[i] - mx) * (xs[i] - mx);
    sxy += (xs[i] - mx) * (ys[i] - my);
  }
  if (!(sxx > 1e-12)) return std::nullopt;
  return sxy / sxx;
}

inline bool in_slope_band(double slope) {
  return slope >= kSlopeLo && slope <= kSlopeHi;
}

// The frame shared by C2 and C2a: inconclusive unless C1 holds and every width ran qk_norm; else
// it holds where, at every width, qk-norm's LR sensitivity is below 1/√d_k's and at_lr holds at
// every LR whose 1/√d_k cell's max logit grew ≥ kSaturatedLogitGrowth. width_text(w, qk, sq)
// opens a width's numbers (the two sensitivities); at_lr(w, lr, sqrt_dk_cell, lr_texts) adds one.
template <class WidthText, class AtLr>
void check_qk_norm_mitigates(CheckResult& c, const FamilyView& v, Verdict c1, WidthText width_text,
                             AtLr at_lr) {
  if (c1 != Verdict::holds) {
    c.verdict = Verdict::inconclusive;
    c.numbers = "C1 does not hold";
    return;
  }
  std::vector<std::string> parts;
  bool all = true;
  for (int w : v.widths()) {
    if (!v.has_arm(w, "qk_norm")) {
      c.verdict = Verdict::inconclusive;
      c.numbers = "qk_norm not run at width " + std::to_string(w);
      return;
    }
    const double sq = v.sensitivity(w, "sqrt_dk"), qk = v.sensitivity(w, "qk_norm");
    all = all && qk < sq;
    std::string part = width_text(w, qk, sq);
    std::vector<std::string> lrs;
    for (double lr : v.lrs(w, "sqrt_dk")) {
      const auto s = v.cell(w, "sqrt_dk", lr);
      const double grow = FamilyView::min_growth(s);
      if (std::isnan(grow) || grow < kSaturatedLogitGrowth) continue;
      const bool ok = at_lr(w, lr, s, lrs);
      all = all && ok;
    }
    if (!lrs.empty()) part += " (" + join(lrs, ", ") + ")";
    parts.push_back(part);
  }
  c.numbers = join(parts);
  c.verdict = all ? Verdict::holds : Verdict::fails;
}

// The frame shared by C4 and C4a: inconclusive unless every width ran dk and sqrt_dk, and the
// widest width ran dk and qk_norm at LR 0.3; else it holds where at_width holds at every width
// and, at the widest width and LR 0.3, 1/d_k's loss is at least kDkMargin above qk-norm's.
// at_width(w, dk, sq, parts) gets the two arms' good LRs (FamilyView::good_lr) and adds its text.
template <class AtWidth>
void check_dk_does_not_replace(CheckResult& c, const FamilyView& v, AtWidth at_width) {
  std::vector<std::string> parts;
  bool all = true;
  for (int w : v.widths()) {
    if (!v.has_arm(w, "dk") || !v.has_arm(w, "sqrt_dk")) {
      c.verdict = Verdict::inconclusive;
      c.numbers = "dk or sqrt_dk not run at width " + std::to_string(w);
      return;
    }
    const bool ok = at_width(w, v.good_lr(w, "dk"), v.good_lr(w, "sqrt_dk"), parts);
    all = all && ok;
  }
  const int top = v.widths().back();
  const auto dk = v.cell(top, "dk", kHighLr), qk = v.cell(top, "qk_norm", kHighLr);
  if (dk.empty() || qk.empty()) {
    c.verdict = Verdict::inconclusive;
    c.numbers = join(parts) + "; LR 0.3 of dk or qk_norm not run at width " + std::to_string(top);
    return;
  }
  const double dl = FamilyView::loss(dk), ql = FamilyView::loss(qk);
  const bool worse = dl >= ql + kDkMargin;
  parts.push_back(width_label(top) + " lr 0.3: loss 1/d_k " + fmt("%.3f", dl) + " vs qk-norm " +
                  fmt("%.3f", ql) + (worse ? " ✓" : " ✗"));
  c.numbers = join(parts);
  c.verdict = all && worse ? Verdict::holds : Verdict::fails;
}

// The amendments (proxy_amendments.cpp).
CheckResult check_c2_amended(const FamilyView& v, Verdict c1);
CheckResult check_c4_amended(const FamilyView& v);
CheckResult check_c6_amended(const FamilyView& v);

}  // namespace attnlab::app::proxy_detail
