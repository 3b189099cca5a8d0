// safetensors: round trips, the exact byte layout, interop with Python's safetensors in both
// directions, atomic saves, and hostile files (every one must give a CheckpointError naming the
// file and the problem, never a crash).
#include <doctest/doctest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>
#include <xtensor/xarray.hpp>
#include <xtensor/xbuilder.hpp>

#include "attnlab/io/safetensors.hpp"
#include "helpers.hpp"
#include "temp_dir.hpp"

using namespace attnlab;

namespace {

std::vector<std::byte> bytes_of(std::string_view s) {
  std::vector<std::byte> out(s.size());
  if (!s.empty()) std::memcpy(out.data(), s.data(), s.size());
  return out;
}

void append_le64(std::vector<std::byte>& out, std::uint64_t v) {
  for (int i = 0; i < 8; ++i) out.push_back(static_cast<std::byte>((v >> (8 * i)) & 0xff));
}

// A file made by hand: the 8-byte length (the header's size unless overridden), the header text,
// then `data`.
std::vector<std::byte> raw_file(const std::string& header, const std::vector<std::byte>& data,
                                std::optional<std::uint64_t> length = std::nullopt) {
  std::vector<std::byte> out;
  append_le64(out, length.value_or(header.size()));
  const auto h = bytes_of(header);
  out.insert(out.end(), h.begin(), h.end());
  out.insert(out.end(), data.begin(), data.end());
  return out;
}

std::vector<std::byte> zeros(std::size_t n) {
  return std::vector<std::byte>(n, std::byte{0});
}

void write_file(const std::string& path, const std::vector<std::byte>& bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(reinterpret_cast<const char*>(bytes.data()),
            static_cast<std::streamsize>(bytes.size()));
}

std::vector<std::byte> read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::vector<char> chars((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  std::vector<std::byte> out(chars.size());
  if (!chars.empty()) std::memcpy(out.data(), chars.data(), chars.size());
  return out;
}

std::size_t count_temp_files(const std::filesystem::path& dir) {
  std::size_t n = 0;
  for (const auto& entry : std::filesystem::directory_iterator(dir)) {
    if (entry.path().filename().string().find(".tmp-") != std::string::npos) ++n;
  }
  return n;
}

// Several dtypes, a scalar and an empty tensor, and metadata.
std::vector<StoredTensor> sample_tensors() {
  xt::xarray<float> w = xt::arange<float>(12) * 0.25f - 1.0f;
  w.reshape({3, 4});
  xt::xarray<double> b = {1.0, -2.0, 3.5, 1e-300};
  xt::xarray<std::int64_t> i = {std::int64_t{7}, -(std::int64_t{1} << 40)};
  xt::xarray<std::int32_t> j = {{-1, 2}, {3, -4}};
  xt::xarray<std::uint8_t> u = {std::uint8_t{0}, std::uint8_t{255}};
  xt::xarray<bool> m = {true, false, true};
  xt::xarray<double> scalar = xt::xarray<double>::from_shape({});
  scalar() = 42.0;
  xt::xarray<float> empty = xt::xarray<float>::from_shape({0, 3});
  return {make_stored_tensor<float>("w", w),
          make_stored_tensor<double>("b", b),
          make_stored_tensor<std::int64_t>("i", i),
          make_stored_tensor<std::int32_t>("j", j),
          make_stored_tensor<std::uint8_t>("u", u),
          make_stored_tensor<bool>("m", m),
          make_stored_tensor<double>("scalar", scalar),
          make_stored_tensor<float>("empty", empty)};
}

const std::map<std::string, std::string> kSampleMetadata = {{"format", "pt"},
                                                            {"note", "unicode: é √d_k"}};

}  // namespace

TEST_CASE("safetensors: round trip of every dtype, a scalar, an empty tensor and metadata") {
  test::TempDir dir;
  const auto path = dir.file("sample.safetensors");
  const auto tensors = sample_tensors();
  save_safetensors(path, tensors, kSampleMetadata);
  const auto loaded = load_safetensors(path);
  CHECK(loaded.metadata == kSampleMetadata);
  REQUIRE(loaded.tensors.size() == tensors.size());
  for (const auto& t : tensors) {
    const StoredTensor* l = loaded.find(t.name);
    REQUIRE(l != nullptr);
    CHECK(l->dtype == t.dtype);
    CHECK(l->shape == t.shape);
    CHECK(l->data == t.data);
  }
  CHECK(tensor_values<std::int64_t>(*loaded.find("i"))(1) == -(std::int64_t{1} << 40));
  CHECK(tensor_values<bool>(*loaded.find("m")) == xt::xarray<bool>({true, false, true}));
  CHECK(tensor_values<double>(*loaded.find("scalar"))() == 42.0);
  CHECK(tensor_values<float>(*loaded.find("empty")).shape() == std::vector<std::size_t>{0, 3});
  // Writing what was read gives the same bytes.
  CHECK(serialize_safetensors(loaded.tensors, loaded.metadata) == read_file(path));
  CHECK(count_temp_files(dir.path()) == 0);
}

TEST_CASE("safetensors: tensor_values rejects the wrong element type") {
  const auto t = make_stored_tensor<float>("w", xt::xarray<float>({1.0f, 2.0f}));
  CHECK_THROWS_WITH_AS(tensor_values<double>(t, "x.safetensors"),
                       "x.safetensors: tensor 'w' has dtype F32, expected F64", CheckpointError);
}

TEST_CASE("safetensors: the exact byte layout of a small file") {
  xt::xarray<float> a = {1.0f, -2.0f};
  xt::xarray<std::int64_t> n = {(std::int64_t{1} << 40) + 5};
  const auto bytes = serialize_safetensors(
      {make_stored_tensor<float>("a", a), make_stored_tensor<std::int64_t>("n", n)}, {{"k", "v"}});

  // Written out by hand from the format's definition.
  std::string header =
      R"({"__metadata__":{"k":"v"},"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},)"
      R"("n":{"dtype":"I64","shape":[1],"data_offsets":[8,16]}})";
  while (header.size() % 8 != 0) header += ' ';  // the data area starts 8-byte aligned
  std::vector<std::byte> expected;
  append_le64(expected, header.size());
  for (char c : header) expected.push_back(static_cast<std::byte>(c));
  for (unsigned x : {0x00u, 0x00u, 0x80u, 0x3fu,                                 // 1.0f
                     0x00u, 0x00u, 0x00u, 0xc0u,                                 // -2.0f
                     0x05u, 0x00u, 0x00u, 0x00u, 0x00u, 0x01u, 0x00u, 0x00u}) {  // 2^40 + 5
    expected.push_back(static_cast<std::byte>(x));
  }
  CHECK(bytes == expected);
}

TEST_CASE("safetensors: a file written by attnlab reads back with an independent reader") {
  // The reader below uses only nlohmann-json and byte arithmetic, no attnlab code.
  test::TempDir dir;
  const auto path = dir.file("ours.safetensors");
  xt::xarray<double> d = {{0.5, -1.5, 2.25}, {1e10, -0.0, 3.0}};
  xt::xarray<std::int32_t> j = {-7, 8};
  save_safetensors(path,
                   {make_stored_tensor<double>("d", d), make_stored_tensor<std::int32_t>("j", j)},
                   {{"who", "attnlab"}});

  const auto raw = read_file(path);
  REQUIRE(raw.size() >= 8);
  std::uint64_t n = 0;
  for (int i = 7; i >= 0; --i) n = (n << 8) | std::to_integer<std::uint64_t>(raw[i]);
  REQUIRE(8 + n <= raw.size());
  CHECK((8 + n) % 8 == 0);
  const auto header = nlohmann::json::parse(
      std::string(reinterpret_cast<const char*>(raw.data()) + 8, static_cast<std::size_t>(n)));
  CHECK(header.at("__metadata__") == nlohmann::json{{"who", "attnlab"}});
  CHECK(header.size() == 3);
  const std::size_t data_start = 8 + n;

  const auto& hd = header.at("d");
  CHECK(hd.at("dtype") == "F64");
  CHECK(hd.at("shape") == nlohmann::json::array({2, 3}));
  const auto d_begin = hd.at("data_offsets")[0].get<std::size_t>();
  CHECK(hd.at("data_offsets")[1].get<std::size_t>() - d_begin == 48);
  for (std::size_t e = 0; e < 6; ++e) {
    std::uint64_t bits = 0;
    for (int i = 7; i >= 0; --i) {
      bits = (bits << 8) | std::to_integer<std::uint64_t>(raw[data_start + d_begin + 8 * e + i]);
    }
    double value;
    std::memcpy(&value, &bits, 8);
    CHECK(value == d.data()[e]);
  }
  const auto& hj = header.at("j");
  CHECK(hj.at("dtype") == "I32");
  const auto j_begin = hj.at("data_offsets")[0].get<std::size_t>();
  for (std::size_t e = 0; e < 2; ++e) {
    std::uint32_t bits = 0;
    for (int i = 3; i >= 0; --i) {
      bits = (bits << 8) | std::to_integer<std::uint32_t>(raw[data_start + j_begin + 4 * e + i]);
    }
    CHECK(static_cast<std::int32_t>(bits) == j(e));
  }
  CHECK(raw.size() == data_start + 48 + 8);
}

TEST_CASE("safetensors: a file written by Python's safetensors loads with the right values") {
  const auto path = test::data_path("interop/torch_written.safetensors");
  const auto f = load_safetensors(path);
  CHECK(f.metadata ==
        std::map<std::string, std::string>{{"format", "pt"}, {"note", "interop test"}});
  REQUIRE(f.tensors.size() == 3);
  // In data order, which is the file's header order i, b, w.
  CHECK(f.tensors[0].name == "i");
  CHECK(f.tensors[1].name == "b");
  CHECK(f.tensors[2].name == "w");

  const auto w = tensor_values<float>(*f.find("w"), path);
  REQUIRE(w.shape() == std::vector<std::size_t>{3, 4});
  for (std::size_t k = 0; k < 12; ++k) CHECK(w.data()[k] == 0.5f * static_cast<float>(k));
  const auto b = tensor_values<double>(*f.find("b"), path);
  CHECK(b == xt::xarray<double>({1.0, -2.0, 3.5, -4.0}));
  const auto i = tensor_values<std::int64_t>(*f.find("i"), path);
  CHECK(i == xt::xarray<std::int64_t>({7, -9}));
}

TEST_CASE("safetensors: save replaces a file atomically and leaves no temporary file") {
  test::TempDir dir;
  const auto path = dir.file("ckpt.safetensors");
  save_safetensors(path, {make_stored_tensor<float>("a", xt::xarray<float>({1.0f}))});
  const auto first = read_file(path);
  save_safetensors(path, {make_stored_tensor<float>("a", xt::xarray<float>({2.0f, 3.0f}))});
  CHECK(read_file(path) != first);
  CHECK(load_safetensors(path).find("a")->shape == std::vector<std::size_t>{2});
  CHECK(count_temp_files(dir.path()) == 0);
  // A path without a directory part is written in the current directory.
  const auto cwd = std::filesystem::current_path();
  std::filesystem::current_path(dir.path());
  save_safetensors("plain.safetensors", {});
  std::filesystem::current_path(cwd);
  CHECK(load_safetensors(dir.file("plain.safetensors")).tensors.empty());
}

TEST_CASE("safetensors: a failed save removes its temporary file and keeps the old file") {
  test::TempDir dir;
  const auto path = dir.file("ckpt.safetensors");
  save_safetensors(path, {make_stored_tensor<float>("a", xt::xarray<float>({1.0f}))});
  const auto before = read_file(path);

  SUBCASE("invalid tensors: size does not match the shape") {
    StoredTensor bad{"a", Dtype::F32, {3}, zeros(8)};
    CHECK_THROWS_WITH_AS(save_safetensors(path, {bad}),
                         doctest::Contains("cannot write tensor 'a': 8 bytes do not match"),
                         CheckpointError);
  }
  SUBCASE("invalid tensors: a duplicate name") {
    const auto t = make_stored_tensor<float>("a", xt::xarray<float>({1.0f}));
    CHECK_THROWS_WITH_AS(save_safetensors(path, {t, t}), doctest::Contains("'a' twice"),
                         CheckpointError);
  }
  SUBCASE("invalid tensors: the reserved name __metadata__ and an empty name") {
    const auto t = make_stored_tensor<float>("__metadata__", xt::xarray<float>({1.0f}));
    CHECK_THROWS_AS(save_safetensors(path, {t}), CheckpointError);
    const auto e = make_stored_tensor<float>("", xt::xarray<float>({1.0f}));
    CHECK_THROWS_AS(save_safetensors(path, {e}), CheckpointError);
  }
  SUBCASE("metadata that is not UTF-8") {
    CHECK_THROWS_WITH_AS(save_safetensors(path, {}, {{"k", "\xff\xfe"}}),
                         doctest::Contains("must be UTF-8"), CheckpointError);
  }
  SUBCASE("the rename fails: the target is a non-empty directory") {
    const auto target = dir.file("occupied");
    std::filesystem::create_directories(target + "/inside");
    CHECK_THROWS_WITH_AS(save_safetensors(target, {}),
                         doctest::Contains("cannot rename the temporary file over the target"),
                         CheckpointError);
    CHECK(std::filesystem::is_directory(target + "/inside"));
  }
  SUBCASE("the directory does not exist") {
    CHECK_THROWS_WITH_AS(save_safetensors(dir.file("missing/ckpt.safetensors"), {}),
                         doctest::Contains("cannot create a temporary file in"), CheckpointError);
  }
  CHECK(read_file(path) == before);
  CHECK(count_temp_files(dir.path()) == 0);
}

// ---- hostile files
// -------------------------------------------------------------------------------

namespace {

struct HostileCase {
  const char* what;
  std::vector<std::byte> bytes;
  const char* expected;  // a part of the message, after "<file>: "
};

const std::string kEntryA = R"("a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]})";

std::vector<HostileCase> hostile_cases() {
  const auto braced = [](const std::string& body) { return "{" + body + "}"; };
  std::vector<std::byte> bool_data = {std::byte{1}, std::byte{2}};
  return {
      {"empty file", {}, "file is empty"},
      {"5-byte file", zeros(5), "too short for the 8-byte header length"},
      {"header length larger than the file", raw_file(braced(kEntryA), zeros(8), 1000),
       "header length 1000 exceeds the"},
      {"header length 2^63", raw_file(braced(kEntryA), zeros(8), std::uint64_t{1} << 63),
       "exceeds the limit of 104857600 bytes"},
      {"header length just over the cap", raw_file(braced(kEntryA), zeros(8), (100u << 20) + 1),
       "exceeds the limit"},
      {"header length zero", raw_file("", zeros(8)), "header is not valid JSON"},
      {"invalid JSON", raw_file(R"({"a":{"dtype":)", {}), "header is not valid JSON"},
      {"invalid UTF-8 in a name", raw_file("{\"\xff\":1}", {}), "header is not valid JSON"},
      {"trailing garbage after the JSON", raw_file("{}x", {}), "header is not valid JSON"},
      {"JSON array, not an object", raw_file("[1,2]", {}), "header is JSON but not an object"},
      {"JSON nested 100000 deep", raw_file(std::string(100000, '[') + std::string(100000, ']'), {}),
       "header nests JSON deeper than a safetensors header does"},
      {"a shape of arrays",
       raw_file(braced(R"("a":{"dtype":"F32","shape":[[2]],"data_offsets":[0,8]})"), zeros(8)),
       "header nests JSON deeper"},
      {"__metadata__ with an object value",
       raw_file(braced(R"("__metadata__":{"k":{"x":"y"}})"), {}),
       "__metadata__ value of 'k' is not a string"},
      {"entry not an object", raw_file(braced(R"("a":5)"), {}),
       "tensor 'a': entry is not a JSON object"},
      {"unknown key in an entry",
       raw_file(braced(R"("a":{"dtype":"F32","shape":[2],"data_offsets":[0,8],"extra":1})"),
                zeros(8)),
       "tensor 'a': unknown key 'extra'"},
      {"missing data_offsets", raw_file(braced(R"("a":{"dtype":"F32","shape":[2]})"), zeros(8)),
       "tensor 'a': missing 'data_offsets'"},
      {"dtype not a string",
       raw_file(braced(R"("a":{"dtype":42,"shape":[2],"data_offsets":[0,8]})"), zeros(8)),
       "tensor 'a': dtype is not a string"},
      {"unknown dtype F8_E4M3",
       raw_file(braced(R"("a":{"dtype":"F8_E4M3","shape":[4],"data_offsets":[0,4]})"), zeros(8)),
       "tensor 'a': unknown dtype 'F8_E4M3'"},
      {"an F16 tensor whose size does not match its shape",
       raw_file(braced(R"("a":{"dtype":"F16","shape":[4],"data_offsets":[0,16]})"), zeros(16)),
       "tensor 'a'"},
      {"negative extent",
       raw_file(braced(R"("a":{"dtype":"F32","shape":[-2],"data_offsets":[0,8]})"), zeros(8)),
       "tensor 'a': shape[0] is negative (-2)"},
      {"fractional extent",
       raw_file(braced(R"("a":{"dtype":"F32","shape":[2.5],"data_offsets":[0,8]})"), zeros(8)),
       "shape[0] is not an integer"},
      {"extent of 2^64",
       raw_file(
           braced(R"("a":{"dtype":"F32","shape":[18446744073709551616],"data_offsets":[0,8]})"),
           zeros(8)),
       "does not fit in 64 bits"},
      {"shape whose byte count overflows",
       raw_file(
           braced(R"("a":{"dtype":"F64","shape":[4294967296,4294967296],"data_offsets":[0,8]})"),
           zeros(8)),
       "overflows 64 bits when counted in bytes"},
      {"shape not an array",
       raw_file(braced(R"("a":{"dtype":"F32","shape":2,"data_offsets":[0,8]})"), zeros(8)),
       "shape is not an array"},
      {"data_offsets with one element",
       raw_file(braced(R"("a":{"dtype":"F32","shape":[2],"data_offsets":[8]})"), zeros(8)),
       "data_offsets is not an array [begin, end]"},
      {"negative offset",
       raw_file(braced(R"("a":{"dtype":"F32","shape":[2],"data_offsets":[-8,0]})"), zeros(8)),
       "data_offsets[0] is negative"},
      {"offsets end before they begin",
       raw_file(braced(R"("a":{"dtype":"F32","shape":[2],"data_offsets":[8,0]})"), zeros(8)),
       "end before they begin"},
      {"offsets past the end of the file",
       raw_file(braced(R"("a":{"dtype":"F32","shape":[4],"data_offsets":[0,16]})"), zeros(8)),
       "data_offsets [0, 16] run past the data area of 8 bytes"},
      {"length does not match the shape",
       raw_file(braced(R"("a":{"dtype":"F32","shape":[3],"data_offsets":[0,8]})"), zeros(8)),
       "data_offsets [0, 8] hold 8 bytes, but dtype F32 and shape (3,) need 12"},
      {"overlapping tensors",
       raw_file(braced(kEntryA + R"(,"b":{"dtype":"F32","shape":[2],"data_offsets":[4,12]})"),
                zeros(12)),
       "tensor 'b' overlaps tensor 'a'"},
      {"a gap between tensors",
       raw_file(braced(R"("a":{"dtype":"F32","shape":[2],"data_offsets":[4,12]})"), zeros(12)),
       "4 unused bytes before tensor 'a'"},
      {"bytes after the last tensor", raw_file(braced(kEntryA), zeros(12)),
       "4 bytes after the last tensor"},
      {"the same tensor twice", raw_file(braced(kEntryA + "," + kEntryA), zeros(8)),
       "header has the key 'a' twice"},
      {"a field twice",
       raw_file(braced(R"("a":{"dtype":"F32","dtype":"F32","shape":[2],"data_offsets":[0,8]})"),
                zeros(8)),
       "header has the key 'dtype' twice"},
      {"empty tensor name",
       raw_file(braced(R"("":{"dtype":"F32","shape":[2],"data_offsets":[0,8]})"), zeros(8)),
       "a tensor has an empty name"},
      {"__metadata__ not an object", raw_file(braced(R"("__metadata__":[1])"), {}),
       "__metadata__ is not a JSON object"},
      {"__metadata__ with a number", raw_file(braced(R"("__metadata__":{"step":5})"), {}),
       "__metadata__ value of 'step' is not a string"},
      {"BOOL byte that is not 0 or 1",
       raw_file(braced(R"("m":{"dtype":"BOOL","shape":[2],"data_offsets":[0,2]})"), bool_data),
       "tensor 'm': BOOL element 1 is 2, not 0 or 1"},
  };
}

}  // namespace

TEST_CASE("safetensors: hostile files give a clear error naming the file and the problem") {
  test::TempDir dir;
  for (const auto& c : hostile_cases()) {
    CAPTURE(c.what);
    const auto path = dir.file("hostile.safetensors");
    write_file(path, c.bytes);
    try {
      load_safetensors(path);
      FAIL("no error for: " << c.what);
    } catch (const CheckpointError& e) {
      const std::string message = e.what();
      CAPTURE(message);
      CHECK(message.rfind(path + ": ", 0) == 0);
      CHECK(message.find(c.expected) != std::string::npos);
      CHECK(e.file() == path);
    }
  }
}

TEST_CASE("safetensors: a directory, a device and a missing path are refused") {
  test::TempDir dir;
  CHECK_THROWS_WITH_AS(
      load_safetensors(dir.path().string()),
      (dir.path().string() + ": is a directory, expected a safetensors file").c_str(),
      CheckpointError);
  CHECK_THROWS_WITH_AS(load_safetensors("/dev/null"), "/dev/null: is not a regular file",
                       CheckpointError);
  const auto missing = dir.file("nope.safetensors");
  CHECK_THROWS_WITH_AS(load_safetensors(missing),
                       (missing + ": cannot open: No such file or directory").c_str(),
                       CheckpointError);
}

TEST_CASE("safetensors: a valid file truncated at every byte offset is refused cleanly") {
  const auto full = serialize_safetensors(sample_tensors(), kSampleMetadata);
  REQUIRE(full.size() > 200);
  CHECK_NOTHROW(parse_safetensors(full, "full"));
  std::size_t refused = 0;
  for (std::size_t n = 0; n < full.size(); ++n) {
    const std::span<const std::byte> prefix(full.data(), n);
    CHECK_THROWS_AS(parse_safetensors(prefix, "truncated"), CheckpointError);
    try {
      parse_safetensors(prefix, "truncated");
    } catch (const CheckpointError& e) {
      refused += std::string(e.what()).rfind("truncated: ", 0) == 0;
    }
  }
  CHECK(refused == full.size());
}

TEST_CASE("safetensors: single-byte corruptions never crash, and what is accepted is consistent") {
  const auto full = serialize_safetensors(sample_tensors(), kSampleMetadata);
  std::size_t refused = 0, accepted = 0;
  for (std::size_t pos = 0; pos < full.size(); ++pos) {
    for (unsigned flip : {0x01u, 0x20u, 0x80u, 0xffu}) {
      auto bytes = full;
      bytes[pos] ^= static_cast<std::byte>(flip);
      try {
        const auto f = parse_safetensors(bytes, "corrupt");
        ++accepted;
        // Whatever still parses describes a file whose tensors tile the data area exactly.
        std::uint64_t header = 0;
        for (int i = 7; i >= 0; --i) header = (header << 8) | std::to_integer<unsigned>(bytes[i]);
        std::uint64_t total = 0;
        for (const auto& t : f.tensors) total += t.data.size();
        CHECK(8 + header + total == bytes.size());
      } catch (const CheckpointError&) {
        ++refused;
      }
    }
  }
  CHECK(refused > 0);
  CHECK(accepted > 0);  // flips inside tensor data (or padding) are legal files
}

TEST_CASE("write_file_atomic: a stale temporary of the same file is removed, others are kept") {
  test::TempDir dir;
  const std::string path = dir.file("notes.txt");
  const auto touch = [&](const std::string& name) { std::ofstream(dir.file(name)) << "x"; };
  touch(".notes.txt.tmp-abc123");   // what a writer killed mid-write leaves
  touch(".other.txt.tmp-abc123");   // another file's: maybe a writer still at work
  touch(".notes.txt.tmp-keep-me");  // not a temporary of ours (wrong shape)
  write_file_atomic(path, std::string_view("hello\n"));
  std::ifstream in(path);
  const std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  CHECK(text == "hello\n");
  CHECK_FALSE(std::filesystem::exists(dir.file(".notes.txt.tmp-abc123")));
  CHECK(std::filesystem::exists(dir.file(".other.txt.tmp-abc123")));
  CHECK(std::filesystem::exists(dir.file(".notes.txt.tmp-keep-me")));
}
