// attnlab::keep_freed_memory: after it, the blocks of a "step" (8 blocks of about 3 MiB alive at
// once, then freed, as a step's activations are) are served again from memory the process already
// has, without page faults. With glibc's defaults the freed heap top is trimmed and the next step
// faults its ~6000 pages in again (12k faults over two steps, measured).
#include <doctest/doctest.h>
#include <sys/resource.h>

#include <cstdlib>
#include <cstring>

#include "attnlab/memory.hpp"

namespace {

long minor_faults() {
  rusage usage{};
  getrusage(RUSAGE_SELF, &usage);
  return usage.ru_minflt;
}

// One "step": 8 blocks of about 3 MiB allocated and touched, then all freed.
void step() {
  constexpr int kBlocks = 8;
  constexpr std::size_t kBytes = 3 << 20;
  void* volatile blocks[kBlocks];
  for (int i = 0; i < kBlocks; ++i) {
    blocks[i] = std::malloc(kBytes + static_cast<std::size_t>(i) * 4096);
    std::memset(blocks[i], 1, kBytes);
  }
  for (int i = 0; i < kBlocks; ++i) std::free(blocks[i]);
}

// Minor page faults of two steps, after two warm-up steps.
long faults_of_steps() {
  step();
  step();
  const long before = minor_faults();
  step();
  step();
  return minor_faults() - before;
}

}  // namespace

TEST_CASE("keep_freed_memory: a step's freed blocks come back without page faults") {
#if defined(__GLIBC__) && !defined(__SANITIZE_ADDRESS__) && !defined(__SANITIZE_THREAD__)
  REQUIRE(attnlab::keep_freed_memory());
  CHECK(faults_of_steps() < 64);
#else
  // Sanitizers replace malloc, and other C libraries have no mallopt.
  (void)attnlab::keep_freed_memory();
  (void)faults_of_steps();
#endif
}
