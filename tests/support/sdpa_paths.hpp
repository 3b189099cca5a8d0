// The two CPU attention paths as doctest template parameters: every attention test runs on both
// (TEST_CASE_TEMPLATE(name, TestType, ReferencePath, FusedPath), then TestType::value).
#pragma once

#include <doctest/doctest.h>

#include "attnlab/ops/attention.hpp"

namespace attnlab::test {

struct ReferencePath {
  static constexpr SdpaPath value = SdpaPath::reference;
};
struct FusedPath {
  static constexpr SdpaPath value = SdpaPath::fused;
};

// Tiles of the fused path in the shared tests: tiny, so that even the small inputs of the
// gradchecks and goldens cross row and key tile edges and run the online softmax across tiles.
inline constexpr std::size_t kTestTileRows = 2;
inline constexpr std::size_t kTestTileKeys = 3;

// Options with the path set (and, for the fused path, the tiny test tiles).
inline SdpaOptions with_path(SdpaOptions options, SdpaPath path) {
  options.path = path;
  if (path == SdpaPath::fused) {
    options.tile_rows = kTestTileRows;
    options.tile_keys = kTestTileKeys;
  }
  return options;
}

// The attention weights of the forward that filled `cache`: the reference path's cache.p, or,
// after a fused forward (which keeps no weights), P recomputed by sdpa_weights.
template <class T>
Tensor4<T> weights_of(const SdpaCache<T>& cache, const Tensor4<T>& q, const Tensor4<T>& k,
                      const SdpaOptions& options, const KeyMask* key_mask = nullptr) {
  if (cache.has_weights()) return cache.p;
  return sdpa_weights(q, k, options, key_mask);
}

}  // namespace attnlab::test

TYPE_TO_STRING(attnlab::test::ReferencePath);
TYPE_TO_STRING(attnlab::test::FusedPath);
