// safetensors reader and writer; see the header for the layout and the checks.
#include "attnlab/io/safetensors.hpp"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <bit>
#include <cerrno>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <set>
#include <tuple>

#include <nlohmann/json.hpp>

#include "attnlab/tensor.hpp"

namespace attnlab {

// Tensor bytes are copied as they are in memory; the format is little-endian.
static_assert(sizeof(std::size_t) == 8, "attnlab assumes a 64-bit host");
static_assert(std::endian::native == std::endian::little,
              "attnlab's safetensors code assumes a little-endian host");

namespace {

using Json = nlohmann::json;

constexpr std::size_t kLengthBytes = 8;
constexpr std::string_view kMetadataKey = "__metadata__";

[[noreturn]] void fail(const std::string& file, const std::string& problem) {
  throw CheckpointError(file, problem);
}

std::string in_quotes(std::string_view s) {
  return "'" + std::string(s) + "'";
}

std::string errno_text(int err) {
  return std::strerror(err);
}

// product(shape) × element size, or nullopt on overflow.
std::optional<std::uint64_t> byte_count(const std::vector<std::size_t>& shape, std::size_t size) {
  std::uint64_t n = 1;
  for (const auto extent : shape) {
    if (__builtin_mul_overflow(n, static_cast<std::uint64_t>(extent), &n)) return std::nullopt;
  }
  if (__builtin_mul_overflow(n, static_cast<std::uint64_t>(size), &n)) return std::nullopt;
  return n;
}

std::uint64_t read_le64(const std::byte* p) {
  std::uint64_t v = 0;
  for (std::size_t i = 0; i < kLengthBytes; ++i) {
    v |= static_cast<std::uint64_t>(std::to_integer<unsigned>(p[i])) << (8 * i);
  }
  return v;
}

void write_le64(std::byte* p, std::uint64_t v) {
  for (std::size_t i = 0; i < kLengthBytes; ++i)
    p[i] = static_cast<std::byte>((v >> (8 * i)) & 0xff);
}

// A JSON value that must be a non-negative integer (shape extents, offsets).
std::uint64_t json_unsigned(const Json& v, const std::string& file, const std::string& what) {
  if (v.is_number_unsigned()) return v.get<std::uint64_t>();
  if (v.is_number_integer()) fail(file, what + " is negative (" + v.dump() + ")");
  if (v.is_number_float()) {
    fail(file, what + " is not an integer or does not fit in 64 bits (" + v.dump() + ")");
  }
  fail(file, what + " is not a number (" + v.dump() + ")");
}

// A valid header nests three levels: {name: {"shape": [extent]}}. Deeper nesting is refused while
// parsing, before it can cost memory (a 100 MiB header of '[' would otherwise build a deep tree).
constexpr int kMaxHeaderDepth = 2;  // the callback's depth of the innermost container's start
struct HeaderTooDeep {};

// Parses the header, rejecting duplicate keys at any depth (nlohmann keeps the last silently).
Json parse_header(const char* begin, const char* end, const std::string& file) {
  std::vector<std::set<std::string>> keys;  // one set per open object
  std::string duplicate;
  const auto track = [&](int depth, Json::parse_event_t event, Json& parsed) {
    switch (event) {
      case Json::parse_event_t::object_start:
        if (depth > kMaxHeaderDepth) throw HeaderTooDeep{};
        keys.emplace_back();
        break;
      case Json::parse_event_t::array_start:
        if (depth > kMaxHeaderDepth) throw HeaderTooDeep{};
        break;
      case Json::parse_event_t::object_end:
        if (!keys.empty()) keys.pop_back();
        break;
      case Json::parse_event_t::key:
        if (!keys.empty() && parsed.is_string() &&
            !keys.back().insert(parsed.get<std::string>()).second && duplicate.empty()) {
          duplicate = parsed.get<std::string>();
        }
        break;
      default:
        break;
    }
    return true;
  };
  Json header;
  try {
    header = Json::parse(begin, end, track, /*allow_exceptions=*/true);
  } catch (const Json::exception& e) {
    fail(file, std::string("header is not valid JSON: ") + e.what());
  } catch (const HeaderTooDeep&) {
    fail(file, "header nests JSON deeper than a safetensors header does");
  }
  if (!duplicate.empty()) fail(file, "header has the key " + in_quotes(duplicate) + " twice");
  if (!header.is_object()) fail(file, "header is JSON but not an object");
  return header;
}

struct Entry {
  std::string name;
  Dtype dtype;
  std::vector<std::size_t> shape;
  std::uint64_t begin, end;
};

Entry parse_entry(const std::string& name, const Json& v, std::uint64_t data_size,
                  const std::string& file) {
  const std::string where = "tensor " + in_quotes(name);
  if (name.empty()) fail(file, "a tensor has an empty name");
  if (!v.is_object()) fail(file, where + ": entry is not a JSON object");
  for (const auto& item : v.items()) {
    if (item.key() != "dtype" && item.key() != "shape" && item.key() != "data_offsets") {
      fail(file, where + ": unknown key " + in_quotes(item.key()));
    }
  }
  for (const char* key : {"dtype", "shape", "data_offsets"}) {
    if (!v.contains(key)) fail(file, where + ": missing " + in_quotes(key));
  }
  Entry e{name, Dtype::F32, {}, 0, 0};

  const auto& dtype = v["dtype"];
  if (!dtype.is_string()) fail(file, where + ": dtype is not a string");
  const auto parsed = parse_dtype(dtype.get<std::string>());
  if (!parsed) {
    fail(file, where + ": unknown dtype " + in_quotes(dtype.get<std::string>()) +
                   " (attnlab reads F32, F64, F16, BF16, I64, I32, U8, BOOL)");
  }
  e.dtype = *parsed;

  const auto& shape = v["shape"];
  if (!shape.is_array()) fail(file, where + ": shape is not an array");
  for (std::size_t i = 0; i < shape.size(); ++i) {
    const auto extent = json_unsigned(shape[i], file, where + ": shape[" + std::to_string(i) + "]");
    e.shape.push_back(static_cast<std::size_t>(extent));
  }
  const auto need = byte_count(e.shape, dtype_size(e.dtype));
  if (!need) {
    fail(file,
         where + ": shape " + format_shape(e.shape) + " overflows 64 bits when counted in bytes");
  }

  const auto& offsets = v["data_offsets"];
  if (!offsets.is_array() || offsets.size() != 2) {
    fail(file, where + ": data_offsets is not an array [begin, end]");
  }
  e.begin = json_unsigned(offsets[0], file, where + ": data_offsets[0]");
  e.end = json_unsigned(offsets[1], file, where + ": data_offsets[1]");
  const std::string range = "[" + std::to_string(e.begin) + ", " + std::to_string(e.end) + "]";
  if (e.begin > e.end) fail(file, where + ": data_offsets " + range + " end before they begin");
  if (e.end > data_size) {
    fail(file, where + ": data_offsets " + range + " run past the data area of " +
                   std::to_string(data_size) + " bytes (file truncated?)");
  }
  if (e.end - e.begin != *need) {
    fail(file, where + ": data_offsets " + range + " hold " + std::to_string(e.end - e.begin) +
                   " bytes, but dtype " + std::string(to_string(e.dtype)) + " and shape " +
                   format_shape(e.shape) + " need " + std::to_string(*need));
  }
  return e;
}

std::map<std::string, std::string> parse_metadata(const Json& v, const std::string& file) {
  if (!v.is_object()) fail(file, "__metadata__ is not a JSON object");
  std::map<std::string, std::string> out;
  for (const auto& item : v.items()) {
    if (!item.value().is_string()) {
      fail(file, "__metadata__ value of " + in_quotes(item.key()) + " is not a string");
    }
    out.emplace(item.key(), item.value().get<std::string>());
  }
  return out;
}

// Writes all of `bytes` to fd, retrying on EINTR and short writes. Returns 0 or an errno.
int write_all(int fd, const std::byte* bytes, std::size_t n) {
  while (n > 0) {
    const ssize_t w = ::write(fd, bytes, n);
    if (w < 0) {
      if (errno == EINTR) continue;
      return errno;
    }
    bytes += w;
    n -= static_cast<std::size_t>(w);
  }
  return 0;
}

}  // namespace

CheckpointError::CheckpointError(std::string file, const std::string& problem)
    : std::runtime_error(file + ": " + problem), file_(std::move(file)) {}

std::size_t dtype_size(Dtype dtype) {
  switch (dtype) {
    case Dtype::F32:
    case Dtype::I32:
      return 4;
    case Dtype::F64:
    case Dtype::I64:
      return 8;
    case Dtype::U8:
    case Dtype::BOOL:
      return 1;
    case Dtype::F16:
    case Dtype::BF16:
      return 2;
  }
  return 0;
}

template <class T>
StoredTensor make_stored_tensor(std::string name, const xt::xarray<T>& values) {
  StoredTensor t;
  t.name = std::move(name);
  t.dtype = dtype_of<T>();
  t.shape.assign(values.shape().begin(), values.shape().end());
  t.data.resize(values.size() * sizeof(T));
  std::size_t i = 0;
  for (const T x : values) {  // row-major iteration, whatever the array's layout
    if constexpr (std::is_same_v<T, bool>) {
      t.data[i] = std::byte{x ? std::uint8_t{1} : std::uint8_t{0}};
    } else {
      std::memcpy(t.data.data() + i, &x, sizeof(T));
    }
    i += sizeof(T);
  }
  return t;
}

StoredTensor make_stored_tensor_half(std::string name, const xt::xarray<float>& values,
                                     Dtype dtype) {
  if (dtype != Dtype::F16 && dtype != Dtype::BF16) {
    throw std::invalid_argument("make_stored_tensor_half: dtype expected F16 or BF16, got " +
                                std::string(to_string(dtype)));
  }
  StoredTensor t;
  t.name = std::move(name);
  t.dtype = dtype;
  t.shape.assign(values.shape().begin(), values.shape().end());
  t.data.resize(values.size() * 2);
  for (std::size_t i = 0; i < values.size(); ++i) {
    const float v = values.data()[i];
    const std::uint16_t h = dtype == Dtype::F16 ? float_to_f16(v) : float_to_bf16(v);
    const unsigned char bytes[2] = {static_cast<unsigned char>(h & 0xff),
                                    static_cast<unsigned char>(h >> 8)};  // little-endian
    std::memcpy(t.data.data() + 2 * i, bytes, 2);
  }
  return t;
}

template <class T>
xt::xarray<T> tensor_values(const StoredTensor& tensor, const std::string& file) {
  if constexpr (std::is_same_v<T, float> || std::is_same_v<T, double>) {
    if (tensor.dtype == Dtype::F16 || tensor.dtype == Dtype::BF16) {
      const auto need = byte_count(tensor.shape, 2);
      if (!need || *need != tensor.data.size()) {
        fail(file, "tensor " + in_quotes(tensor.name) + " holds " +
                       std::to_string(tensor.data.size()) +
                       " bytes, which does not match its shape " + format_shape(tensor.shape));
      }
      xt::xarray<T> out = xt::xarray<T>::from_shape(tensor.shape);
      const bool f16 = tensor.dtype == Dtype::F16;
      for (std::size_t i = 0; i < out.size(); ++i) {
        unsigned char bytes[2];
        std::memcpy(bytes, tensor.data.data() + 2 * i, 2);
        const auto h = static_cast<std::uint16_t>(bytes[0] | (bytes[1] << 8));
        out.data()[i] = static_cast<T>(f16 ? f16_to_float(h) : bf16_to_float(h));
      }
      return out;
    }
  }
  if (tensor.dtype != dtype_of<T>()) {
    fail(file, "tensor " + in_quotes(tensor.name) + " has dtype " +
                   std::string(to_string(tensor.dtype)) + ", expected " +
                   std::string(to_string(dtype_of<T>())));
  }
  const auto need = byte_count(tensor.shape, sizeof(T));
  if (!need || *need != tensor.data.size()) {
    fail(file, "tensor " + in_quotes(tensor.name) + " holds " + std::to_string(tensor.data.size()) +
                   " bytes, which does not match its shape " + format_shape(tensor.shape));
  }
  xt::xarray<T> out = xt::xarray<T>::from_shape(tensor.shape);
  for (std::size_t i = 0; i < out.size(); ++i) {
    if constexpr (std::is_same_v<T, bool>) {
      out.data()[i] = tensor.data[i] != std::byte{0};
    } else {
      std::memcpy(out.data() + i, tensor.data.data() + i * sizeof(T), sizeof(T));
    }
  }
  return out;
}

#define ATTNLAB_INSTANTIATE_TENSOR_IO(T)                                          \
  template StoredTensor make_stored_tensor<T>(std::string, const xt::xarray<T>&); \
  template xt::xarray<T> tensor_values<T>(const StoredTensor&, const std::string&);
ATTNLAB_INSTANTIATE_TENSOR_IO(float)
ATTNLAB_INSTANTIATE_TENSOR_IO(double)
ATTNLAB_INSTANTIATE_TENSOR_IO(std::int64_t)
ATTNLAB_INSTANTIATE_TENSOR_IO(std::int32_t)
ATTNLAB_INSTANTIATE_TENSOR_IO(std::uint8_t)
ATTNLAB_INSTANTIATE_TENSOR_IO(bool)
#undef ATTNLAB_INSTANTIATE_TENSOR_IO

const StoredTensor* SafetensorsFile::find(std::string_view name) const {
  for (const auto& t : tensors) {
    if (t.name == name) return &t;
  }
  return nullptr;
}

std::vector<std::byte> serialize_safetensors(const std::vector<StoredTensor>& tensors,
                                             const std::map<std::string, std::string>& metadata,
                                             const std::string& file) {
  // The header text is assembled piece by piece (__metadata__ first, then the tensors in the
  // caller's order): an ordered JSON object would cost a linear key search per insertion.
  std::string text = "{";
  const auto json_string = [&](const std::string& s) {
    try {
      return Json(s).dump();
    } catch (const Json::exception& e) {
      fail(file,
           "cannot write the header (names and metadata must be UTF-8): " + std::string(e.what()));
    }
  };
  if (!metadata.empty()) {
    text += json_string(std::string(kMetadataKey)) + ":{";
    bool first = true;
    for (const auto& [key, value] : metadata) {
      text += (first ? "" : ",") + json_string(key) + ":" + json_string(value);
      first = false;
    }
    text += "}";
  }
  std::set<std::string_view> names;
  std::uint64_t offset = 0;
  for (const auto& t : tensors) {
    if (t.name.empty()) fail(file, "cannot write a tensor with an empty name");
    if (t.name == kMetadataKey) fail(file, "cannot write a tensor named __metadata__");
    if (!names.insert(t.name).second)
      fail(file, "cannot write tensor " + in_quotes(t.name) + " twice");
    const auto need = byte_count(t.shape, dtype_size(t.dtype));
    if (!need || *need != t.data.size()) {
      fail(file, "cannot write tensor " + in_quotes(t.name) + ": " + std::to_string(t.data.size()) +
                     " bytes do not match dtype " + std::string(to_string(t.dtype)) +
                     " and shape " + format_shape(t.shape));
    }
    if (text.size() > 1) text += ",";
    text +=
        json_string(t.name) + ":{\"dtype\":\"" + std::string(to_string(t.dtype)) + "\",\"shape\":[";
    for (std::size_t i = 0; i < t.shape.size(); ++i) {
      if (i) text += ',';
      text += std::to_string(t.shape[i]);
    }
    text += "],\"data_offsets\":[" + std::to_string(offset) + "," + std::to_string(offset + *need) +
            "]}";
    offset += *need;
  }
  text += "}";
  text.append((kLengthBytes - text.size() % kLengthBytes) % kLengthBytes, ' ');

  std::vector<std::byte> out(kLengthBytes + text.size() + offset);
  write_le64(out.data(), text.size());
  std::memcpy(out.data() + kLengthBytes, text.data(), text.size());
  std::byte* data = out.data() + kLengthBytes + text.size();
  for (const auto& t : tensors) {
    if (!t.data.empty()) std::memcpy(data, t.data.data(), t.data.size());
    data += t.data.size();
  }
  return out;
}

SafetensorsFile parse_safetensors(std::span<const std::byte> bytes, const std::string& file) {
  if (bytes.empty()) fail(file, "file is empty, expected a safetensors file");
  if (bytes.size() < kLengthBytes) {
    fail(file, "file is " + std::to_string(bytes.size()) +
                   " bytes, too short for the 8-byte header length (truncated?)");
  }
  const std::uint64_t header_size = read_le64(bytes.data());
  const std::uint64_t after_length = bytes.size() - kLengthBytes;
  if (header_size > kMaxSafetensorsHeaderBytes) {
    fail(file, "header length " + std::to_string(header_size) + " exceeds the limit of " +
                   std::to_string(kMaxSafetensorsHeaderBytes) + " bytes (not a safetensors file?)");
  }
  if (header_size > after_length) {
    fail(file, "header length " + std::to_string(header_size) + " exceeds the " +
                   std::to_string(after_length) +
                   " bytes that follow the length field (truncated?)");
  }
  const char* header_begin = reinterpret_cast<const char*>(bytes.data() + kLengthBytes);
  const Json header = parse_header(header_begin, header_begin + header_size, file);

  const std::uint64_t data_size = after_length - header_size;
  const std::byte* data = bytes.data() + kLengthBytes + header_size;

  SafetensorsFile out;
  std::vector<Entry> entries;
  for (const auto& item : header.items()) {
    if (item.key() == kMetadataKey) {
      out.metadata = parse_metadata(item.value(), file);
    } else {
      entries.push_back(parse_entry(item.key(), item.value(), data_size, file));
    }
  }

  // The tensors must tile the data area exactly: no overlap, no gap, nothing left over.
  std::sort(entries.begin(), entries.end(), [](const Entry& a, const Entry& b) {
    return std::tie(a.begin, a.end, a.name) < std::tie(b.begin, b.end, b.name);
  });
  std::uint64_t covered = 0;
  const Entry* previous = nullptr;
  for (const auto& e : entries) {
    if (e.begin < covered) {
      fail(file, "tensor " + in_quotes(e.name) + " overlaps tensor " + in_quotes(previous->name) +
                     " in the data area (bytes " + std::to_string(e.begin) + " to " +
                     std::to_string(covered) + ")");
    }
    if (e.begin > covered) {
      fail(file, "the data area has " + std::to_string(e.begin - covered) +
                     " unused bytes before tensor " + in_quotes(e.name));
    }
    covered = e.end;
    previous = &e;
  }
  if (covered != data_size) {
    fail(file, "the data area has " + std::to_string(data_size - covered) +
                   " bytes after the last tensor that no tensor uses");
  }

  for (auto& e : entries) {
    StoredTensor t;
    t.name = std::move(e.name);
    t.dtype = e.dtype;
    t.shape = std::move(e.shape);
    t.data.assign(data + e.begin, data + e.end);
    if (t.dtype == Dtype::BOOL) {
      const auto bad =
          std::find_if(t.data.begin(), t.data.end(), [](std::byte b) { return b > std::byte{1}; });
      if (bad != t.data.end()) {
        fail(file, "tensor " + in_quotes(t.name) + ": BOOL element " +
                       std::to_string(bad - t.data.begin()) + " is " +
                       std::to_string(std::to_integer<unsigned>(*bad)) + ", not 0 or 1");
      }
    }
    out.tensors.push_back(std::move(t));
  }
  return out;
}

void save_safetensors(const std::string& path, const std::vector<StoredTensor>& tensors,
                      const std::map<std::string, std::string>& metadata) {
  write_file_atomic(path, serialize_safetensors(tensors, metadata, path));
}

void write_file_atomic(const std::string& path, std::string_view text) {
  write_file_atomic(path, std::as_bytes(std::span(text.data(), text.size())));
}

void write_file_atomic(const std::string& path, std::span<const std::byte> bytes) {
  const std::filesystem::path target(path);
  if (target.filename().empty()) fail(path, "cannot write: the path names a directory");
  const std::filesystem::path dir =
      target.parent_path().empty() ? std::filesystem::path(".") : target.parent_path();
  // A hidden temporary beside the target, so that rename() stays within one filesystem. Those a
  // crashed writer of the same file left behind go first.
  const std::string stale_prefix = "." + target.filename().string() + ".tmp-";
  std::error_code ec;
  for (const auto& entry : std::filesystem::directory_iterator(dir, ec)) {
    const std::string name = entry.path().filename().string();
    if (name.size() == stale_prefix.size() + 6 && name.starts_with(stale_prefix)) {
      std::filesystem::remove(entry.path(), ec);  // best effort: a failure leaves only litter
    }
  }
  std::string temp = (dir / (stale_prefix + "XXXXXX")).string();
  const int fd = ::mkstemp(temp.data());
  if (fd < 0) {
    fail(path,
         "cannot create a temporary file in " + in_quotes(dir.string()) + ": " + errno_text(errno));
  }
  const auto abandon = [&](const std::string& step, int err) {
    ::unlink(temp.c_str());
    fail(path, step + ": " + errno_text(err));
  };
  if (::fchmod(fd, 0644) != 0) {
    const int err = errno;
    ::close(fd);
    abandon("cannot set the permissions of the temporary file", err);
  }
  if (const int err = write_all(fd, bytes.data(), bytes.size()); err != 0) {
    ::close(fd);
    abandon("cannot write the temporary file", err);
  }
  if (::fsync(fd) != 0) {
    const int err = errno;
    ::close(fd);
    abandon("cannot fsync the temporary file", err);
  }
  if (::close(fd) != 0) abandon("cannot close the temporary file", errno);
  if (::rename(temp.c_str(), path.c_str()) != 0) {
    abandon("cannot rename the temporary file over the target", errno);
  }
  // Make the rename itself durable. Some filesystems cannot fsync a directory (EINVAL).
  const int dir_fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dir_fd >= 0) {
    const int rc = ::fsync(dir_fd);
    const int err = errno;
    ::close(dir_fd);
    if (rc != 0 && err != EINVAL) {
      fail(path, "written, but fsync of the directory failed: " + errno_text(err));
    }
  }
}

SafetensorsFile load_safetensors(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) fail(path, "cannot open: " + errno_text(errno));
  struct FdCloser {
    int fd;
    ~FdCloser() { ::close(fd); }
  } closer{fd};
  struct stat st {};
  if (::fstat(fd, &st) != 0) fail(path, "cannot stat: " + errno_text(errno));
  if (S_ISDIR(st.st_mode)) fail(path, "is a directory, expected a safetensors file");
  if (!S_ISREG(st.st_mode)) fail(path, "is not a regular file");

  std::vector<std::byte> bytes(static_cast<std::size_t>(st.st_size));
  std::size_t got = 0;
  while (got < bytes.size()) {
    const ssize_t r = ::read(fd, bytes.data() + got, bytes.size() - got);
    if (r < 0) {
      if (errno == EINTR) continue;
      fail(path, "cannot read: " + errno_text(errno));
    }
    if (r == 0) break;  // the file shrank while we read it: parse what is there
    got += static_cast<std::size_t>(r);
  }
  bytes.resize(got);
  return parse_safetensors(bytes, path);
}

}  // namespace attnlab
