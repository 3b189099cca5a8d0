// The proxies' mechanism table and ablation table (proxy_checks.hpp): layer 0's logged figures at
// the high LRs, and qk-norm's logit growth with its gains or shifts held, or a longer warmup,
// beside its own arm on the same seeds.
#include <algorithm>
#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include "attnlab/app/proxy_checks.hpp"
#include "proxy_family.hpp"
#include "text_format.hpp"

namespace attnlab::app {

namespace {

using namespace proxy_detail;

template <class F>
double median_of(const std::vector<const RunRecord*>& rs, F field) {
  std::vector<double> v;
  for (const auto* r : rs) v.push_back(field(*r));
  return finite_median(v);
}

std::string shown(double x, const char* f = "%.3g") {
  if (std::isinf(x)) return "div";
  return std::isfinite(x) ? fmt(f, x) : "—";
}

// The runs of `group` at `steps` with this arm and LR.
std::vector<const RunRecord*> cell_of(const std::vector<RunRecord>& runs, const std::string& group,
                                      int steps, const std::string& arm, double lr) {
  std::vector<const RunRecord*> out;
  for (const auto& r : runs)
    if (r.group == group && r.steps == steps && r.mode == arm && same_lr(r.lr, lr))
      out.push_back(&r);
  return out;
}

std::vector<std::string> arms_of(const std::vector<RunRecord>& runs, const std::string& group) {
  std::vector<std::string> arms;
  for (const auto& r : runs)
    if (r.group == group && std::find(arms.begin(), arms.end(), r.mode) == arms.end())
      arms.push_back(r.mode);
  return arms;
}

std::string mean_loss(const std::vector<const RunRecord*>& rs) {
  std::vector<double> x;
  for (const auto* r : rs) x.push_back(effective_loss(*r));
  return with_ci("%.3f", mean(x), bootstrap_mean_interval(x));
}

}  // namespace

std::string ablation_group(const std::string& group) {
  return group + "-ablations";
}

ReportSection proxy_mechanisms_section(const std::vector<RunRecord>& runs, const WidthFamily& f) {
  ReportSection s;
  s.heading = f.name + ", " + std::to_string(f.steps) + " steps: mechanisms and ablations";
  s.intro =
      "Layer 0 at the last eval, per arm at LR 0.1 and 0.3: what grew with its largest |scaled "
      "logit| (Wortsman et al. 2023 attribute the growth to the queries' and keys' norms). Figures "
      "are medians over the cell's seeds of each run's value at the head, example, query and key "
      "of its largest logit: ‖q‖, ‖k‖ and their cosine there, σ₁ of that head's W_Q and W_K "
      "blocks, the largest |γ| of the block's input LayerNorm, and with qk-norm the largest |γ| "
      "and "
      "‖β‖ of its q and k norms (— without them). The ablation groups (`-ablations`) ran the same "
      "seeds, so their runs start from the same weights and see the same batches as the width's "
      "own arms. Loss: mean over seeds [95% bootstrap], a diverged run counted at its loss at "
      "initialisation; growth: the final max logit over step 0's, median (min–max).";
  ReportTable mech{"Layer 0 at the end, LR 0.1 and 0.3",
                   "",
                   {"width", "arm", "lr", "seeds", "loss", "growth", "max logit", "‖q‖", "‖k‖",
                    "cos", "σ₁(W_Q,h)", "σ₁(W_K,h)", "LN γ max", "q-norm γ max", "k-norm γ max",
                    "q-norm ‖β‖", "k-norm ‖β‖"},
                   {}};
  ReportTable abl{
      "qk-norm's growth at LR 0.3 with its gains or shifts held, or a longer warmup (C2's cause)",
      "Each ablation beside qk-norm and 1/√d_k on the same seeds at the same width. `growth "
      "vs qk-norm`: the ablation's median growth over qk-norm's; `max logit vs 1/√d_k`: its "
      "median final max logit over 1/√d_k's (C2a's absolute reading). The growth stays in the "
      "gains if freezing them removes it, in the shift if holding β at 0 does, and a realistic "
      "warmup removes it if the 60- and 150-step arms end below 10×.",
      {"width", "arm", "seeds", "loss at 0.3", "loss at 0.1", "growth", "growth vs qk-norm",
       "max logit", "max logit vs 1/√d_k", "below 10×"},
      {}};
  for (std::size_t wi = 0; wi < f.widths.size(); ++wi) {
    const int w = f.widths[wi];
    const std::string& g = f.groups[wi];
    const std::string a = ablation_group(g);
    for (const std::string& group : {g, a}) {
      for (const auto& arm : arms_of(runs, group)) {
        for (double lr : {kMidLr, kHighLr}) {
          const auto rs = cell_of(runs, group, f.steps, arm, lr);
          if (rs.empty()) continue;
          const auto [lo, hi] = FamilyView::growth_range(rs);
          const auto l0 = [&](double LayerZeroStats::*m) {
            return shown(median_of(rs, [m](const RunRecord& r) { return r.layer0_final.*m; }));
          };
          mech.rows.push_back(
              {std::to_string(w), arm, fmt("%g", lr), std::to_string(rs.size()), mean_loss(rs),
               shown(median_of(rs, FamilyView::growth)) + " (" + shown(lo) + "–" + shown(hi) + ")",
               l0(&LayerZeroStats::max_logit), l0(&LayerZeroStats::q_norm),
               l0(&LayerZeroStats::k_norm), l0(&LayerZeroStats::qk_cos),
               l0(&LayerZeroStats::wq_sigma1), l0(&LayerZeroStats::wk_sigma1),
               l0(&LayerZeroStats::ln_gain_max), l0(&LayerZeroStats::qn_gamma_max),
               l0(&LayerZeroStats::kn_gamma_max), l0(&LayerZeroStats::qn_beta_norm),
               l0(&LayerZeroStats::kn_beta_norm)});
        }
      }
    }
    const auto base = cell_of(runs, g, f.steps, "qk_norm", kHighLr);
    const auto sqrt_cell = cell_of(runs, g, f.steps, "sqrt_dk", kHighLr);
    const double base_growth = median_of(base, FamilyView::growth);
    const double sqrt_logit =
        median_of(sqrt_cell, [](const RunRecord& r) { return r.layer0_final.max_logit; });
    std::vector<std::pair<std::string, std::string>> rows = {{g, "sqrt_dk"}, {g, "qk_norm"}};
    for (const auto& arm : arms_of(runs, a)) rows.emplace_back(a, arm);
    if (arms_of(runs, a).empty()) continue;  // no ablations at this width
    for (const auto& [group, arm] : rows) {
      const auto rs = cell_of(runs, group, f.steps, arm, kHighLr);
      if (rs.empty()) continue;
      const double growth = median_of(rs, FamilyView::growth);
      const double logit =
          median_of(rs, [](const RunRecord& r) { return r.layer0_final.max_logit; });
      const auto mid = cell_of(runs, group, f.steps, arm, kMidLr);
      abl.rows.push_back(
          {std::to_string(w), arm, std::to_string(rs.size()), mean_loss(rs),
           mid.empty() ? "—" : mean_loss(mid), shown(growth), shown(growth / base_growth, "%.2f"),
           shown(logit), shown(logit / sqrt_logit, "%.2g"),
           std::isfinite(growth) ? (growth < kSaturatedLogitGrowth ? "yes" : "no") : "—"});
    }
  }
  s.tables.push_back(mech);
  if (!abl.rows.empty()) s.tables.push_back(abl);
  return s;
}

}  // namespace attnlab::app
