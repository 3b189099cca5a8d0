// The process's allocator and attnlab's steps. A training step allocates its activations and
// gradients and frees them at the end; glibc's malloc hands large freed blocks back to the kernel
// (blocks above the mmap threshold are unmapped, and the heap top is trimmed), so the next step
// page-faults the same memory in again, a measurable share of a small model's step
// (tests/bench/README.md).
#pragma once

#include <cstddef>
#include <new>
#include <string>

namespace attnlab {

// What a failed allocation of one of attnlab's buffers throws: a std::bad_alloc whose what() says
// how many bytes were asked for, and for what ("a CPU buffer of 1.50 GiB (1610612736 bytes)").
class OutOfMemory : public std::bad_alloc {
 public:
  OutOfMemory(std::size_t bytes, const std::string& what_for);
  const char* what() const noexcept override { return message_.c_str(); }
  std::size_t bytes() const { return bytes_; }

 private:
  std::size_t bytes_;
  std::string message_;
};

// Asks glibc's malloc to keep freed memory for reuse: blocks up to 32 MiB (glibc's largest mmap
// threshold on 64-bit) come from the heap instead of mmap, and the main heap's top is not trimmed
// until over 2 GiB of it are free. The costs: the process keeps its peak heap for life (what a
// training process reuses every step anyway, but not what a long-lived service embedding attnlab
// may want); it overrides MALLOC_MMAP_THRESHOLD_ / MALLOC_TRIM_THRESHOLD_ / GLIBC_TUNABLES malloc
// settings; blocks over 32 MiB (e.g. reference-path attention weights at large T) are still mapped
// and unmapped per use, and the heaps of other threads' arenas may still be released. Process-wide,
// so the library never calls it by itself: the CLI calls it first thing (unless the user set one
// of those variables) and the benchmark too (--malloc-default turns it off). Returns true when
// both settings took effect, false (changing nothing it could not) where the C library is not
// glibc or refuses a value (e.g. 32-bit, or glibc.malloc.hugetlb=2).
bool keep_freed_memory();

}  // namespace attnlab
