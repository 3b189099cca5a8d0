// Attention programs on the CPU paths (attnlab/attention/program.hpp): the score tile of a call
// with a score or mask program, shared by the reference and fused kernels. Private to lib/src.
#pragma once

#include <algorithm>
#include <cstddef>
#include <vector>

#include "attnlab/attention/program.hpp"
#include "attnlab/attention/score_rule.hpp"

namespace attnlab::detail {

// visible (br × bc) for keys [j0, j0 + bc) of queries [i0, i0 + br): the mask program's verdict
// (not evaluated on a full tile) and the built-in rule's (causal, window, key mask).
template <class T>
void program_visible(unsigned char* visible, const AttentionParams<T>& p, std::size_t b,
                     std::size_t h, std::size_t i0, std::size_t br, std::size_t j0, std::size_t bc,
                     attention::BlockState state) {
  if (p.mask_program != nullptr && state == attention::BlockState::partial) {
    p.mask_program->evaluate(visible, attention::ProgramTile{b, h, i0, br, j0, bc});
  } else {
    std::fill_n(visible, br * bc, static_cast<unsigned char>(1));
  }
  for (std::size_t r = 0; r < br; ++r) {
    const std::size_t begin = attention::key_begin(p, i0 + r), end = attention::key_end(p, i0 + r);
    unsigned char* row = visible + r * bc;
    for (std::size_t c = 0; c < bc; ++c) {
      const std::size_t j = j0 + c;
      if (j < begin || j >= end) row[c] = 0;
    }
    if (p.key_mask != nullptr) {
      const unsigned char* mask = p.key_mask + kernel_math::key_mask_offset(b, j0, p.Tk);
      for (std::size_t c = 0; c < bc; ++c) {
        if (mask[c] == 0) row[c] = 0;
      }
    }
  }
}

// Whether the built-in rule hides any key of the tile [i0, i0 + br) × [j0, j0 + bc): a key mask,
// or causal or window bounds that cut into it (the last row starts latest, the first ends first).
template <class T>
bool rule_hides_in_tile(const AttentionParams<T>& p, std::size_t i0, std::size_t br, std::size_t j0,
                        std::size_t bc) {
  if (p.key_mask != nullptr) return true;
  return attention::key_begin(p, i0 + br - 1) > j0 || attention::key_end(p, i0) < j0 + bc;
}

// The scores of a tile on a program's path: tile (br × bc) holds the scaled dots u and receives S
// (-inf where hidden); slope (optional) receives ∂S/∂u (the softcap's slope without a score
// program, whose built-in terms then apply). Returns the tile's visibility, written to `visible`,
// or nullptr when every key of the tile is visible or no score program needs it (the built-in
// terms hide keys in the tile itself: -inf).
template <class T>
const unsigned char* program_scores(T* tile, T* slope, unsigned char* visible,
                                    const AttentionParams<T>& p, std::size_t b, std::size_t h,
                                    std::size_t i0, std::size_t br, std::size_t j0, std::size_t bc,
                                    attention::BlockState state) {
  const bool mask_partial = p.mask_program != nullptr && state == attention::BlockState::partial;
  if (p.score_program != nullptr) {
    const bool hides = mask_partial || rule_hides_in_tile(p, i0, br, j0, bc);
    if (hides) program_visible(visible, p, b, h, i0, br, j0, bc, state);
    p.score_program->apply(tile, slope, hides ? visible : nullptr,
                           attention::ProgramTile{b, h, i0, br, j0, bc}, *p.program_args);
    return hides ? visible : nullptr;
  }
  // The built-in terms and the rule's hiding (score_row_capped), then the mask program's.
  for (std::size_t r = 0; r < br; ++r) {
    T* row = tile + r * bc;
    attention::cap_row(p, bc, row, slope == nullptr ? nullptr : slope + r * bc);
    attention::score_row_capped(p, b, h, i0 + r, j0, bc, row);
  }
  if (mask_partial) p.mask_program->hide(tile, attention::ProgramTile{b, h, i0, br, j0, bc});
  return nullptr;
}

// Pointers to one K/V slice's row of the captured parameters' gradients: grads[k] is parameter
// k's part of row `slice` (AttentionParams::program_grads), or empty without gradients.
template <class T>
std::vector<T*> program_grad_row(const AttentionParams<T>& p, std::size_t slice) {
  std::vector<T*> grads;
  if (p.program_grads == nullptr || p.program_args == nullptr) return grads;
  T* row = p.program_grads + slice * p.program_grad_width;
  for (std::size_t k = 0; k < p.program_args->count; ++k) {
    grads.push_back(row);
    row += p.program_args->sizes[k];
  }
  return grads;
}

// The backward's parameter gradients of one tile: Σ dS · ∂f/∂θ at the tile's scaled dots u (dS is
// 0 at hidden keys, which are skipped).
template <class T>
void program_tile_grads(const AttentionParams<T>& p, const std::vector<T*>& grads, const T* u,
                        const T* dscore, std::size_t b, std::size_t h, std::size_t i0,
                        std::size_t br, std::size_t j0, std::size_t bc) {
  if (grads.empty() || p.score_program == nullptr) return;
  p.score_program->accumulate_param_grads(u, dscore, attention::ProgramTile{b, h, i0, br, j0, bc},
                                          *p.program_args, grads.data());
}

}  // namespace attnlab::detail
