#include "attnlab/app/plot.hpp"

#include "attnlab/io/safetensors.hpp"

#include <cstdlib>
#include <filesystem>
#include <fstream>

namespace attnlab::app {

namespace {
std::string shell_quote(const std::string& s) {
  std::string out = "'";
  for (char c : s) out += (c == '\'') ? std::string("'\\''") : std::string(1, c);
  return out + "'";
}
}  // namespace

const std::string& gnuplot_png_terminal() {
  static const std::string terminal = [] {
    if (std::system("gnuplot -e 'set terminal pngcairo' >/dev/null 2>&1") == 0)
      return std::string("pngcairo");
    if (std::system("gnuplot -e 'set terminal png' >/dev/null 2>&1") == 0)
      return std::string("png");
    return std::string();
  }();
  return terminal;
}

void write_text_file(const std::string& path, const std::string& text) {
  try {
    write_file_atomic(path, std::string_view(text));
  } catch (const CheckpointError& e) {
    throw PlotError(e.what());
  }
}

void render_gnuplot(const std::string& script_path, const std::string& script) {
  write_text_file(script_path, script);
  if (gnuplot_png_terminal().empty())
    throw PlotError("gnuplot not found (install gnuplot-nox); kept the data and " + script_path);
  const std::filesystem::path p(script_path);
  const std::string dir = p.has_parent_path() ? p.parent_path().string() : ".";
  const std::string cmd = "cd " + shell_quote(dir) + " && gnuplot " +
                          shell_quote(p.filename().string()) + " >/dev/null 2>&1";
  if (std::system(cmd.c_str()) != 0) throw PlotError("gnuplot failed on " + script_path);
}

}  // namespace attnlab::app
