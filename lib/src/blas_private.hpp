// Private to lib/src: what the gemm dispatch (blas.cpp) and the choice of OpenBLAS's core
// (blas_core.cpp) share.
#pragma once

#include <string>

#include "attnlab/blas.hpp"

namespace attnlab {
namespace blas {
namespace detail {

// Fills info's library, cpu, core, openblas_core, switched, reason and warning for the core
// OpenBLAS runs now; changes nothing. Returns the core init_process would restart the program on,
// or "" when OpenBLAS's core stands (or a restart already happened).
std::string describe_core(BlasInfo& info);

// OpenBLAS's sgemm and dgemm against a plain loop, exactly (blas.cpp).
bool openblas_self_check();

}  // namespace detail
}  // namespace blas
}  // namespace attnlab
