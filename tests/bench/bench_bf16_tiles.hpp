// The fused attention's products on bf16 tiles (bench_bf16_tiles.cpp) against fp32, from one run.
#pragma once

#include <map>
#include <string>

namespace attnlab::bench {

void register_bf16_tile_benchmarks();
void print_bf16_tile_table(const std::map<std::string, std::map<std::string, double>>& seconds);

}  // namespace attnlab::bench
