#include "attnlab/context.hpp"

#include <stdexcept>

#include "attnlab/tensor.hpp"

namespace attnlab {

std::string backend_name(Backend backend) {
  return backend == Backend::cuda ? "cuda" : "cpu";
}

Backend parse_backend(const std::string& name, const char* op, const char* arg) {
  if (name == "cpu") return Backend::cpu;
  if (name == "cuda") return Backend::cuda;
  throw std::invalid_argument(std::string(op) + ": " + arg + " expected 'cpu' or 'cuda', got '" +
                              name + "'");
}

void validate(const Context& context, const char* op) {
  check_arg(context.threads >= 1, op, "threads", ">= 1", std::to_string(context.threads));
}

}  // namespace attnlab
