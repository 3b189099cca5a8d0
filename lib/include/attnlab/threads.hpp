// Thread control. attnlab parallelises over independent slices (batch x heads) with OpenMP and runs
// OpenBLAS single-threaded inside each slice: on small machines this beats BLAS's own threading.
// Results are bit-identical for a fixed thread count (each slice is computed by one thread, and
// cross-slice reductions run in a fixed order).
#pragma once

namespace attnlab {

// Sets the number of worker threads (>= 1) used by every parallel loop; pins OpenBLAS to 1 thread.
// Throws std::invalid_argument for n < 1.
void set_num_threads(int n);

// The current worker thread count (defaults to the number of cores).
int num_threads();

}  // namespace attnlab
