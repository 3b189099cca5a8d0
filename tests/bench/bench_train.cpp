#include "bench_train.hpp"

#include <cstdio>

namespace attnlab::bench {

void register_train_benchmarks(bool) {}

void print_train_table(const std::map<std::string, double>&) {
  std::printf("\nTraining step: not built yet (needs the Transformer of branch stack)\n");
}

}  // namespace attnlab::bench
