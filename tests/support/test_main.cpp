// Test runner: tests run with one worker thread, so every result is deterministic. The count is
// the main thread's (threads.hpp); a test that starts std::threads sets theirs. Like any program,
// it chooses the BLAS kernels first (blas::init_process), before a test starts a thread.
#define DOCTEST_CONFIG_IMPLEMENT
#include <doctest/doctest.h>

#include "attnlab/blas.hpp"
#include "attnlab/threads.hpp"

int main(int argc, char** argv) {
  attnlab::blas::init_process(argv);
  attnlab::set_num_threads(1);
  doctest::Context context(argc, argv);
  return context.run();
}
