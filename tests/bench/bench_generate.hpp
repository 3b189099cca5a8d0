// Generation benchmarks (bench_generate.cpp): tokens/s of KV-cached against uncached decoding.
#pragma once

#include <map>
#include <string>

namespace attnlab::bench {

void register_generate_benchmarks();
void print_generate_table(const std::map<std::string, std::map<std::string, double>>& seconds);

}  // namespace attnlab::bench
