// Hostile data files: one table row per bad (or odd but acceptable) input, with the outcome each
// must have. Every error names the file and, for a problem on a line, the line number.
#include <doctest/doctest.h>

#include <fstream>
#include <optional>
#include <string>
#include <vector>

#include "attnlab/app/data_file.hpp"
#include "temp_dir.hpp"

using namespace attnlab::app;

namespace {

struct DataCase {
  const char* what;
  std::string text;
  // nullopt: accepted; else the message after "<file>" (":<line>: ..." or ": ...").
  std::optional<std::string> error;
};

void write_text(const std::string& path, const std::string& text) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out << text;
}

}  // namespace

TEST_CASE("hostile data files: each is refused with the file, line and problem, or accepted") {
  // Checked against a reverse task: 3 positions, one field of vocabulary 4, outputs in [0, 4).
  const TaskShape shape{{4}, 4, 3};
  const std::string overlong = "1 2 3 | 3 2 1 #" + std::string(kMaxDataLineBytes, ' ') + "\n";
  const std::vector<DataCase> table = {
      {"empty file", "", ": no examples (empty file or only comments)"},
      {"only comments and blank lines", "# a\n\n   \n\t\n# b\n", ": no examples"},
      {"a line without '|' (no targets)", "1 2 3\n",
       ":1: missing '|' between positions and targets"},
      {"two '|'", "1 2 3 | 3 2 | 1\n", ":1: more than one '|'"},
      {"nothing before '|'", " | 1 2 3\n", ":1: no positions before '|'"},
      {"fewer targets than positions", "1 2 3 | 3 2\n", ":1: 3 positions but 2 targets"},
      {"lines of different lengths", "1 2 3 | 3 2 1\n1 2 | 2 1\n",
       ":2: 2 positions, earlier lines have 3"},
      {"a token outside the vocabulary", "1 2 4 | 3 2 1\n",
       ":1: position 3 field 1: id 4 outside the vocabulary [0, 4)"},
      {"a target outside the output vocabulary", "1 2 3 | 3 2 7\n",
       ":1: target 3: id 7 outside the output vocabulary [0, 4)"},
      {"a negative id", "1 -2 3 | 3 2 1\n", ":1: position 2: '-2' is not a non-negative integer"},
      {"an id that overflows int", "1 99999999999 3 | 3 2 1\n",
       ":1: position 2: '99999999999' is not a non-negative integer"},
      {"a word", "1 two 3 | 3 2 1\n", ":1: position 2: 'two' is not"},
      {"invalid UTF-8 in a token", "1 \xff\xfe 3 | 3 2 1\n", ":1: position 2: "},
      {"a NUL byte in a token", std::string("1 2\0 3 | 3 2 1\n", 15), ":1: position 2: "},
      {"an extra field", "1:2 2 3 | 3 2 1\n", ":1: position 2 has 1 fields, expected 2"},
      {"a position with one field too many for the task", "1:1 2:2 3:3 | 3 2 1\n",
       ": examples have 2 fields per position, the task expects 1"},
      {"a sequence shorter than the task's", "1 2 | 2 1\n",
       ": examples have 2 positions, the task expects 3"},
      {"a line longer than the limit", overlong, ":1: line longer than 1048576 bytes"},
      {"an error on a later line", "1 2 3 | 3 2 1\n# fine\n\n1 2 3 | 3 2 x\n",
       ":4: target 3: 'x' is not a non-negative integer or '_'"},
      // Accepted: the sensible reading.
      {"Windows line endings", "1 2 3 | 3 2 1\r\n0 1 2 | 2 1 0\r\n", std::nullopt},
      {"no newline at the end", "1 2 3 | 3 2 1", std::nullopt},
      {"tabs and repeated spaces", "1\t2   3 |\t3 2  1\n", std::nullopt},
      {"invalid UTF-8 inside a comment", "# \xff\xfe\n1 2 3 | 3 2 1\n", std::nullopt},
      {"absent fields and unlabelled targets", "1 _ 3 | _ _ 1\n", std::nullopt},
  };
  attnlab::test::TempDir dir;
  const auto path = dir.file("data.txt");
  for (const auto& row : table) {
    CAPTURE(row.what);
    write_text(path, row.text);
    if (!row.error) {
      CHECK_NOTHROW(read_data_file(path, &shape));
      continue;
    }
    try {
      read_data_file(path, &shape);
      FAIL("accepted: " << row.what);
    } catch (const DataFileError& e) {
      const std::string message = e.what();
      CAPTURE(message);
      CHECK(message.rfind(path + *row.error, 0) == 0);
    }
  }
}

TEST_CASE("hostile data files: a directory and a missing file are refused by name") {
  attnlab::test::TempDir dir;
  CHECK_THROWS_WITH_AS(read_data_file(dir.path().string()),
                       (dir.path().string() + ": is a directory").c_str(), DataFileError);
  const auto missing = dir.file("missing.txt");
  CHECK_THROWS_WITH_AS(read_data_file(missing),
                       doctest::Contains((missing + ": cannot open").c_str()), DataFileError);
}
