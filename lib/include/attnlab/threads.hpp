// Thread control. attnlab parallelises over independent slices (batch x heads) with OpenMP and runs
// OpenBLAS single-threaded inside each slice: on small machines this beats BLAS's own threading.
// Results are bit-identical for a fixed thread count (each slice is computed by one thread, and
// cross-slice reductions run in a fixed order).
//
// The thread count is a setting of the CALLING thread, like omp_set_num_threads: the ops read the
// count of the thread that calls them, so two runs on two std::threads (the study's jobs) each use
// their own count and share no mutable variable. A thread that never set one uses the number of
// cores. OpenMP's worker threads inside attnlab's parallel loops run everything serially (nested
// regions are inactive; gemm checks omp_in_parallel), so they never need a count of their own.
// The training application's runs take theirs from their Context (attnlab/app/context.hpp)
// through a ThreadScope.
#pragma once

namespace attnlab {

// Sets the calling thread's worker thread count (>= 1) for every parallel loop it starts, until it
// sets another. Other threads are unaffected. Throws std::invalid_argument for n < 1.
void set_num_threads(int n);

// The calling thread's worker thread count: the last set_num_threads / ThreadScope on this thread,
// else default_num_threads().
int num_threads();

// The number of cores (omp_get_num_procs), the count of a thread that never set one.
int default_num_threads();

// Sets the calling thread's count for the lifetime of the scope and restores the previous setting
// on exit (also when an exception leaves the scope). Throws std::invalid_argument for n < 1.
class ThreadScope {
 public:
  explicit ThreadScope(int n);
  ~ThreadScope();
  ThreadScope(const ThreadScope&) = delete;
  ThreadScope& operator=(const ThreadScope&) = delete;

 private:
  int previous_;  // 0: the thread had no count of its own
};

}  // namespace attnlab
