// libFuzzer target: load_checkpoint of arbitrary bytes into a small float model with parameters
// "layer.w" (3, 4) and "layer.b" (4,). It must either load finite values of the right shapes or
// throw CheckpointError leaving the model exactly as it was.
#include <sys/mman.h>
#include <unistd.h>

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <string>

#include <xtensor/xbuilder.hpp>

#include "attnlab/io/checkpoint.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  using namespace attnlab;
  // The input as a file without touching the disk.
  static const int fd = ::memfd_create("fuzz-checkpoint", 0);
  if (fd < 0) __builtin_trap();
  if (::ftruncate(fd, 0) != 0 || ::pwrite(fd, data, size, 0) != static_cast<ssize_t>(size)) {
    __builtin_trap();
  }
  const std::string path = "/proc/self/fd/" + std::to_string(fd);

  const xt::xarray<float> w0 = xt::ones<float>({3, 4}) * 0.5f;
  const xt::xarray<float> b0 = xt::ones<float>({4}) * -0.25f;
  Parameter<float> w{w0, xt::zeros<float>({3, 4})};
  Parameter<float> b{b0, xt::zeros<float>({4})};
  const ParameterList<float> params = {{"layer.w", &w}, {"layer.b", &b}};
  for (const bool allow_extra : {false, true}) {
    TensorList<float> optim;
    try {
      load_checkpoint<float>(path, params, &optim,
                             CheckpointLoadOptions{.allow_extra_tensors = allow_extra});
    } catch (const CheckpointError&) {
      if (!(w.value == w0) || !(b.value == b0) || !optim.empty()) __builtin_trap();  // half-loaded
      continue;
    }
    if (w.value.shape() != w0.shape() || b.value.shape() != b0.shape()) __builtin_trap();
    for (const float x : w.value) {
      if (!std::isfinite(x)) __builtin_trap();
    }
    for (const auto& [name, values] : optim) {
      for (const float x : values) {
        if (!std::isfinite(x)) __builtin_trap();
      }
    }
    w.value = w0;
    b.value = b0;
  }
  return 0;
}
