#include "attnlab/app/report.hpp"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <sstream>
#include <stdexcept>

namespace attnlab::app {

namespace {

std::string base64(const std::string& in) {
  static const char* table = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
  std::string out;
  out.reserve((in.size() + 2) / 3 * 4);
  std::size_t i = 0;
  for (; i + 2 < in.size(); i += 3) {
    const unsigned v = (static_cast<unsigned char>(in[i]) << 16) |
                       (static_cast<unsigned char>(in[i + 1]) << 8) |
                       static_cast<unsigned char>(in[i + 2]);
    for (int s = 18; s >= 0; s -= 6) out += table[(v >> s) & 63];
  }
  if (i < in.size()) {
    unsigned v = static_cast<unsigned char>(in[i]) << 16;
    if (i + 1 < in.size()) v |= static_cast<unsigned char>(in[i + 1]) << 8;
    out += table[(v >> 18) & 63];
    out += table[(v >> 12) & 63];
    out += i + 1 < in.size() ? table[(v >> 6) & 63] : '=';
    out += '=';
  }
  return out;
}

// Backticks of the summary's notes become <code>, **x** becomes <strong>.
std::string inline_markup(const std::string& text) {
  std::string s = html_escape(text), out;
  bool code = false, strong = false;
  for (std::size_t i = 0; i < s.size(); ++i) {
    if (s[i] == '`') {
      out += code ? "</code>" : "<code>";
      code = !code;
    } else if (s.compare(i, 2, "**") == 0) {
      out += strong ? "</strong>" : "<strong>";
      strong = !strong;
      ++i;
    } else {
      out += s[i];
    }
  }
  return out;
}

void figure_html(std::ostringstream& os, const ReportFigure& f) {
  os << "<figure>\n<figcaption><strong>" << html_escape(f.title) << "</strong> "
     << inline_markup(f.caption) << "</figcaption>\n";
  if (!f.file.empty()) {
    const std::string uri = embed_image(f.file);
    if (uri.empty())
      os << "<p class=\"missing\">figure not rendered (" << html_escape(f.file)
         << " is missing: is gnuplot installed?)</p>\n";
    else
      os << "<img alt=\"" << html_escape(f.title) << "\" src=\"" << uri << "\">\n";
  }
  if (!f.heatmaps.empty()) {
    os << "<div class=\"heatmaps\">\n";
    for (const auto& h : f.heatmaps) os << heatmap_svg(h);
    os << "</div>\n";
  }
  os << "</figure>\n";
}

}  // namespace

std::string html_escape(const std::string& s) {
  std::string out;
  for (char c : s) switch (c) {
      case '&':
        out += "&amp;";
        break;
      case '<':
        out += "&lt;";
        break;
      case '>':
        out += "&gt;";
        break;
      case '"':
        out += "&quot;";
        break;
      default:
        out += c;
    }
  return out;
}

std::string embed_image(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return "";
  std::stringstream ss;
  ss << in.rdbuf();
  const std::string bytes = ss.str();
  if (bytes.empty()) return "";
  const bool svg = path.size() > 4 && path.substr(path.size() - 4) == ".svg";
  return std::string("data:") + (svg ? "image/svg+xml" : "image/png") + ";base64," + base64(bytes);
}

std::string heatmap_svg(const Heatmap& h) {
  if (h.weights.size() != h.tq * h.tk)
    throw std::invalid_argument("heatmap_svg: expected tq x tk = " + std::to_string(h.tq * h.tk) +
                                " weights, got " + std::to_string(h.weights.size()));
  const bool mark = h.mark_row >= 0 && h.mark_col >= 0 &&
                    static_cast<std::size_t>(h.mark_row) < h.tq &&
                    static_cast<std::size_t>(h.mark_col) < h.tk;
  const int cell = h.tq > 40 || h.tk > 40 ? 5 : 10, left = 34, top = 8;
  const int w = left + static_cast<int>(h.tk) * cell + 8,
            ht = top + static_cast<int>(h.tq) * cell + 30;
  std::ostringstream os;
  // One <g> per query row carries the row's weights (data-w, %.4g each); its cells are <rect>s
  // sized by the style rule, and cells under 0.005 (white on white) are not drawn, which keeps a
  // 64 x 64 map small.
  // (A <style> in inline SVG applies to the whole page: the rule is scoped by the cell size.)
  os << "<div class=\"heatmap-box\"><svg class=\"heatmap c" << cell << "\" width=\"" << w
     << "\" height=\"" << ht << "\" data-tq=\"" << h.tq << "\" data-tk=\"" << h.tk
     << "\" role=\"img\"><style>svg.c" << cell << " rect{width:" << cell << "px;height:" << cell
     << "px}</style>\n<rect x=\"" << left << "\" y=\"" << top
     << "\" style=\"width:" << h.tk * static_cast<std::size_t>(cell)
     << "px;height:" << h.tq * static_cast<std::size_t>(cell)
     << "px\" fill=\"#fff\" stroke=\"#ccc\"/>\n";
  char buf[96];
  for (std::size_t q = 0; q < h.tq; ++q) {
    os << "<g data-q=\"" << q << "\" transform=\"translate(0," << top + static_cast<int>(q) * cell
       << ")\" data-w=\"";
    for (std::size_t k = 0; k < h.tk; ++k) {
      std::snprintf(buf, sizeof buf, "%s%.4g", k ? " " : "", h.weights[q * h.tk + k]);
      os << buf;
    }
    os << "\">";
    for (std::size_t k = 0; k < h.tk; ++k) {
      const double v = h.weights[q * h.tk + k];
      const double t = std::isfinite(v) ? std::min(1.0, std::max(0.0, v)) : 0.0;
      if (t < 0.005) continue;
      // White (weight 0) to dark blue (weight 1), linear in the weight.
      std::snprintf(buf, sizeof buf, "<rect x=\"%d\" fill=\"#%02x%02x%02x\"/>",
                    left + static_cast<int>(k) * cell, static_cast<int>(255 - t * (255 - 8)),
                    static_cast<int>(255 - t * (255 - 48)),
                    static_cast<int>(255 - t * (255 - 107)));
      os << buf;
    }
    os << "</g>\n";
  }
  if (mark)
    os << "<rect class=\"key\" x=\"" << left + h.mark_col * cell << "\" y=\""
       << top + h.mark_row * cell << "\" fill=\"none\" stroke=\"#d62728\" stroke-width=\"2\"/>\n";
  os << "<text x=\"" << left << "\" y=\"" << ht - 16
     << "\" font-size=\"10\">key position →</text>\n"
     << "<text x=\"10\" y=\"" << top + 40 << "\" font-size=\"10\" transform=\"rotate(-90 10 "
     << top + 40 << ")\">query ←</text>\n</svg><p>" << html_escape(h.caption) << "</p></div>\n";
  return os.str();
}

std::string report_html(const ReportPage& page) {
  std::ostringstream os;
  os << "<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n<title>"
     << html_escape(page.title) << "</title>\n<style>\n"
     << "body{font-family:sans-serif;max-width:1250px;margin:2em auto;padding:0 1em;color:#222}\n"
     << "table{border-collapse:collapse;margin:0.5em 0 1.5em;font-size:13px}\n"
     << "th,td{border:1px solid #bbb;padding:3px 6px;text-align:right}\n"
     << "th{background:#eef}td:first-child,th:first-child{text-align:left}\n"
     << "figure{margin:1em 0 2em}figure img{max-width:100%;border:1px solid #ddd}\n"
     << ".heatmaps{display:flex;flex-wrap:wrap;gap:12px}.heatmap-box p{font-size:12px;margin:2px}\n"
     << ".missing{color:#a00}code{background:#f4f4f4}\n</style>\n</head>\n<body>\n<h1>"
     << html_escape(page.title) << "</h1>\n"
     << page.intro_html << "\n";
  if (!page.headline.empty()) {
    os << "<h2>Headline</h2>\n";
    for (const auto& f : page.headline) figure_html(os, f);
  }
  for (const auto& [heading, figures] : page.figure_groups) {
    os << "<h2>" << html_escape(heading) << "</h2>\n";
    for (const auto& f : figures) figure_html(os, f);
  }
  os << "<h2>Tables</h2>\n";
  for (const auto& s : page.sections) {
    os << "<h3>" << html_escape(s.heading) << "</h3>\n<p>" << inline_markup(s.intro) << "</p>\n";
    for (const auto& t : s.tables) {
      os << "<h4>" << html_escape(t.title) << "</h4>\n";
      if (!t.note.empty()) os << "<p>" << inline_markup(t.note) << "</p>\n";
      os << "<table class=\"summary\" data-title=\"" << html_escape(t.title) << "\">\n<tr>";
      for (const auto& h : t.header) os << "<th>" << html_escape(h) << "</th>";
      os << "</tr>\n";
      for (const auto& row : t.rows) {
        os << "<tr>";
        for (const auto& c : row) os << "<td>" << html_escape(c) << "</td>";
        os << "</tr>\n";
      }
      os << "</table>\n";
    }
  }
  os << "</body>\n</html>\n";
  return os.str();
}

}  // namespace attnlab::app
