#include "attnlab/threads.hpp"

#include <omp.h>

#include <stdexcept>
#include <string>

extern "C" void openblas_set_num_threads(int num_threads);

namespace attnlab {

namespace {
int& thread_count() {
  static int count = [] {
    openblas_set_num_threads(1);
    return omp_get_num_procs();
  }();
  return count;
}
}  // namespace

void set_num_threads(int n) {
  if (n < 1) {
    throw std::invalid_argument("set_num_threads: n expected >= 1, got " + std::to_string(n));
  }
  thread_count() = n;
  openblas_set_num_threads(1);
}

int num_threads() {
  return thread_count();
}

}  // namespace attnlab
