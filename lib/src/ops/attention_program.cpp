// Block masks of attention mask programs (attnlab/attention/program.hpp): a mask evaluated once
// per shape and sequence layout, by the fused path's tiles.
#include "attnlab/attention/program.hpp"

#include <algorithm>
#include <cstddef>
#include <exception>
#include <stdexcept>
#include <string>
#include <vector>

#include "attnlab/threads.hpp"
#include "kernels/attention.hpp"

namespace attnlab::attention {

namespace {
std::string sizes_text(const AttentionSizes& s) {
  return "B = " + std::to_string(s.B) + ", H = " + std::to_string(s.H) +
         ", Tq = " + std::to_string(s.Tq) + ", Tk = " + std::to_string(s.Tk);
}

// Row block rb of (b, h): the mask over its rows and every key into `visible` (tile_rows × Tk),
// then the keys [lo, hi) some row sees and the state of each key tile from lo.
void build_row_block(const BlockMask& m, std::size_t b, std::size_t h, std::size_t rb,
                     std::vector<unsigned char>& visible, BlockMask::RowBlock& block,
                     std::vector<BlockState>& states, double& computed) {
  const std::size_t Tk = m.sizes().Tk, tile_rows = m.tile_rows(), tile_keys = m.tile_keys();
  const std::size_t i0 = rb * tile_rows;
  const std::size_t br = std::min(tile_rows, m.sizes().Tq - i0);
  m.program().evaluate(visible.data(), ProgramTile{b, h, i0, br, 0, Tk});
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
  if (lo >= hi) return;  // no key: an empty range, no tiles
  block.lo = lo, block.hi = hi;
  for (std::size_t j0 = lo; j0 < hi; j0 += tile_keys) {
    const std::size_t bc = std::min(tile_keys, hi - j0);
    std::size_t shown = 0;
    for (std::size_t r = 0; r < br; ++r) {
      const unsigned char* row = visible.data() + r * Tk + j0;
      for (std::size_t c = 0; c < bc; ++c) shown += row[c] != 0 ? 1 : 0;
    }
    const BlockState state = shown == 0         ? BlockState::empty
                             : shown == br * bc ? BlockState::full
                                                : BlockState::partial;
    if (state != BlockState::empty) computed += static_cast<double>(br * bc);
    states.push_back(state);
  }
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
  // One part per (b, h, row block), built in parallel (the mask is evaluated from several
  // threads, as in the fused path), then joined in order: the same mask at any thread count.
  struct Part {
    BlockMask::RowBlock block;
    std::vector<BlockState> states;
    double computed = 0;
  };
  const std::size_t parts = batches * m.heads_ * m.row_blocks_;
  std::vector<Part> part(parts);
  std::exception_ptr failure;
#pragma omp parallel num_threads(num_threads())
  {
    std::vector<unsigned char> visible(m.tile_rows_ * Tk);
#pragma omp for schedule(dynamic)
    for (std::ptrdiff_t p = 0; p < static_cast<std::ptrdiff_t>(parts); ++p) {
      try {
        const auto at = static_cast<std::size_t>(p);
        const std::size_t rb = at % m.row_blocks_, h = at / m.row_blocks_ % m.heads_;
        const std::size_t b = at / m.row_blocks_ / m.heads_;
        build_row_block(m, b, h, rb, visible, part[at].block, part[at].states, part[at].computed);
      } catch (...) {
#pragma omp critical(attnlab_block_mask)
        if (!failure) failure = std::current_exception();
      }
    }
  }
  if (failure) std::rethrow_exception(failure);
  double computed = 0;
  for (Part& q : part) {
    q.block.first_tile = m.states_.size();
    m.states_.insert(m.states_.end(), q.states.begin(), q.states.end());
    m.rows_.push_back(q.block);
    computed += q.computed;
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
