// Reading and writing the safetensors format, trusting nothing on the way in.
// Reference: https://github.com/huggingface/safetensors (README, "Format").
//
//   bytes 0..8     N, the header length: an unsigned 64-bit little-endian integer
//   bytes 8..8+N   a JSON object: tensor name -> {"dtype", "shape", "data_offsets": [begin, end]},
//                  plus an optional "__metadata__" object of string -> string
//   bytes 8+N..    the data area: raw little-endian tensor bytes; offsets are relative to its start
//
// Loading checks the header length against the file size (and a hard cap), that the JSON parses
// and has exactly the keys above, every dtype, shape and offset (within the data area, no overlap,
// no gap, length = product(shape) × dtype size, no overflow). Every failure throws CheckpointError
// naming the file and the problem. Saving is atomic: a crash leaves the old file or the new one.
#pragma once

// First, before any xtensor header.
#include "attnlab/xtensor_config.hpp"

#include <cstddef>
#include <cstdint>
#include <map>
#include <optional>
#include <span>
#include <stdexcept>
#include <string>
#include <string_view>
#include <type_traits>
#include <vector>

#include <xtensor/xarray.hpp>

#include "attnlab/enum_table.hpp"

namespace attnlab {

// A checkpoint or safetensors file that cannot be read or written. what() is
// "<file>: <problem>", e.g. "run/ckpt.safetensors: tensor 'w': data_offsets [0, 40] hold 40 bytes,
// but dtype F32 and shape (3, 4) need 48".
class CheckpointError : public std::runtime_error {
 public:
  CheckpointError(std::string file, const std::string& problem);
  const std::string& file() const { return file_; }

 private:
  std::string file_;
};

// The element types attnlab reads and writes (BOOL is one byte, 0 or 1).
enum class Dtype { F32, F64, I64, I32, U8, BOOL, F16, BF16 };

template <>
struct EnumTable<Dtype> {
  static constexpr EnumEntry<Dtype> entries[] = {
      {Dtype::F32, "F32", ""}, {Dtype::F64, "F64", ""},   {Dtype::I64, "I64", ""},
      {Dtype::I32, "I32", ""}, {Dtype::U8, "U8", ""},     {Dtype::BOOL, "BOOL", ""},
      {Dtype::F16, "F16", ""}, {Dtype::BF16, "BF16", ""},
  };
  static constexpr EnumParseText parse = {"parse_dtype", "dtype"};
};

// The names of EnumTable<Dtype> (safetensors' own); parse: nullopt for an unknown name.
inline std::string_view to_string(Dtype dtype) {
  return enum_name(dtype);
}
inline std::optional<Dtype> parse_dtype(std::string_view s) {
  return find_enum<Dtype>(s);
}
std::size_t dtype_size(Dtype dtype);  // bytes per element

// The Dtype of a C++ element type: float, double, std::int64_t, std::int32_t, std::uint8_t, bool.
template <class T>
constexpr Dtype dtype_of() {
  if constexpr (std::is_same_v<T, float>) {
    return Dtype::F32;
  } else if constexpr (std::is_same_v<T, double>) {
    return Dtype::F64;
  } else if constexpr (std::is_same_v<T, std::int64_t>) {
    return Dtype::I64;
  } else if constexpr (std::is_same_v<T, std::int32_t>) {
    return Dtype::I32;
  } else if constexpr (std::is_same_v<T, std::uint8_t>) {
    return Dtype::U8;
  } else {
    static_assert(std::is_same_v<T, bool>, "no safetensors dtype for this element type");
    return Dtype::BOOL;
  }
}

struct StoredTensor {
  std::string name;
  Dtype dtype = Dtype::F32;
  std::vector<std::size_t> shape;  // () is a scalar with one element
  std::vector<std::byte> data;     // row-major, little-endian; size = product(shape) × dtype_size
};

// Copies an array into a StoredTensor of dtype_of<T>().
template <class T>
StoredTensor make_stored_tensor(std::string name, const xt::xarray<T>& values);

// Half precision: IEEE binary16 (F16) and bfloat16 (BF16) bits from a float, rounded to nearest,
// ties to even (as PyTorch's .half() and .bfloat16()); overflow gives ±inf, a NaN stays a (quiet)
// NaN. The conversions back to float are exact.
std::uint16_t float_to_f16(float value);
float f16_to_float(std::uint16_t bits);
std::uint16_t float_to_bf16(float value);
float bf16_to_float(std::uint16_t bits);

// Copies an array into a StoredTensor of dtype F16 or BF16, each value rounded as above. Throws
// std::invalid_argument for another dtype.
StoredTensor make_stored_tensor_half(std::string name, const xt::xarray<float>& values,
                                     Dtype dtype);

// The values of a tensor as an array of T. Throws CheckpointError (file = `file`) if the dtype is
// not dtype_of<T>(); for T = float or double an F16 or BF16 tensor is accepted too and converted
// (exactly), so that half-precision weights exported from Python load.
template <class T>
xt::xarray<T> tensor_values(const StoredTensor& tensor, const std::string& file = "<memory>");

// Whether tensor_values<T> reads a tensor of dtype d.
template <class T>
bool readable_as(Dtype d) {
  if (d == dtype_of<T>()) return true;
  return (std::is_same_v<T, float> || std::is_same_v<T, double>)&&(d == Dtype::F16 ||
                                                                   d == Dtype::BF16);
}

struct SafetensorsFile {
  std::vector<StoredTensor> tensors;  // in data-offset order
  std::map<std::string, std::string> metadata;

  // nullptr when absent.
  const StoredTensor* find(std::string_view name) const;
};

// The largest header accepted on load (a real checkpoint's header is a few kilobytes).
inline constexpr std::uint64_t kMaxSafetensorsHeaderBytes = 100ull << 20;  // 100 MiB

// The bytes of a safetensors file: header padded with spaces to a multiple of 8, then the data of
// each tensor in the given order. Throws CheckpointError (file = `file`) for an invalid tensor
// list: an empty, duplicate or reserved name, or data whose size does not match dtype and shape.
std::vector<std::byte> serialize_safetensors(const std::vector<StoredTensor>& tensors,
                                             const std::map<std::string, std::string>& metadata,
                                             const std::string& file = "<memory>");

// Parses and validates the bytes of a safetensors file; `file` names the source in errors.
SafetensorsFile parse_safetensors(std::span<const std::byte> bytes, const std::string& file);

// Writes atomically: a temporary file in the target's directory is written, flushed and fsync'd,
// renamed over `path`, and the directory is fsync'd. On failure the temporary file is removed, the
// previous file at `path` is untouched, and CheckpointError is thrown.
void save_safetensors(const std::string& path, const std::vector<StoredTensor>& tensors,
                      const std::map<std::string, std::string>& metadata = {});

// The atomic write behind save_safetensors, for any file (same steps and guarantees; throws
// CheckpointError naming the file): every file attnlab writes goes through it. The temporary is
// ".<name>.tmp-XXXXXX" beside the target; those a crashed writer of the same name left behind are
// removed first.
void write_file_atomic(const std::string& path, std::span<const std::byte> bytes);
void write_file_atomic(const std::string& path, std::string_view text);

// Reads and validates a whole file (it must be a regular file). Throws CheckpointError.
SafetensorsFile load_safetensors(const std::string& path);

}  // namespace attnlab
