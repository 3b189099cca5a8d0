// Gradient checks of one layer from the command line (`attnlab gradcheck`): builds the layer in
// double precision from a ModelSpec, and runs the library's central-difference checker on the
// input and every parameter of L = Σ r ⊙ layer(x) (cross-entropy for the whole Transformer).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "attnlab/gradcheck.hpp"
#include "attnlab/train/trainer.hpp"

namespace attnlab::train {

// The relative-error tolerance of `attnlab gradcheck` (that of the stack's test suite).
inline constexpr double kLayerGradTolerance = 1e-6;

const std::vector<std::string>& checkable_layers();

// layer: one of checkable_layers(). batch B and seq T size the input. Throws std::invalid_argument
// for an unknown layer or a bad spec.
GradcheckReport check_layer(const std::string& layer, const ModelSpec& spec, int batch, int seq,
                            std::uint64_t seed);

}  // namespace attnlab::train
