// A counting allocator for the benchmarks: the bench binary is linked with
// -Wl,--wrap=malloc,... so that every heap allocation made by attnlab (xtensor's aligned buffers,
// std::vector scratch through operator new) is counted. OpenBLAS's own buffers (allocated inside
// the shared library, the same for every path) are not.
#pragma once

#include <cstddef>

namespace attnlab::bench {

// Bytes currently allocated (malloc_usable_size of live blocks).
std::ptrdiff_t live_bytes();
// Starts a new peak measurement from the current live bytes; peak_bytes() then returns the highest
// live bytes seen since, minus the live bytes at the reset.
void reset_peak();
std::ptrdiff_t peak_bytes();

}  // namespace attnlab::bench
