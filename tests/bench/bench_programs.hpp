// Attention-program benchmarks (bench_programs.cpp): block skipping for packed documents and
// causal attention, and programs that re-express a built-in, as ratios from one run.
#pragma once

#include <map>
#include <string>

namespace attnlab::bench {

void register_program_benchmarks();
void print_program_table(const std::map<std::string, std::map<std::string, double>>& seconds);

}  // namespace attnlab::bench
