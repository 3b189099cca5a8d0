// Private to lib/src: the operand of LDTILECFG (_tile_loadconfig) for palette 1, which the AMX
// loops of bf16_tiles.cpp (the bf16 product) and fma_peak.cpp (the AMX peak) load: each sets the
// bytes a row (colsb) and the rows of the tiles it uses; the others stay 0 (unused).
#pragma once

#include <cstdint>

namespace attnlab::detail {

struct alignas(64) AmxTileConfig {
  std::uint8_t palette = 1, start_row = 0;
  std::uint8_t reserved[14] = {};
  std::uint16_t colsb[16] = {};
  std::uint8_t rows[16] = {};
};

}  // namespace attnlab::detail
