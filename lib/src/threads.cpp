#include "attnlab/threads.hpp"

#include <omp.h>

#include <stdexcept>
#include <string>

extern "C" void openblas_set_num_threads(int num_threads);

namespace attnlab {

namespace {

// The calling thread's count; 0 until the thread sets one (then default_num_threads applies).
thread_local int t_thread_count = 0;

void check_count(const char* op, int n) {
  if (n < 1)
    throw std::invalid_argument(std::string(op) + ": n expected >= 1, got " + std::to_string(n));
}

}  // namespace

int default_num_threads() {
  // Initialised once, thread-safely (a function-local static), and never written again. Pinning
  // OpenBLAS here, before any attnlab gemm can run (gemm asks num_threads first), keeps its
  // process-wide setting a one-time write instead of a write per set_num_threads.
  static const int cores = [] {
    openblas_set_num_threads(1);
    return omp_get_num_procs();
  }();
  return cores;
}

void set_num_threads(int n) {
  check_count("set_num_threads", n);
  (void)default_num_threads();  // pins OpenBLAS
  t_thread_count = n;
}

int num_threads() {
  const int cores = default_num_threads();  // always: pins OpenBLAS before the first gemm
  return t_thread_count > 0 ? t_thread_count : cores;
}

ThreadScope::ThreadScope(int n) : previous_(t_thread_count) {
  check_count("ThreadScope", n);
  (void)default_num_threads();
  t_thread_count = n;
}

ThreadScope::~ThreadScope() {
  t_thread_count = previous_;
}

}  // namespace attnlab
