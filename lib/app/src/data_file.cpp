#include "attnlab/app/data_file.hpp"

#include "attnlab/io/safetensors.hpp"

#include <charconv>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <vector>

namespace attnlab::app {

namespace {

[[noreturn]] void fail(const std::string& path, std::size_t line, const std::string& what) {
  throw DataFileError(path + ":" + std::to_string(line) + ": " + what);
}

std::vector<std::string_view> split_ws(std::string_view s) {
  std::vector<std::string_view> out;
  std::size_t i = 0;
  while (i < s.size()) {
    while (i < s.size() && (s[i] == ' ' || s[i] == '\t')) ++i;
    const std::size_t start = i;
    while (i < s.size() && s[i] != ' ' && s[i] != '\t') ++i;
    if (i > start) out.push_back(s.substr(start, i - start));
  }
  return out;
}

// "_" -> absent; otherwise a non-negative decimal integer.
bool parse_id(std::string_view text, int absent, int& value) {
  if (text == "_") {
    value = absent;
    return true;
  }
  const auto* end = text.data() + text.size();
  const auto [ptr, ec] = std::from_chars(text.data(), end, value);
  return ec == std::errc() && ptr == end && value >= 0;
}

std::string in_quotes(std::string_view s) {
  std::string out = "'";
  for (char c : s.substr(0, 40)) out += (static_cast<unsigned char>(c) < 0x20 ? '?' : c);
  if (s.size() > 40) out += "...";
  return out + "'";
}

}  // namespace

Batch read_data_file(const std::string& path, const TaskShape* expect) {
  std::error_code ec;
  if (std::filesystem::is_directory(path, ec)) throw DataFileError(path + ": is a directory");
  std::ifstream in(path, std::ios::binary);
  if (!in) throw DataFileError(path + ": cannot open for reading");

  std::vector<std::vector<int>> fields;  // per example: T*F ids
  std::vector<std::vector<int>> targets;
  std::size_t T = 0, F = 0;
  std::string line;
  std::size_t lineno = 0;
  while (std::getline(in, line)) {
    ++lineno;
    if (line.size() > kMaxDataLineBytes)
      fail(path, lineno, "line longer than " + std::to_string(kMaxDataLineBytes) + " bytes");
    if (!line.empty() && line.back() == '\r') line.pop_back();
    const auto first = line.find_first_not_of(" \t");
    if (first == std::string::npos || line[first] == '#') continue;
    const auto bar = line.find('|');
    if (bar == std::string::npos) fail(path, lineno, "missing '|' between positions and targets");
    if (line.find('|', bar + 1) != std::string::npos) fail(path, lineno, "more than one '|'");
    const auto positions = split_ws(std::string_view(line).substr(0, bar));
    const auto labels = split_ws(std::string_view(line).substr(bar + 1));
    if (positions.empty()) fail(path, lineno, "no positions before '|'");
    if (labels.size() != positions.size())
      fail(path, lineno,
           std::to_string(positions.size()) + " positions but " + std::to_string(labels.size()) +
               " targets");
    if (T == 0) T = positions.size();
    if (positions.size() != T)
      fail(
          path, lineno,
          std::to_string(positions.size()) + " positions, earlier lines have " + std::to_string(T));
    std::vector<int> ex_fields, ex_targets;
    for (std::size_t t = 0; t < T; ++t) {
      std::size_t nf = 0;
      std::string_view pos = positions[t];
      while (true) {
        const auto colon = pos.find(':');
        const auto tok = pos.substr(0, colon);
        int id = 0;
        if (!parse_id(tok, kAbsent, id))
          fail(path, lineno,
               "position " + std::to_string(t + 1) + ": " + in_quotes(tok) +
                   " is not a non-negative integer or '_'");
        if (expect && nf < expect->field_vocab.size() && id >= expect->field_vocab[nf])
          fail(path, lineno,
               "position " + std::to_string(t + 1) + " field " + std::to_string(nf + 1) + ": id " +
                   std::to_string(id) + " outside the vocabulary [0, " +
                   std::to_string(expect->field_vocab[nf]) + ")");
        ex_fields.push_back(id);
        ++nf;
        if (colon == std::string_view::npos) break;
        pos = pos.substr(colon + 1);
      }
      if (F == 0) F = nf;
      if (nf != F)
        fail(path, lineno,
             "position " + std::to_string(t + 1) + " has " + std::to_string(nf) +
                 " fields, expected " + std::to_string(F));
      int target = 0;
      if (!parse_id(labels[t], kIgnoreIndex, target))
        fail(path, lineno,
             "target " + std::to_string(t + 1) + ": " + in_quotes(labels[t]) +
                 " is not a non-negative integer or '_'");
      if (expect && target >= expect->output_vocab)
        fail(path, lineno,
             "target " + std::to_string(t + 1) + ": id " + std::to_string(target) +
                 " outside the output vocabulary [0, " + std::to_string(expect->output_vocab) +
                 ")");
      ex_targets.push_back(target);
    }
    fields.push_back(std::move(ex_fields));
    targets.push_back(std::move(ex_targets));
  }
  if (in.bad()) throw DataFileError(path + ": read error");
  if (fields.empty()) throw DataFileError(path + ": no examples (empty file or only comments)");
  if (expect) {
    if (F != expect->field_vocab.size())
      throw DataFileError(path + ": examples have " + std::to_string(F) +
                          " fields per position, the task expects " +
                          std::to_string(expect->field_vocab.size()));
    if (T != static_cast<std::size_t>(expect->seq_len))
      throw DataFileError(path + ": examples have " + std::to_string(T) +
                          " positions, the task expects " + std::to_string(expect->seq_len));
  }
  const std::size_t B = fields.size();
  Batch out;
  for (std::size_t f = 0; f < F; ++f) out.fields.push_back(TokenIds::from_shape({B, T}));
  out.targets = TokenIds::from_shape({B, T});
  for (std::size_t b = 0; b < B; ++b)
    for (std::size_t t = 0; t < T; ++t) {
      for (std::size_t f = 0; f < F; ++f) out.fields[f](b, t) = fields[b][t * F + f];
      out.targets(b, t) = targets[b][t];
    }
  return out;
}

std::string format_example(const Batch& batch, std::size_t row) {
  std::ostringstream os;
  const std::size_t T = batch.length();
  auto id = [](int v) { return v < 0 ? std::string("_") : std::to_string(v); };
  for (std::size_t t = 0; t < T; ++t) {
    if (t) os << ' ';
    for (std::size_t f = 0; f < batch.fields.size(); ++f)
      os << (f ? ":" : "") << id(batch.fields[f](row, t));
  }
  os << " |";
  for (std::size_t t = 0; t < T; ++t) os << ' ' << id(batch.targets(row, t));
  return os.str();
}

void write_data_file(const std::string& path, const Batch& batch, std::string_view task) {
  std::ostringstream out;
  out << "# attnlab data file, task " << task << ": " << batch.size() << " examples, "
      << batch.length() << " positions, " << batch.fields.size()
      << " field(s) per position (format: data/README.md)\n";
  for (std::size_t b = 0; b < batch.size(); ++b) out << format_example(batch, b) << '\n';
  try {
    write_file_atomic(path, std::string_view(out.str()));
  } catch (const CheckpointError& e) {
    throw DataFileError(e.what());
  }
}

}  // namespace attnlab::app
