// The study's figures (gnuplot data, scripts and SVGs, and the report's heatmaps), one group at a
// time. Internal to the app (lib/app/src/study).
#pragma once

#include <string>
#include <vector>

#include "attnlab/app/report.hpp"
#include "attnlab/app/study.hpp"

namespace attnlab::app {

// "0.001": a peak LR as file and figure names show it.
std::string lr_label(double lr);
// s with '/' and ' ' replaced by '_', for a file name.
std::string sanitize(std::string s);

// One group's figures: the headline, the rest, and the files they wrote.
struct GroupPlots {
  std::vector<ReportFigure> headline;
  std::vector<ReportFigure> figures;
  std::vector<std::string> files;
};

// The figures of one group: the LR window vs d_k (headline), and per budget the loss vs LR, the
// curves and attention health at the largest d_k, the heatmaps, and the Jacobian at init. The
// first failure of a figure goes to `error`; the others are still drawn.
GroupPlots plot_group(const std::string& out, const StudyGroup& g,
                      const std::vector<RunRecord>& runs, std::string& error);

}  // namespace attnlab::app
