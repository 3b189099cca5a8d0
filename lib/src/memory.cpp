#include "attnlab/memory.hpp"

#include <cstdio>
#include <cstdlib>  // defines __GLIBC__ on glibc

#if defined(__GLIBC__)
#include <malloc.h>
#endif

namespace attnlab {

OutOfMemory::OutOfMemory(std::size_t bytes, const std::string& what_for) : bytes_(bytes) {
  char size[64];
  std::snprintf(size, sizeof size, "%.2f GiB (%zu bytes)",
                static_cast<double>(bytes) / (1024.0 * 1024.0 * 1024.0), bytes);
  message_ = "could not allocate " + what_for + " of " + size;
}

bool keep_freed_memory() {
#if defined(__GLIBC__)
  // M_MMAP_THRESHOLD's largest accepted value on 64-bit glibc (DEFAULT_MMAP_THRESHOLD_MAX); setting
  // it also turns off glibc's dynamic threshold. M_TRIM_THRESHOLD: keep up to INT_MAX free bytes
  // at the heap top.
  constexpr int kMmapThreshold = 32 << 20;
  constexpr int kTrimThreshold = 0x7fffffff;
  // Each on its own: one refused value leaves the other in effect.
  const bool mmap_set = mallopt(M_MMAP_THRESHOLD, kMmapThreshold) == 1;
  const bool trim_set = mallopt(M_TRIM_THRESHOLD, kTrimThreshold) == 1;
  return mmap_set && trim_set;
#else
  return false;
#endif
}

}  // namespace attnlab
