#include "attnlab/app/saturation.hpp"

#include <cmath>
#include <cstdio>
#include <filesystem>
#include <sstream>

#include "attnlab/app/metrics.hpp"
#include "attnlab/app/plot.hpp"
#include "attnlab/blas.hpp"
#include "attnlab/random.hpp"

#include "text_format.hpp"

namespace attnlab::app {

std::vector<SaturationRow> saturation_sweep(const SaturationConfig& c) {
  const std::size_t B = c.batch, T = c.keys, C = c.d_model;
  std::vector<SaturationRow> rows;
  for (std::size_t D : c.d_k) {
    Rng rng(c.seed * 1000003 + D);
    // x: (B*T, C), each row rescaled to unit RMS (what a norm layer hands attention).
    auto x = randn<double, 2>({B * T, C}, rng);
    for (std::size_t r = 0; r < B * T; ++r) {
      double ss = 0;
      for (std::size_t j = 0; j < C; ++j) ss += x(r, j) * x(r, j);
      const double inv = 1.0 / std::sqrt(ss / static_cast<double>(C));
      for (std::size_t j = 0; j < C; ++j) x(r, j) *= inv;
    }
    const double w_std = 1.0 / std::sqrt(static_cast<double>(C));
    const auto w_q = randn<double, 2>({C, D}, rng, w_std);
    const auto w_k = randn<double, 2>({C, D}, rng, w_std);
    Tensor4<double> q = Tensor4<double>::from_shape({B, 1, T, D});
    Tensor4<double> k = Tensor4<double>::from_shape({B, 1, T, D});
    const int m = static_cast<int>(B * T), n = static_cast<int>(D), kk = static_cast<int>(C);
    blas::gemm<double>(false, false, m, n, kk, 1.0, x.data(), kk, w_q.data(), n, 0.0, q.data(), n);
    blas::gemm<double>(false, false, m, n, kk, 1.0, x.data(), kk, w_k.data(), n, 0.0, k.data(), n);
    // (B*T, D) is (B, 1, T, D) in memory. v is unused by the weights; zeros keep it defined.
    Tensor4<double> v = Tensor4<double>::from_shape({B, 1, T, 1});
    v.fill(0.0);

    SdpaOptions raw;
    raw.scaling = Scaling::none;
    const auto dots = sdpa_scores(q, k, raw);  // (B,1,T,T) unscaled q·k
    double mean = 0, sq = 0;
    for (double s : dots) mean += s;
    mean /= static_cast<double>(dots.size());
    for (double s : dots) sq += (s - mean) * (s - mean);
    const double var_ratio = sq / static_cast<double>(dots.size() - 1) / static_cast<double>(D);

    for (Scaling mode : c.modes) {
      SdpaOptions options;
      options.scaling = mode;
      const auto scores = sdpa_scores(q, k, options);
      SdpaCache<double> cache;
      sdpa_forward(cache, q, k, v, options);
      const auto health = attention_health(cache.p, scores);
      SaturationRow r;
      r.d_k = D;
      r.mode = mode;
      r.qk_var_ratio = var_ratio;
      r.entropy = health[0].entropy;
      r.entropy_ratio = health[0].entropy / std::log(static_cast<double>(T));
      r.max_weight = health[0].max_weight;
      r.saturated = health[0].saturated_fraction;
      r.jacobian_norm = health[0].jacobian_norm;
      r.max_abs_logit = health[0].max_abs_logit;
      rows.push_back(r);
    }
  }
  return rows;
}

std::string saturation_table(const std::vector<SaturationRow>& rows, std::size_t keys) {
  std::ostringstream os;
  os << "Attention at initialisation: x unit RMS, W_q, W_k ~ N(0, 1/d_model), " << keys
     << " keys per query (ln Tk = " << fmt("%.3f", std::log(static_cast<double>(keys))) << ")\n\n";
  os << "|  d_k | mode    | Var(q.k)/d_k | entropy | entropy/ln Tk | max weight | saturated | "
        "Jacobian norm | max |logit| |\n";
  os << "|-----:|---------|-------------:|--------:|--------------:|-----------:|----------:|"
        "--------------:|------------:|\n";
  for (const auto& r : rows) {
    char buf[256];
    std::snprintf(buf, sizeof buf,
                  "| %4zu | %-7s | %12.3f | %7.3f | %13.3f | %10.3f | %9.3f | %13.4f | %11.2f |\n",
                  r.d_k, std::string(to_string(r.mode)).c_str(), r.qk_var_ratio, r.entropy,
                  r.entropy_ratio, r.max_weight, r.saturated, r.jacobian_norm, r.max_abs_logit);
    os << buf;
  }
  return os.str();
}

void write_saturation(const std::string& dir, const std::vector<SaturationRow>& rows,
                      std::size_t keys) {
  std::filesystem::create_directories(dir);
  std::ostringstream csv;
  csv << "d_k,mode,qk_var_ratio,entropy,entropy_ratio,max_weight,saturated,jacobian_norm,"
         "max_abs_logit\n";
  for (const auto& r : rows)
    csv << r.d_k << ',' << to_string(r.mode) << ',' << r.qk_var_ratio << ',' << r.entropy << ','
        << r.entropy_ratio << ',' << r.max_weight << ',' << r.saturated << ',' << r.jacobian_norm
        << ',' << r.max_abs_logit << '\n';
  write_text_file(dir + "/saturation.csv", csv.str());
  write_text_file(dir + "/saturation.md", saturation_table(rows, keys));
  // One gnuplot data block per mode (separated by two blank lines, addressed with `index`).
  std::ostringstream dat;
  int block = 0;
  std::ostringstream plots[5];
  const char* titles[5] = {"entropy / ln Tk", "mean max weight",
                           "fraction of rows saturated (max w > 0.99)", "softmax Jacobian norm",
                           "Var(q.k)/d_k (unscaled dots)"};
  const int cols[5] = {3, 4, 5, 6, 2};
  for (Scaling mode : {Scaling::none, Scaling::sqrt_dk, Scaling::dk}) {
    bool any = false;
    for (const auto& r : rows) any = any || r.mode == mode;
    if (!any) continue;
    dat << "# mode " << to_string(mode)
        << "\n# d_k qk_var_ratio entropy_ratio max_weight saturated jacobian_norm\n";
    for (const auto& r : rows)
      if (r.mode == mode)
        dat << r.d_k << ' ' << r.qk_var_ratio << ' ' << r.entropy_ratio << ' ' << r.max_weight
            << ' ' << r.saturated << ' ' << r.jacobian_norm << '\n';
    dat << "\n\n";
    for (int p = 0; p < 5; ++p)
      plots[p] << (block ? ", " : "") << "'saturation.dat' index " << block
               << " using 1:" << cols[p] << " with linespoints lw 2 title '" << to_string(mode)
               << "'";
    ++block;
  }
  write_text_file(dir + "/saturation.dat", dat.str());
  std::ostringstream gp;
  gp << "# attnlab saturation: re-render with `gnuplot saturation.gp`\n"
     << "set terminal " << gnuplot_png_terminal() << " size 1500,900\nset termoption noenhanced\n"
     << "set output 'saturation.png'\nset multiplot layout 2,3 title 'Attention at initialisation "
        "vs d_k ("
     << keys << " keys, x unit RMS, W ~ N(0,1/d_model))'\n"
     << "set logscale x 2\nset xlabel 'd_k'\nset grid\nset key top left\n";
  for (int p = 0; p < 5; ++p) {
    gp << "set title '" << titles[p] << "'\n"
       << (p == 0 ? "set key bottom left\n" : "set key top left\n");
    if (p == 4) gp << "set yrange [0:2]\n";
    gp << "plot " << plots[p].str() << '\n';
  }
  gp << "unset multiplot\n";
  render_gnuplot(dir + "/saturation.gp", gp.str());
}

}  // namespace attnlab::app
