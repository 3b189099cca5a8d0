#include "attnlab/app/summary.hpp"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <map>
#include <set>
#include <sstream>
#include <tuple>

namespace attnlab::app {

namespace {

std::string fmt(const char* f, double x) {
  char buf[64];
  std::snprintf(buf, sizeof buf, f, x);
  return buf;
}

// Modes in a fixed, readable order; unknown arms after them alphabetically.
int mode_rank(const std::string& m) {
  static const std::vector<std::string> order = {"none", "sqrt_dk", "dk", "qk_norm", "learnable"};
  const auto it = std::find(order.begin(), order.end(), m);
  return it == order.end() ? 100 : static_cast<int>(it - order.begin());
}

std::vector<std::string> sorted_modes(const std::set<std::string>& modes) {
  std::vector<std::string> v(modes.begin(), modes.end());
  std::stable_sort(v.begin(), v.end(), [](const std::string& a, const std::string& b) {
    return std::make_tuple(mode_rank(a), a) < std::make_tuple(mode_rank(b), b);
  });
  return v;
}

// The loss a run contributes to means: a diverged run counts as its loss at initialisation.
double effective_loss(const RunRecord& r) {
  return r.diverged || !std::isfinite(r.final_eval_loss) ? r.init_eval_loss : r.final_eval_loss;
}

}  // namespace

bool run_failed(const RunRecord& r) {
  return r.diverged || !std::isfinite(r.final_eval_loss) ||
         r.final_eval_loss >= kFailedFraction * r.init_eval_loss;
}

double lr_sensitivity(const std::vector<double>& loss_per_lr, double loss_init) {
  if (loss_per_lr.empty()) return 0;
  double best = loss_init;
  for (double l : loss_per_lr) best = std::min(best, std::isfinite(l) ? l : loss_init);
  double sum = 0;
  for (double l : loss_per_lr) sum += std::min(std::isfinite(l) ? l : loss_init, loss_init) - best;
  return sum / static_cast<double>(loss_per_lr.size());
}

std::string summary_csv(const std::vector<RunRecord>& runs) {
  std::ostringstream os;
  os << "group,mode,d_k,lr,seed,steps,init_eval_loss,final_eval_loss,final_eval_acc,"
        "steps_to_95,failed,diverged,diverged_step,init_qk_var_ratio,seconds,dir\n";
  for (const auto& r : runs) {
    os << r.group << ',' << r.mode << ',' << r.d_k << ',' << fmt("%g", r.lr) << ',' << r.seed << ','
       << r.steps << ',' << fmt("%.6g", r.init_eval_loss) << ','
       << (std::isfinite(r.final_eval_loss) ? fmt("%.6g", r.final_eval_loss) : "nan") << ','
       << fmt("%.4f", r.final_eval_acc) << ',' << r.steps_to_target << ','
       << (run_failed(r) ? 1 : 0) << ',' << (r.diverged ? 1 : 0) << ',' << r.diverged_step << ','
       << fmt("%.4f", r.init_qk_var_ratio) << ',' << fmt("%.2f", r.seconds) << ',' << r.dir << '\n';
  }
  return os.str();
}

std::string summary_markdown(const std::vector<RunRecord>& runs, const std::string& title) {
  std::ostringstream os;
  os << "# " << title << "\n\n";
  std::set<std::string> groups;
  for (const auto& r : runs) groups.insert(r.group);
  for (const auto& g : groups) {
    std::set<std::string> mode_set;
    std::set<int> dks;
    std::set<double> lrs;
    std::set<int> seeds;
    // (mode, d_k, lr) -> runs over seeds
    std::map<std::tuple<std::string, int, double>, std::vector<const RunRecord*>> cell;
    double var_sum = 0;
    int var_n = 0;
    for (const auto& r : runs) {
      if (r.group != g) continue;
      mode_set.insert(r.mode);
      dks.insert(r.d_k);
      lrs.insert(r.lr);
      seeds.insert(r.seed);
      cell[{r.mode, r.d_k, r.lr}].push_back(&r);
      var_sum += r.init_qk_var_ratio;
      ++var_n;
    }
    const auto modes = sorted_modes(mode_set);
    const int steps = runs.empty() ? 0 : runs.front().steps;
    os << "## " << g << "\n\n";
    os << seeds.size() << " seed(s) per cell, " << steps << " steps per run. "
       << "Var(q·k)/d_k at step 0, mean over runs: " << fmt("%.3f", var_n ? var_sum / var_n : 0)
       << " (the premise: q·k has variance ≈ d_k at initialisation).\n\n";

    auto header = [&](const char* first) {
      os << "| " << first << " | d_k |";
      for (double lr : lrs) os << " lr " << fmt("%g", lr) << " |";
      os << "\n|---|---|";
      for (std::size_t i = 0; i < lrs.size(); ++i) os << "---|";
      os << '\n';
    };

    os << "### Final eval loss (mean over seeds; `div` = every seed diverged, `(k div)` = k "
          "seeds diverged and count as their initial loss)\n\n";
    header("mode");
    for (const auto& m : modes)
      for (int d : dks) {
        os << "| " << m << " | " << d << " |";
        for (double lr : lrs) {
          const auto it = cell.find({m, d, lr});
          if (it == cell.end()) {
            os << " |";
            continue;
          }
          double sum = 0;
          int ndiv = 0;
          for (const auto* r : it->second) {
            sum += effective_loss(*r);
            ndiv += r->diverged ? 1 : 0;
          }
          const auto n = static_cast<int>(it->second.size());
          if (ndiv == n)
            os << " div |";
          else
            os << ' ' << fmt("%.3f", sum / n) << (ndiv ? " (" + std::to_string(ndiv) + " div)" : "")
               << " |";
        }
        os << '\n';
      }

    os << "\n### Steps to " << fmt("%.0f", 100 * kTargetAccuracy)
       << "% eval accuracy (median over the seeds that reached it; `—` = never; `(k/n)` = k of n "
          "seeds reached it)\n\n";
    header("mode");
    for (const auto& m : modes)
      for (int d : dks) {
        os << "| " << m << " | " << d << " |";
        for (double lr : lrs) {
          const auto it = cell.find({m, d, lr});
          if (it == cell.end()) {
            os << " |";
            continue;
          }
          std::vector<int> reached;
          for (const auto* r : it->second)
            if (r->steps_to_target >= 0 && !r->diverged) reached.push_back(r->steps_to_target);
          const auto n = it->second.size();
          if (reached.empty()) {
            os << " — |";
            continue;
          }
          std::sort(reached.begin(), reached.end());
          os << ' ' << reached[reached.size() / 2];
          if (reached.size() != n) os << " (" << reached.size() << '/' << n << ')';
          os << " |";
        }
        os << '\n';
      }

    os << "\n### Failed and diverged runs (over all LRs and seeds)\n\n"
       << "failed: final eval loss ≥ " << fmt("%.1f", kFailedFraction)
       << " × the eval loss at initialisation, or diverged; diverged: a non-finite loss stopped "
          "the run; reached 95%: the run's eval accuracy reached 95%. Note that predicting the "
          "value marginal (uniform over V values, loss ln V) already scores below 0.9 × the loss "
          "at initialisation when the initial logits are not uniform, so `failed` counts only "
          "runs that learned nothing at all; `reached 95%` counts the runs that solved the "
          "task.\n\n| mode | d_k | failed | diverged | reached 95% | runs "
          "|\n|---|---|---|---|---|---|\n";
    for (const auto& m : modes)
      for (int d : dks) {
        int failed = 0, diverged = 0, solved = 0, n = 0;
        for (const auto& [key, rs] : cell)
          if (std::get<0>(key) == m && std::get<1>(key) == d)
            for (const auto* r : rs) {
              ++n;
              failed += run_failed(*r) ? 1 : 0;
              diverged += r->diverged ? 1 : 0;
              solved += (r->steps_to_target >= 0 && !r->diverged) ? 1 : 0;
            }
        if (n)
          os << "| " << m << " | " << d << " | " << failed << " | " << diverged << " | " << solved
             << " | " << n << " |\n";
      }

    os << "\n### LR sensitivity (Wortsman et al. 2023, arXiv 2309.14322)\n\n"
       << "E over the LR sweep of [min(loss(lr), loss_init) − min over LRs of loss], from "
          "seed-mean "
          "losses, with a diverged run counted as loss_init. Lower means less sensitive, **but** "
          "a mode that fails at every LR also reads near zero (all its losses sit at loss_init): "
          "read this column together with `best loss` and the failures above.\n\n"
       << "| mode | d_k | LR sensitivity | best loss | loss_init |\n|---|---|---|---|---|\n";
    for (const auto& m : modes)
      for (int d : dks) {
        std::vector<double> per_lr;
        double init = 0;
        int ninit = 0;
        for (double lr : lrs) {
          const auto it = cell.find({m, d, lr});
          if (it == cell.end()) continue;
          double sum = 0;
          for (const auto* r : it->second) {
            sum += effective_loss(*r);
            init += r->init_eval_loss;
            ++ninit;
          }
          per_lr.push_back(sum / static_cast<double>(it->second.size()));
        }
        if (per_lr.empty()) continue;
        init /= ninit;
        const double best = std::min(init, *std::min_element(per_lr.begin(), per_lr.end()));
        os << "| " << m << " | " << d << " | " << fmt("%.3f", lr_sensitivity(per_lr, init)) << " | "
           << fmt("%.3f", best) << " | " << fmt("%.3f", init) << " |\n";
      }
    os << '\n';
  }
  return os.str();
}

}  // namespace attnlab::app
