#include "attnlab/tensor.hpp"

#include <sstream>

namespace attnlab {

std::string format_shape(const std::vector<std::ptrdiff_t>& extents) {
  std::ostringstream out;
  out << '(';
  for (std::size_t i = 0; i < extents.size(); ++i) {
    if (i) out << ", ";
    if (extents[i] < 0) {
      out << '*';
    } else {
      out << extents[i];
    }
  }
  if (extents.size() == 1) out << ',';
  out << ')';
  return out.str();
}

std::string format_shape(const std::vector<std::size_t>& extents) {
  return format_shape(std::vector<std::ptrdiff_t>(extents.begin(), extents.end()));
}

namespace {
std::string shape_message(std::string_view op, std::string_view arg,
                          const std::vector<std::ptrdiff_t>& expected,
                          const std::vector<std::size_t>& actual, std::string_view detail) {
  std::string msg = std::string(op) + ": " + std::string(arg) + " expected " +
                    format_shape(expected) + ", got " + format_shape(actual);
  if (!detail.empty()) msg += " (" + std::string(detail) + ")";
  return msg;
}
}  // namespace

ShapeError::ShapeError(std::string_view op, std::string_view arg,
                       const std::vector<std::ptrdiff_t>& expected,
                       const std::vector<std::size_t>& actual, std::string_view detail)
    : std::invalid_argument(shape_message(op, arg, expected, actual, detail)) {}

void check_extents(std::string_view op, std::string_view arg,
                   const std::vector<std::size_t>& actual,
                   const std::vector<std::ptrdiff_t>& expected) {
  bool ok = actual.size() == expected.size();
  for (std::size_t i = 0; ok && i < actual.size(); ++i) {
    ok = expected[i] < 0 || static_cast<std::size_t>(expected[i]) == actual[i];
  }
  if (!ok) {
    const char* detail = actual.size() == expected.size() ? "" : "wrong rank";
    throw ShapeError(op, arg, expected, actual, detail);
  }
}

std::string shown_text(std::string_view text, std::size_t max) {
  if (text.size() <= max) return std::string(text);
  std::size_t cut = max;  // back to the start of the character at `max`
  while (cut > 0 && (static_cast<unsigned char>(text[cut]) & 0xC0) == 0x80) --cut;
  return std::string(text.substr(0, cut)) + "... (" + std::to_string(text.size()) + " characters)";
}

std::string number_text(double x) {
  std::ostringstream out;
  out << x;
  return out.str();
}

void check_arg(bool ok, std::string_view op, std::string_view name, std::string_view what,
               std::string_view got) {
  if (!ok) {
    throw std::invalid_argument(std::string(op) + ": " + std::string(name) + " expected " +
                                std::string(what) + ", got " + shown_text(got, 200));
  }
}

}  // namespace attnlab
