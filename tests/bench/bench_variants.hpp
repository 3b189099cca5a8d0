// Attention-variant benchmarks (bench_variants.cpp): each variant against plain attention at the
// same FLOPs, as ratios from one run.
#pragma once

#include <map>
#include <string>

namespace attnlab::bench {

void register_variant_benchmarks();
void print_variant_table(const std::map<std::string, std::map<std::string, double>>& seconds);

}  // namespace attnlab::bench
