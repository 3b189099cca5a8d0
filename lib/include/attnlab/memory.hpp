// The process's allocator and attnlab's steps. A training step allocates its activations and
// gradients and frees them at the end; glibc's malloc hands large freed blocks back to the kernel
// (blocks above the mmap threshold are unmapped, and the heap top is trimmed), so the next step
// page-faults the same memory in again: 417k page faults and about 10% of the step time of
// nanoGPT's CPU shape at 1 thread, measured (tests/bench).
#pragma once

namespace attnlab {

// Asks glibc's malloc to keep freed memory for reuse: blocks up to 32 MiB (its largest mmap
// threshold) come from the heap, and the heap is never trimmed, so a process keeps its peak heap
// (what a training process reuses every step anyway). Process-wide, so the library never calls it
// by itself: the CLI and the benchmarks call it first thing, and a program embedding attnlab calls
// it once if it wants the same. Returns false (and does nothing) where the C library is not glibc
// or refuses the settings.
bool keep_freed_memory();

}  // namespace attnlab
