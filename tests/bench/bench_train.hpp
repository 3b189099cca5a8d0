// Training-step benchmarks (tokens/s) of whole models (bench_train.cpp).
#pragma once

#include <map>
#include <string>

namespace attnlab::bench {

void register_train_benchmarks(bool quick);
// tokens/s, GFLOP/s and MFU (against the sgemm peak measured here at the same thread count) per
// model and thread count; `torch` (optional, from tests/bench/torch_step.py: "model threads
// seconds" lines) adds PyTorch eager's step time on the same model and the ratio.
void print_train_table(const std::map<std::string, std::map<std::string, double>>& seconds,
                       const std::string& torch_file = "");

}  // namespace attnlab::bench
