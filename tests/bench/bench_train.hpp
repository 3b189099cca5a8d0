// Training-step benchmarks (tokens/s) of whole models (bench_train.cpp).
#pragma once

#include <map>
#include <string>

namespace attnlab::bench {

void register_train_benchmarks(bool quick);
void print_train_table(const std::map<std::string, double>& seconds);

}  // namespace attnlab::bench
