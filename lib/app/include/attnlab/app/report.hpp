// The study's report.html: one self-contained page (no network fetch) with every table of
// summary.md, the figures gnuplot rendered (embedded as SVG data URIs), and attention heatmaps
// drawn as inline SVG.
#pragma once

#include <string>
#include <vector>

#include "attnlab/app/summary.hpp"

namespace attnlab::app {

// Query × key attention weights of one example (row-major tq × tk), and the cell to mark: the
// recall task's correct key for the query at `mark_row` (-1: none).
struct Heatmap {
  std::string caption;
  std::vector<double> weights;
  std::size_t tq = 0, tk = 0;
  int mark_row = -1, mark_col = -1;
};

// An inline <svg class="heatmap cN" data-tq data-tk> (N: the cell size in px): one <g data-q
// data-w="w0 w1 ..."> per query row with a cell per key (white to dark blue by weight; cells under
// 0.005 left blank), and the marked cell outlined in red (a mark outside the map is not drawn).
// std::invalid_argument unless weights has tq x tk values.
std::string heatmap_svg(const Heatmap& h);

// A figure file embedded as a data URI (SVG or PNG by extension); "" when it cannot be read.
std::string embed_image(const std::string& path);

struct ReportFigure {
  std::string title, caption;
  std::string file;               // a gnuplot SVG to embed, or
  std::vector<Heatmap> heatmaps;  // heatmaps drawn inline
};

struct ReportPage {
  std::string title;
  std::string intro_html;  // trusted HTML (the study's own text)
  std::vector<ReportFigure> headline;
  std::vector<ReportSection> sections;  // summary_sections
  std::vector<std::pair<std::string, std::vector<ReportFigure>>> figure_groups;
};

// The page as HTML; a figure whose file cannot be read says so in its place.
std::string report_html(const ReportPage& page);

std::string html_escape(const std::string& s);

}  // namespace attnlab::app
