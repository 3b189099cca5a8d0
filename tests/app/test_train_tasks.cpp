// Toy tasks (their defining properties, determinism, the fixed eval set) and the data-file format
// (round trip, and errors that name the file and line).
#include <doctest/doctest.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <set>

#include "attnlab/app/data_file.hpp"
#include "attnlab/app/tasks.hpp"

using namespace attnlab;
using namespace attnlab::app;

namespace {
std::string temp_path(const std::string& name) {
  const auto dir = std::filesystem::temp_directory_path() / "attnlab_test_tasks";
  std::filesystem::create_directories(dir);
  return (dir / name).string();
}
void write(const std::string& path, const std::string& text) {
  std::ofstream(path, std::ios::binary) << text;
}
std::string error_of(const std::string& path, const TaskShape* expect = nullptr) {
  try {
    read_data_file(path, expect);
  } catch (const DataFileError& e) {
    return e.what();
  }
  return "";
}
}  // namespace

TEST_CASE("recall: distinct keys, a key-only query, and the target is the paired value") {
  TaskConfig c;  // defaults: 64 keys, 64 values, 32 pairs
  const auto shape = task_shape(c);
  CHECK(shape.seq_len == 33);
  CHECK(shape.field_vocab == std::vector<int>{64, 64});
  Rng rng(1);
  const Batch b = generate_batch(c, 16, rng);
  const auto pos = recall_key_positions(b);
  for (std::size_t i = 0; i < 16; ++i) {
    std::set<int> keys;
    for (std::size_t t = 0; t < 32; ++t) {
      keys.insert(b.fields[0](i, t));
      CHECK(b.fields[1](i, t) >= 0);
      CHECK(b.targets(i, t) == kIgnoreIndex);
    }
    CHECK(keys.size() == 32);
    CHECK(b.fields[1](i, 32) == kAbsent);
    REQUIRE(pos[i] >= 0);
    CHECK(b.targets(i, 32) == b.fields[1](i, static_cast<std::size_t>(pos[i])));
  }
}

TEST_CASE("mqar, reverse and sort targets follow their definitions") {
  Rng rng(2);
  TaskConfig m;
  m.kind = TaskKind::mqar;
  m.pairs = 8;
  m.queries = 4;
  const Batch b = generate_batch(m, 4, rng);
  CHECK(b.length() == 20);
  for (std::size_t i = 0; i < 4; ++i)
    for (std::size_t q = 16; q < 20; ++q) {
      const int key = b.fields[0](i, q);
      int value = -1;
      for (std::size_t t = 0; t < 16; t += 2)
        if (b.fields[0](i, t) == key) value = b.fields[0](i, t + 1);
      CHECK(b.targets(i, q) == value);
      CHECK(value >= m.keys);
    }
  TaskConfig r;
  r.kind = TaskKind::reverse;
  const Batch rb = generate_batch(r, 3, rng);
  for (std::size_t t = 0; t < 12; ++t) CHECK(rb.targets(1, t) == rb.fields[0](1, 11 - t));
  TaskConfig s;
  s.kind = TaskKind::sort;
  const Batch sb = generate_batch(s, 3, rng);
  std::vector<int> x(12);
  for (std::size_t t = 0; t < 12; ++t) x[t] = sb.fields[0](2, t);
  std::sort(x.begin(), x.end());
  for (std::size_t t = 0; t < 12; ++t) CHECK(sb.targets(2, t) == x[t]);
}

TEST_CASE("tasks are deterministic in the seed and the eval set is fixed") {
  TaskConfig c;
  Rng a(5), b(5), other(6);
  CHECK(generate_batch(c, 4, a).fields[0] == generate_batch(c, 4, b).fields[0]);
  CHECK(generate_batch(c, 4, a).fields[0] != generate_batch(c, 4, other).fields[0]);
  CHECK(eval_batch(c, 8).targets == eval_batch(c, 8).targets);
  CHECK_THROWS_AS(parse_task("copy"), std::invalid_argument);
  TaskConfig bad;
  bad.pairs = 65;
  CHECK_THROWS_AS(task_shape(bad), std::invalid_argument);
}

TEST_CASE("data file round trip: write then read gives the same batch") {
  TaskConfig c;
  c.pairs = 5;
  Rng rng(9);
  const Batch b = generate_batch(c, 7, rng);
  const auto path = temp_path("roundtrip.txt");
  write_data_file(path, b, "recall");
  const auto shape = task_shape(c);
  const Batch back = read_data_file(path, &shape);
  REQUIRE(back.fields.size() == 2);
  CHECK(back.fields[0] == b.fields[0]);
  CHECK(back.fields[1] == b.fields[1]);
  CHECK(back.targets == b.targets);
}

TEST_CASE("data file errors name the file, the line and the problem") {
  TaskConfig c;
  c.kind = TaskKind::reverse;
  c.length = 3;
  c.symbols = 4;
  const auto shape = task_shape(c);
  const auto path = temp_path("bad.txt");
  write(path, "# comment\n1 2 3 | 3 2 1\n1 2 | 2 1\n");
  CHECK(error_of(path) == path + ":3: 2 positions, earlier lines have 3");
  write(path, "1 2 3 3 2 1\n");
  CHECK(error_of(path) == path + ":1: missing '|' between positions and targets");
  write(path, "1 x 3 | 3 2 1\n");
  CHECK(error_of(path).find(path + ":1: position 2: 'x'") == 0);
  write(path, "1 2 3 | 3 2\n");
  CHECK(error_of(path) == path + ":1: 3 positions but 2 targets");
  write(path, "1 2 9 | 3 2 1\n");
  CHECK(error_of(path, &shape).find(path + ":1: position 3 field 1: id 9 outside") == 0);
  write(path, "1 2 -3 | 3 2 1\n");
  CHECK(error_of(path).find(path + ":1: position 3") == 0);
  write(path, "");
  CHECK(error_of(path).find("no examples") != std::string::npos);
  write(path, "1 2 3 | 3 2 1\r\n1 2 3 | _ _ 1\r\n");  // Windows line endings are fine
  CHECK(read_data_file(path, &shape).targets(1, 0) == kIgnoreIndex);
  CHECK(error_of(temp_path("missing.txt")).find("cannot open") != std::string::npos);
  CHECK(error_of(std::filesystem::temp_directory_path().string()).find("is a directory") !=
        std::string::npos);
}

TEST_CASE("data file hostile input: invalid UTF-8, overlong lines, missing targets") {
  const auto path = temp_path("hostile.txt");
  write(path, "1 \xff\xfe 3 | 3 2 1\n");
  CHECK(error_of(path).find(path + ":1: position 2: '") == 0);
  write(path, std::string(kMaxDataLineBytes + 10, '1') + " | 1\n");
  CHECK(error_of(path).find(path + ":1: line longer than") == 0);
  write(path, "1 2 3 |\n");
  CHECK(error_of(path) == path + ":1: 3 positions but 0 targets");
  write(path, "| 1 2\n");
  CHECK(error_of(path) == path + ":1: no positions before '|'");
  write(path, "1 2 | 2 1 | 1\n");
  CHECK(error_of(path) == path + ":1: more than one '|'");
  write(path, "1:2 3 | 1 2\n");
  CHECK(error_of(path) == path + ":1: position 2 has 1 fields, expected 2");
  write(path, "# only a comment\n\n   \n");
  CHECK(error_of(path).find("no examples") != std::string::npos);
}
