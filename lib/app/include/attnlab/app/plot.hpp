// Plots rendered by gnuplot (Debian gnuplot-nox) from a data file and a script that are both kept
// beside the PNG, so that a user can restyle and re-render them.
#pragma once

#include <stdexcept>
#include <string>

namespace attnlab::app {

class PlotError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// "pngcairo" if this gnuplot has it, else "png"; "" when gnuplot is not installed.
const std::string& gnuplot_png_terminal();

// Writes `script` (which must `set output` to a path relative to its directory) to script_path
// and runs gnuplot on it from that directory. Throws PlotError when gnuplot is missing (the data
// and script stay written) or fails; the message names the script.
void render_gnuplot(const std::string& script_path, const std::string& script);

// Writes text to a file; throws PlotError naming the file on failure.
void write_text_file(const std::string& path, const std::string& text);

}  // namespace attnlab::app
