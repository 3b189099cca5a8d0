// Half precision in safetensors (F16 and BF16): the conversions against every bit pattern and at
// the rounding ties (round to nearest, ties to even, as PyTorch's .half() and .bfloat16()), files
// that round-trip every dtype, and checkpoints whose half-precision weights load into a float model
// (non-finite values rejected after conversion).
#include <doctest/doctest.h>

#include <cmath>
#include <cstdint>
#include <limits>

#include <xtensor/xarray.hpp>
#include <xtensor/xbuilder.hpp>

#include "attnlab/io/checkpoint.hpp"
#include "attnlab/io/safetensors.hpp"
#include "attnlab/random.hpp"
#include "temp_dir.hpp"

using namespace attnlab;

TEST_CASE("half: every F16 and BF16 bit pattern converts to float and back unchanged") {
  for (std::uint32_t b = 0; b <= 0xffff; ++b) {
    const auto h = static_cast<std::uint16_t>(b);
    CAPTURE(b);
    const float f = f16_to_float(h), g = bf16_to_float(h);
    if (std::isnan(f)) {
      CHECK(std::isnan(f16_to_float(float_to_f16(f))));  // NaN stays NaN (made quiet)
    } else {
      CHECK(float_to_f16(f) == h);
    }
    if (std::isnan(g)) {
      CHECK(std::isnan(bf16_to_float(float_to_bf16(g))));
    } else {
      CHECK(float_to_bf16(g) == h);
    }
  }
  // Known values: 1, -2, 65504 (the largest half), 2^-24 (the smallest subnormal), 2^-14.
  CHECK(f16_to_float(0x3c00) == 1.0f);
  CHECK(f16_to_float(0xc000) == -2.0f);
  CHECK(f16_to_float(0x7bff) == 65504.0f);
  CHECK(f16_to_float(0x0001) == std::ldexp(1.0f, -24));
  CHECK(f16_to_float(0x0400) == std::ldexp(1.0f, -14));
  CHECK(bf16_to_float(0x3f80) == 1.0f);
  CHECK(std::isinf(f16_to_float(0x7c00)));
}

TEST_CASE("half: float to F16 and BF16 rounds to nearest, ties to even, and overflows to inf") {
  const auto f16 = [](double x) { return float_to_f16(static_cast<float>(x)); };
  const auto bf16 = [](double x) { return float_to_bf16(static_cast<float>(x)); };
  // F16 has 10 mantissa bits: around 1 the spacing is 2^-10.
  CHECK(f16(1.0 + std::ldexp(1.0, -11)) == 0x3c00);      // tie: to even (1)
  CHECK(f16(1.0 + 3 * std::ldexp(1.0, -11)) == 0x3c02);  // tie: to even (1 + 2^-9)
  CHECK(f16(1.0 + std::ldexp(1.0, -11) + std::ldexp(1.0, -20)) == 0x3c01);  // above the tie
  CHECK(f16(65519.0) == 0x7bff);                                            // below the tie: 65504
  CHECK(f16(65520.0) == 0x7c00);  // the tie 65504 | 65536: inf
  CHECK(f16(-1e6) == 0xfc00);
  CHECK(f16(std::ldexp(1.0, -25)) == 0x0000);      // subnormal tie: to even (0)
  CHECK(f16(3 * std::ldexp(1.0, -25)) == 0x0002);  // subnormal tie: to even (2^-23)
  CHECK(f16(std::ldexp(1.0, -25) * 1.0001) == 0x0001);
  CHECK(f16(-0.0) == 0x8000);
  // BF16 has 7 mantissa bits: around 1 the spacing is 2^-7.
  CHECK(bf16(1.0 + std::ldexp(1.0, -8)) == 0x3f80);      // tie: to even (1)
  CHECK(bf16(1.0 + 3 * std::ldexp(1.0, -8)) == 0x3f82);  // tie: to even
  CHECK(bf16(1.0 + std::ldexp(1.0, -8) + std::ldexp(1.0, -16)) == 0x3f81);
  CHECK(bf16(std::numeric_limits<float>::max()) == 0x7f80);  // rounds up to inf
  CHECK(std::isnan(bf16_to_float(bf16(std::nan("")))));
  CHECK(std::isnan(f16_to_float(f16(std::nan("")))));
}

TEST_CASE("half: a safetensors file round-trips every dtype, F16 and BF16 included") {
  test::TempDir dir;
  const std::string path = dir.file("mixed.safetensors");
  Rng rng(223);
  xt::xarray<float> values = xt::zeros<float>({3, 5});
  for (auto& x : values) x = static_cast<float>(rng.normal() * 100.0);
  const std::vector<StoredTensor> tensors = {
      make_stored_tensor_half("h", values, Dtype::F16),
      make_stored_tensor_half("b", values, Dtype::BF16),
      make_stored_tensor("f", values),
      make_stored_tensor("d", xt::xarray<double>(xt::cast<double>(values))),
      make_stored_tensor("i", xt::xarray<std::int64_t>({1, -2, 3})),
      make_stored_tensor("j", xt::xarray<std::int32_t>({4, 5})),
      make_stored_tensor("u", xt::xarray<std::uint8_t>({6})),
      make_stored_tensor("z", xt::xarray<bool>({true, false}))};
  save_safetensors(path, tensors);
  const SafetensorsFile file = load_safetensors(path);
  REQUIRE(file.tensors.size() == tensors.size());
  for (const auto& t : tensors) {
    CAPTURE(t.name);
    const StoredTensor* back = file.find(t.name);
    REQUIRE(back != nullptr);
    CHECK(back->dtype == t.dtype);
    CHECK(back->shape == t.shape);
    CHECK(back->data == t.data);
  }
  CHECK(dtype_size(Dtype::F16) == 2);
  CHECK(parse_dtype("BF16") == Dtype::BF16);
  // The half tensors read back as the rounded floats, in float and in double.
  const xt::xarray<float> h = tensor_values<float>(*file.find("h"));
  const xt::xarray<double> b = tensor_values<double>(*file.find("b"));
  for (std::size_t i = 0; i < values.size(); ++i) {
    CHECK(h.data()[i] == f16_to_float(float_to_f16(values.data()[i])));
    CHECK(b.data()[i] == double(bf16_to_float(float_to_bf16(values.data()[i]))));
    CHECK(std::abs(h.data()[i] - values.data()[i]) <= std::abs(values.data()[i]) * 0x1p-11f);
  }
  CHECK_THROWS_AS(tensor_values<std::int32_t>(*file.find("h")), CheckpointError);
  CHECK_THROWS_AS(make_stored_tensor_half("x", values, Dtype::F32), std::invalid_argument);
}

TEST_CASE(
    "half: a checkpoint with F16 or BF16 weights loads into a float model, and inf is refused") {
  test::TempDir dir;
  Parameter<float> w;
  w.value = xt::zeros<float>({2, 3});
  w.grad = xt::zeros<float>({2, 3});
  Rng rng(227);
  for (auto& x : w.value) x = static_cast<float>(rng.normal());
  const ParameterList<float> params = {{"w", &w}};
  CheckpointMeta meta;
  meta.model_config = "{}";
  const std::string path = dir.file("ckpt.safetensors");
  save_checkpoint(path, params, {}, meta);
  for (const Dtype dtype : {Dtype::F16, Dtype::BF16}) {
    CAPTURE(to_string(dtype));
    // What a Python exporter writes: the same file with the weights in half precision.
    SafetensorsFile file = load_safetensors(path);
    for (auto& t : file.tensors) {
      if (t.name == "w") t = make_stored_tensor_half("w", tensor_values<float>(t), dtype);
    }
    const std::string half = dir.file("half.safetensors");
    save_safetensors(half, file.tensors, file.metadata);
    Parameter<float> loaded;
    loaded.value = xt::zeros<float>({2, 3});
    loaded.grad = xt::zeros<float>({2, 3});
    load_checkpoint(half, ParameterList<float>{{"w", &loaded}});
    for (std::size_t i = 0; i < w.value.size(); ++i) {
      const float v = w.value.data()[i];
      const float rounded =
          dtype == Dtype::F16 ? f16_to_float(float_to_f16(v)) : bf16_to_float(float_to_bf16(v));
      CHECK(loaded.value.data()[i] == rounded);
    }
    // 1e6 overflows F16 to inf: the loader rejects it after conversion, naming the tensor.
    if (dtype == Dtype::F16) {
      xt::xarray<float> big = w.value;
      big(0, 1) = 1e6f;
      for (auto& t : file.tensors) {
        if (t.name == "w") t = make_stored_tensor_half("w", big, dtype);
      }
      save_safetensors(half, file.tensors, file.metadata);
      CHECK_THROWS_WITH_AS(load_checkpoint(half, ParameterList<float>{{"w", &loaded}}),
                           doctest::Contains("tensor 'w' has the non-finite value inf"),
                           CheckpointError);
    }
  }
}
