#include "attnlab/app/context.hpp"

#include <stdexcept>

#include "attnlab/tensor.hpp"

namespace attnlab::app {

void validate(const Context& context, const char* op) {
  check_arg(context.threads >= 1, op, "threads", ">= 1", std::to_string(context.threads));
}

}  // namespace attnlab::app
