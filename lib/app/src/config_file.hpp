// Private to lib/app/src: reading a JSON config file (a run's, a study's) whole.
#pragma once

#include <fstream>
#include <sstream>
#include <stdexcept>
#include <string>

namespace attnlab::app {

// Hands the text of the file `path` to read (the config type's read_*_text). Throws
// std::invalid_argument "<path>: cannot open the <what>" when the file cannot be opened, and what
// read throws as std::invalid_argument again, prefixed with "<path>: ".
template <class Read>
void read_config_file_text(const std::string& path, const char* what, Read read) {
  std::ifstream in(path);
  if (!in) throw std::invalid_argument(path + ": cannot open the " + what);
  std::stringstream ss;
  ss << in.rdbuf();
  try {
    read(ss.str());
  } catch (const std::invalid_argument& e) {
    throw std::invalid_argument(path + ": " + e.what());
  }
}

}  // namespace attnlab::app
