#include "attnlab/memory.hpp"

#include <cstdlib>  // defines __GLIBC__ on glibc

#if defined(__GLIBC__)
#include <malloc.h>
#endif

namespace attnlab {

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
