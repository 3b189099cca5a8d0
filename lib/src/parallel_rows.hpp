// Internal: deterministic row parallelism for the row-wise ops (norms, activations, cross-entropy,
// embedding, head split/merge). [0, rows) is cut into contiguous chunks, one per thread; the cut
// depends only on (rows, work, num_threads() of the calling thread), never on scheduling, so
// results are bit-identical for a fixed thread count. Row-local results do not depend on the cut at
// all; sums over rows (dgamma, dbeta) keep one partial per chunk and add the partials in chunk
// order.
#pragma once

#include <algorithm>
#include <cstddef>

#include "attnlab/threads.hpp"

namespace attnlab::detail {

// Below this many elements per chunk a thread costs more than it saves.
constexpr std::size_t kMinElementsPerChunk = 16384;

// The number of chunks for `rows` rows of `row_elements` elements each: 1 for small tensors.
inline std::size_t row_chunks(std::size_t rows, std::size_t row_elements) {
  const auto threads = static_cast<std::size_t>(num_threads());
  const std::size_t by_work = rows * std::max<std::size_t>(row_elements, 1) / kMinElementsPerChunk;
  return std::max<std::size_t>(1, std::min({threads, rows, by_work}));
}

// The first row of chunk c of `chunks` (chunk c is [chunk_begin(c), chunk_begin(c + 1))).
inline std::size_t chunk_begin(std::size_t rows, std::size_t chunks, std::size_t c) {
  return rows * c / chunks;
}

// Calls f(r0, r1, c) for each chunk c of [0, rows), in parallel when chunks > 1.
template <class F>
void for_chunks(std::size_t rows, std::size_t chunks, F&& f) {
  if (chunks <= 1) {
    f(std::size_t(0), rows, std::size_t(0));
    return;
  }
#pragma omp parallel for num_threads(int(chunks)) schedule(static)
  for (std::size_t c = 0; c < chunks; ++c) {
    f(chunk_begin(rows, chunks, c), chunk_begin(rows, chunks, c + 1), c);
  }
}

// for_chunks with the chunk count chosen by row_chunks.
template <class F>
void for_row_chunks(std::size_t rows, std::size_t row_elements, F&& f) {
  for_chunks(rows, row_chunks(rows, row_elements), f);
}

// dst[i] = src[i] for i < n, in parallel for large n (a copy: same result for any cut).
template <class T>
void copy_elements(T* dst, const T* src, std::size_t n) {
  for_row_chunks(n, 1, [&](std::size_t i0, std::size_t i1, std::size_t) {
    std::copy(src + i0, src + i1, dst + i0);
  });
}

// dst[i] = a[i] + b[i] for i < n (dst may be a or b).
template <class T>
void add_elements_serial(T* dst, const T* a, const T* b, std::size_t n) {
  for (std::size_t i = 0; i < n; ++i) dst[i] = a[i] + b[i];
}

// add_elements_serial in parallel for large n.
template <class T>
void add_elements(T* dst, const T* a, const T* b, std::size_t n) {
  for_row_chunks(n, 1, [&](std::size_t i0, std::size_t i1, std::size_t) {
    add_elements_serial(dst + i0, a + i0, b + i0, i1 - i0);
  });
}

// cache = x, reusing cache's buffer when the shape is unchanged (no fresh pages every step).
template <class C>
void assign_copy(C& cache, const C& x) {
  if (&cache == &x) return;
  cache.resize(x.shape());
  copy_elements(cache.data(), x.data(), x.size());
}

}  // namespace attnlab::detail
