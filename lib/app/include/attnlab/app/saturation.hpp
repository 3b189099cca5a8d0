// The seed's argument, measured at initialisation (no training): how the attention softmax
// saturates with d_k under each scaling mode, with the real initialisation of the study's model:
// x (B, T, C) rows with unit RMS, W_q, W_k ~ N(0, 1/C) of shape (C, D), q = x W_q, k = x W_k.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "attnlab/ops/attention.hpp"

namespace attnlab::app {

struct SaturationConfig {
  std::vector<std::size_t> d_k = {4, 8, 16, 32, 64, 128, 256, 512, 1024};
  std::vector<Scaling> modes = {Scaling::none, Scaling::sqrt_dk, Scaling::dk};
  std::size_t batch = 8;     // B
  std::size_t keys = 64;     // T (self-attention: Tq = Tk = T)
  std::size_t d_model = 64;  // C
  std::uint64_t seed = 0;
};

struct SaturationRow {
  std::size_t d_k = 0;
  Scaling mode = Scaling::sqrt_dk;
  double qk_var_ratio = 0;   // Var(q·k)/d_k of the unscaled dot products
  double entropy = 0;        // mean attention entropy (nats)
  double entropy_ratio = 0;  // entropy / ln Tk
  double max_weight = 0;     // mean max weight per row
  double saturated = 0;      // fraction of rows with max weight > 0.99
  double jacobian_norm = 0;  // mean ‖diag(p) − p pᵀ‖_F per row
  double max_abs_logit = 0;  // max |scaled logit|
};

// One row per (d_k, mode). Within a d_k every mode sees the same x, W_q and W_k.
std::vector<SaturationRow> saturation_sweep(const SaturationConfig& config);

// A fixed-width text table of the rows.
std::string saturation_table(const std::vector<SaturationRow>& rows, std::size_t keys);

// Writes DIR/saturation.csv, saturation.md, saturation.dat, saturation.gp and renders
// saturation.png. Throws PlotError (after writing the data) if gnuplot is missing.
void write_saturation(const std::string& dir, const std::vector<SaturationRow>& rows,
                      std::size_t keys);

}  // namespace attnlab::app
