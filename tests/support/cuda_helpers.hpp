// Skipping GPU tests on machines without a device.
//
// A test that needs a device starts with `if (!test::cuda_device_or_skip()) return;`. Without a
// device it prints kCudaSkipMarker, which tests/CMakeLists.txt registers as the ctest
// SKIP_REGULAR_EXPRESSION: ctest reports the test as skipped, not passed. With
// ATTNLAB_REQUIRE_GPU=1 in the environment, a missing device fails the test instead.
#pragma once

#include <doctest/doctest.h>

#include <cstdlib>
#include <iostream>
#include <string>

#include "attnlab/cuda.hpp"

namespace attnlab::test {

inline constexpr const char* kCudaSkipMarker = "ATTNLAB_TEST_SKIPPED_NO_CUDA_DEVICE";

inline bool gpu_required() {
  const char* value = std::getenv("ATTNLAB_REQUIRE_GPU");
  return value != nullptr && std::string(value) == "1";
}

inline bool cuda_device_or_skip() {
  if (cuda_available()) return true;
  const std::string reason =
      cuda_built() ? "no CUDA device (no driver or no GPU)" : "attnlab was built without CUDA";
  if (gpu_required()) {
    FAIL("ATTNLAB_REQUIRE_GPU=1 but " << reason);
  }
  std::cout << kCudaSkipMarker << ": " << reason << std::endl;
  return false;
}

}  // namespace attnlab::test
