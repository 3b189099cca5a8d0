// Block masks of attention mask programs (attnlab/attention/program.hpp): a mask evaluated once
// per shape and sequence layout, by the fused path's tiles.
#include "attnlab/attention/program.hpp"

#include <stdexcept>
#include <string>

#include "kernels/attention.hpp"

namespace attnlab::attention {

namespace {
std::string sizes_text(const AttentionSizes& s) {
  return "B = " + std::to_string(s.B) + ", H = " + std::to_string(s.H) +
         ", Tq = " + std::to_string(s.Tq) + ", Tk = " + std::to_string(s.Tk);
}
}  // namespace

BlockMask build_block_mask(std::shared_ptr<const MaskProgram> mask, const AttentionSizes& sizes,
                           std::size_t tile_rows, std::size_t tile_keys) {
  if (!mask)
    throw std::invalid_argument("build_block_mask: mask expected a mask program, got none");
  if (sizes.B == 0 || sizes.H == 0 || sizes.Tq == 0 || sizes.Tk == 0) {
    throw std::invalid_argument("build_block_mask: sizes expected B, H, Tq and Tk > 0, got " +
                                sizes_text(sizes));
  }
  BlockMask m;
  m.program_ = std::move(mask);
  m.sizes_ = sizes;
  m.tile_rows_ = tile_rows != 0 ? tile_rows : detail::kFusedRowBlock;
  m.tile_keys_ = tile_keys != 0 ? tile_keys : detail::kFusedKeyBlock;
  const std::size_t batches = m.program_->depends_on_batch() ? sizes.B : 1;
  m.heads_ = m.program_->depends_on_head() ? sizes.H : 1;
  m.row_blocks_ = (sizes.Tq + m.tile_rows_ - 1) / m.tile_rows_;
  const std::size_t Tk = sizes.Tk;
  std::vector<unsigned char> visible(m.tile_rows_ * Tk);
  double computed = 0;
  for (std::size_t b = 0; b < batches; ++b) {
    for (std::size_t h = 0; h < m.heads_; ++h) {
      for (std::size_t rb = 0; rb < m.row_blocks_; ++rb) {
        const std::size_t i0 = rb * m.tile_rows_;
        const std::size_t br = std::min(m.tile_rows_, sizes.Tq - i0);
        m.program_->evaluate(visible.data(), ProgramTile{b, h, i0, br, 0, Tk});
        // [lo, hi): the keys some row of the block sees
        std::size_t lo = Tk, hi = 0;
        for (std::size_t r = 0; r < br; ++r) {
          const unsigned char* row = visible.data() + r * Tk;
          for (std::size_t j = 0; j < lo; ++j) {
            if (row[j] != 0) {
              lo = j;
              break;
            }
          }
          for (std::size_t j = Tk; j > hi; --j) {
            if (row[j - 1] != 0) {
              hi = j;
              break;
            }
          }
        }
        BlockMask::RowBlock block;
        block.first_tile = m.states_.size();
        if (lo < hi) {
          block.lo = lo, block.hi = hi;
          for (std::size_t j0 = lo; j0 < hi; j0 += m.tile_keys_) {
            const std::size_t bc = std::min(m.tile_keys_, hi - j0);
            std::size_t shown = 0;
            for (std::size_t r = 0; r < br; ++r) {
              const unsigned char* row = visible.data() + r * Tk + j0;
              for (std::size_t c = 0; c < bc; ++c) shown += row[c] != 0 ? 1 : 0;
            }
            const BlockState state = shown == 0         ? BlockState::empty
                                     : shown == br * bc ? BlockState::full
                                                        : BlockState::partial;
            if (state != BlockState::empty) computed += static_cast<double>(br * bc);
            m.states_.push_back(state);
          }
        }
        m.rows_.push_back(block);
      }
    }
  }
  m.computed_ = computed;
  return m;
}

double BlockMask::density() const {
  const std::size_t batches = program_->depends_on_batch() ? sizes_.B : 1;
  const double all = static_cast<double>(batches * heads_) * static_cast<double>(sizes_.Tq) *
                     static_cast<double>(sizes_.Tk);
  return computed_ / all;
}

void BlockMask::check_matches(const AttentionSizes& sizes, const char* op) const {
  const bool batch = program_->depends_on_batch(), head = program_->depends_on_head();
  if (sizes.Tq == sizes_.Tq && sizes.Tk == sizes_.Tk && (!batch || sizes.B == sizes_.B) &&
      (!head || sizes.H == sizes_.H)) {
    return;
  }
  throw std::invalid_argument(std::string(op) + ": block_mask expected one built for the call's " +
                              sizes_text(sizes) + " (the mask '" + program_->name() + "' reads " +
                              (batch ? "b" : "not b") + " and " + (head ? "h" : "not h") +
                              "), got one built for " + sizes_text(sizes_));
}

}  // namespace attnlab::attention
