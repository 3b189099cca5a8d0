// The mechanism figures against direct computations: σ₁ by power iteration (spectral_norm,
// head_spectral_norms) against an SVD, the max-logit pair (max_logit_pairs) against a search over a
// tiny model's scores with its own queries and keys, and a run's metrics.csv and summary.csv
// columns; and the divergence rule (loss_diverged, run_diverged) on records like the committed
// studies' (SGD runs that blew up to 1e22 without overflowing, plateaued high-LR runs).
#include <doctest/doctest.h>

#include <cmath>
#include <fstream>
#include <limits>
#include <sstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>
#include <xtensor-blas/xlinalg.hpp>
#include <xtensor/xview.hpp>

#include "attnlab/app/context.hpp"
#include "attnlab/app/metrics.hpp"
#include "attnlab/app/model.hpp"
#include "attnlab/app/run_config.hpp"
#include "attnlab/app/summary.hpp"
#include "attnlab/app/trainer.hpp"
#include "temp_dir.hpp"

using namespace attnlab;
using attnlab::app::Context;

namespace {

// The largest singular value by LAPACK.
double svd_sigma1(const xt::xtensor<double, 2>& a) {
  const auto [u, s, vt] = xt::linalg::svd(a, false);
  return s(0);
}

app::TrainConfig tiny_recall(bool qk_norm) {
  app::TrainConfig c;
  c.task.kind = app::TaskKind::recall;
  c.task.keys = 8;
  c.task.values = 8;
  c.task.pairs = 4;
  c.model.block.attention.d_model = 24;
  c.model.block.attention.heads = 3;
  c.model.block.attention.d_k = 8;
  c.model.block.attention.qk_norm = qk_norm;
  c.model.layers = 2;
  c.lr = 3e-2;
  c.steps = 8;
  c.warmup = 0;
  c.batch = 8;
  c.eval_every = 4;
  c.eval_size = 16;
  c.progress = false;
  return c;
}

std::vector<std::string> split(const std::string& line) {
  std::vector<std::string> cells;
  std::stringstream ss(line);
  for (std::string c; std::getline(ss, c, ',');) cells.push_back(c);
  return cells;
}

}  // namespace

TEST_CASE("spectral_norm: power iteration gives σ₁ of each head's block, as an SVD does") {
  SUBCASE("rank one: σ₁ = ‖u‖‖v‖") {
    const std::vector<double> u = {1, -2, 0.5, 3, 1}, v = {2, 0.25, -1};
    std::vector<float> a;
    for (double x : u)
      for (double y : v) a.push_back(static_cast<float>(x * y));
    CHECK(app::spectral_norm(a.data(), 5, 3, 3) ==
          doctest::Approx(std::sqrt(15.25) * std::sqrt(5.0625)).epsilon(1e-6));
  }
  SUBCASE("a zero block is 0") {
    const std::vector<float> zero(12, 0.0f);
    CHECK(app::spectral_norm(zero.data(), 4, 3, 3) == 0);
  }
  SUBCASE("the heads of a random W (C, H·D) against LAPACK's SVD of each block") {
    Rng rng(7);
    const std::size_t C = 24, H = 3, D = 8;
    const auto w = randn<float, 2>({C, H * D}, rng);
    const std::vector<double> sigma = app::head_spectral_norms(w.data(), C, H, D);
    REQUIRE(sigma.size() == H);
    for (std::size_t h = 0; h < H; ++h) {
      CAPTURE(h);
      const xt::xtensor<double, 2> block =
          xt::cast<double>(xt::view(w, xt::all(), xt::range(h * D, (h + 1) * D)));
      CHECK(sigma[h] == doctest::Approx(svd_sigma1(block)).epsilon(1e-4));
    }
    // Not the Frobenius norm, which bounds σ₁ from above.
    const xt::xtensor<double, 2> first = xt::cast<double>(xt::view(w, xt::all(), xt::range(0, D)));
    CHECK(sigma[0] < std::sqrt(xt::sum(first * first)()) * 0.9);
  }
}

TEST_CASE("max_logit_pairs: the pair of a tiny model's largest |logit| and its q and k norms") {
  for (const bool qk_norm : {false, true}) {
    CAPTURE(qk_norm);
    const app::TrainConfig c = tiny_recall(qk_norm);
    Rng rng(3);
    app::Model model(app::resolve_model(c.model, app::task_shape(c.task)), rng);
    Rng data(4);
    model.forward(app::generate_batch(c.task, 5, data));
    const Tensor4<float> s = model.attention_logits(0), q = model.attention_queries(0),
                         k = model.attention_keys(0);
    const std::vector<app::MaxLogitPair> pairs = app::max_logit_pairs(s, q, k);
    REQUIRE(pairs.size() == 3);
    const double scale = 1 / std::sqrt(8.0);
    for (std::size_t h = 0; h < 3; ++h) {
      CAPTURE(h);
      // The largest finite |S| by a direct search.
      double best = -1;
      std::size_t bb = 0, bi = 0, bj = 0;
      for (std::size_t b = 0; b < s.shape()[0]; ++b)
        for (std::size_t i = 0; i < s.shape()[2]; ++i)
          for (std::size_t j = 0; j < s.shape()[3]; ++j)
            if (std::isfinite(s(b, h, i, j)) && std::abs(s(b, h, i, j)) > best) {
              best = std::abs(s(b, h, i, j));
              bb = b, bi = i, bj = j;
            }
      const app::MaxLogitPair& p = pairs[h];
      CHECK(p.abs_logit == best);
      CHECK(p.b == bb);
      CHECK(p.i == bi);
      CHECK(p.j == bj);
      double qq = 0, kk = 0, qk = 0;
      for (std::size_t d = 0; d < 8; ++d) {
        qq += double(q(bb, h, bi, d)) * q(bb, h, bi, d);
        kk += double(k(bb, h, bj, d)) * k(bb, h, bj, d);
        qk += double(q(bb, h, bi, d)) * k(bb, h, bj, d);
      }
      CHECK(p.q_norm == doctest::Approx(std::sqrt(qq)).epsilon(1e-12));
      CHECK(p.k_norm == doctest::Approx(std::sqrt(kk)).epsilon(1e-12));
      CHECK(std::abs(p.cos) <= 1.0);
      // The logit is s·q·k of that very pair: s‖q‖‖k‖|cos|.
      CHECK(best == doctest::Approx(scale * std::abs(qk)).epsilon(1e-5));
      CHECK(best == doctest::Approx(scale * p.q_norm * p.k_norm * std::abs(p.cos)).epsilon(1e-5));
    }
  }
}

TEST_CASE("metrics.csv and summary.csv: the mechanism columns of a run with qk-norm") {
  const test::TempDir dir;
  app::TrainConfig c = tiny_recall(true);
  c.out = dir.file("run");
  const app::TrainResult r = app::train_model(c, Context{.threads = 1});
  REQUIRE(r.steps_done == 8);
  std::ifstream in(c.out + "/metrics.csv");
  std::string line;
  std::getline(in, line);
  const std::vector<std::string> header = split(line);
  const auto col = [&](const std::string& name) {
    const auto it = std::find(header.begin(), header.end(), name);
    REQUIRE_MESSAGE(it != header.end(), "no column " << name);
    return static_cast<std::size_t>(it - header.begin());
  };
  std::vector<std::vector<std::string>> rows;
  while (std::getline(in, line)) rows.push_back(split(line));
  REQUIRE(rows.size() == 3);  // steps 0, 4, 8
  const double scale = 1 / std::sqrt(8.0);
  for (const auto& row : rows) {
    REQUIRE(row.size() == header.size());
    const auto at = [&](const std::string& name) { return std::stod(row[col(name)]); };
    for (int l = 0; l < 2; ++l)
      for (int h = 0; h < 3; ++h) {
        const std::string p = "l" + std::to_string(l) + "h" + std::to_string(h) + "_";
        CAPTURE(p);
        // 7 printed digits of each factor.
        CHECK(at(p + "max_logit") == doctest::Approx(scale * at(p + "q_norm") * at(p + "k_norm") *
                                                     std::abs(at(p + "qk_cos")))
                                         .epsilon(1e-5));
        CHECK(at(p + "wq_sigma1") > 0);
        CHECK(at(p + "wk_sigma1") > 0);
      }
  }
  const auto first = [&](const std::string& name) { return std::stod(rows.front()[col(name)]); };
  // At initialisation the norms' gains are ones and their shifts zeros.
  CHECK(first("l0_ln_gain_max") == 1);
  CHECK(first("l1_qn_gamma_max") == 1);
  CHECK(first("l0_qn_beta_norm") == 0);
  CHECK(first("l0_kn_gamma_max") == 1);
  CHECK(first("l0_kn_beta_norm") == 0);
  CHECK(std::stod(rows.back()[col("l0_qn_beta_norm")]) > 0);  // training moved them
  // The run's layer-0 figures are those of the head holding the max logit.
  std::size_t top = 0;
  for (std::size_t h = 1; h < 3; ++h)
    if (std::stod(rows.back()[col("l0h" + std::to_string(h) + "_max_logit")]) >
        std::stod(rows.back()[col("l0h" + std::to_string(top) + "_max_logit")]))
      top = h;
  const std::string p = "l0h" + std::to_string(top) + "_";
  CHECK(r.layer0_final.q_norm == doctest::Approx(std::stod(rows.back()[col(p + "q_norm")])));
  CHECK(r.layer0_final.wk_sigma1 == doctest::Approx(std::stod(rows.back()[col(p + "wk_sigma1")])));
  CHECK(r.layer0_init.qn_gamma_max == 1);

  // summary.csv keeps them, and reads back a summary written before them as NaN.
  app::RunRecord rec;
  rec.group = "g";
  rec.mode = "qk_norm";
  rec.layer0_init = r.layer0_init;
  rec.layer0_final = r.layer0_final;
  const std::string path = dir.file("summary.csv");
  std::ofstream(path) << app::summary_csv({rec});
  const auto back = app::read_summary_csv(path);
  REQUIRE(back.size() == 1);
  CHECK(back[0].layer0_final.qk_cos == doctest::Approx(r.layer0_final.qk_cos).epsilon(1e-5));
  CHECK(back[0].layer0_init.kn_beta_norm == 0);
  const std::string old_path = dir.file("old.csv");
  std::ofstream(old_path)
      << "group,mode,d_k,lr,seed,steps,init_eval_loss,final_eval_loss,final_eval_acc,steps_to_95,"
         "failed,diverged,diverged_step,works,init_qk_var_ratio,init_jacobian,seconds,dir\n"
         "g,sqrt_dk,32,0.1,0,300,4.8,2.5,0.3,-1,0,0,-1,0,1.0,0.25,5.0,runs/x\n";
  const auto old = app::read_summary_csv(old_path);
  REQUIRE(old.size() == 1);
  CHECK(std::isnan(old[0].layer0_final.q_norm));
  CHECK(std::isnan(old[0].layer0_init.wq_sigma1));
  CHECK(old[0].final_eval_loss == 2.5);
}

TEST_CASE("loss_diverged: non-finite, or more than 10 nats above the loss at initialisation") {
  CHECK(app::kDivergenceMargin == 10);
  CHECK(app::loss_diverged(std::numeric_limits<double>::quiet_NaN(), 4.0));
  CHECK(app::loss_diverged(std::numeric_limits<double>::infinity(), 4.0));
  CHECK(app::loss_diverged(6.3e22, 4.0));  // the smallest finite SGD blow-up committed
  CHECK(app::loss_diverged(14.01, 4.0));   // just past the margin
  CHECK_FALSE(app::loss_diverged(14.0, 4.0));
  CHECK_FALSE(app::loss_diverged(4.5, 4.0));   // worse than at initialisation, not diverged
  CHECK_FALSE(app::loss_diverged(3.47, 3.9));  // a plateau at ln 32 after collapse
}

TEST_CASE("run_diverged: a record's final loss past the rule counts as diverged everywhere") {
  // One cell of three seeds as the full study's recall/sgd at lr 1: one flagged (NaN), two that
  // blew up to finite losses the trainer did not flag then; and a healthy plateaued cell.
  std::vector<app::RunRecord> runs;
  for (int seed = 0; seed < 3; ++seed) {
    app::RunRecord r;
    r.group = "recall/sgd";
    r.mode = "sqrt_dk";
    r.d_k = 16;
    r.lr = 1;
    r.seed = seed;
    r.steps = 400;
    r.init_eval_loss = 3.9;
    r.diverged = seed == 0;
    r.final_eval_loss = seed == 0 ? std::numeric_limits<double>::quiet_NaN() : 4e23;
    r.steps_to_target = -1;
    runs.push_back(r);
    r.lr = 0.316;
    r.diverged = false;
    r.final_eval_loss = 3.47;
    runs.push_back(r);
  }
  app::mark_working(runs);
  int flagged = 0, by_rule = 0;
  for (const auto& r : runs) {
    flagged += r.diverged ? 1 : 0;
    by_rule += app::run_diverged(r) ? 1 : 0;
    if (r.lr == 1) {
      CHECK(app::effective_loss(r) == r.init_eval_loss);
      CHECK(app::failure_kind(r) == app::FailureKind::diverged);
    } else {
      CHECK(app::failure_kind(r) != app::FailureKind::diverged);
    }
  }
  CHECK(flagged == 1);
  CHECK(by_rule == 3);
  const app::CellKey key{"recall/sgd", 400, "sqrt_dk", 16};
  const auto cell = app::cell_runs(runs, key, 1.0);
  CHECK(app::loss_stat(cell).diverged == 3);
  CHECK(app::loss_stat(cell).mean == doctest::Approx(3.9));
  CHECK(app::failure_counts(app::cell_runs(runs, key, -1)).diverged == 3);
  // The tables say the same: 3 of 6 diverged in the success table, 3 in how runs fail, `div` at
  // lr 1; summary.csv keeps the trainer's flag as it was.
  const std::string md = app::summary_markdown(runs, "t");
  CHECK(md.find("| 3/6 | 3/6 |") != std::string::npos);  // failed, diverged
  CHECK(md.find("| 3 (50%) |") != std::string::npos);
  CHECK(md.find("| div |") != std::string::npos);
  const std::string csv = app::summary_csv(runs);
  CHECK(csv.find(",4e+23,") != std::string::npos);
}
