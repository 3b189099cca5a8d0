#include "attnlab/memory.hpp"

#include <cstdlib>  // defines __GLIBC__ on glibc

#if defined(__GLIBC__)
#include <malloc.h>
#endif

namespace attnlab {

bool keep_freed_memory() {
#if defined(__GLIBC__)
  // M_MMAP_THRESHOLD's largest accepted value on 64-bit glibc (DEFAULT_MMAP_THRESHOLD_MAX); setting
  // it also turns off glibc's dynamic threshold. M_TRIM_THRESHOLD: never give the heap top back.
  constexpr int kMmapThreshold = 32 << 20;
  constexpr int kNeverTrim = 0x7fffffff;
  return mallopt(M_MMAP_THRESHOLD, kMmapThreshold) == 1 &&
         mallopt(M_TRIM_THRESHOLD, kNeverTrim) == 1;
#else
  return false;
#endif
}

}  // namespace attnlab
