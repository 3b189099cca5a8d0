// Ready-made attention programs (attnlab/attention/program.hpp): the built-in variants of the
// score rule written as programs, and the masks FlexAttention's documentation shows first. Each is
// a plain struct (its callable) and a factory that wraps it. The built-in forms give the built-in
// path's numbers bit for bit (tests/ops/test_attention_programs.cpp checks it): Softcap gives its
// own slope in the built-in's formula, and the others compute the same expression in the same
// order.
#pragma once

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "attnlab/attention/program.hpp"
#include "attnlab/kernel_math.hpp"

namespace attnlab::attention {

namespace programs {

// S = c · tanh(u / c): SdpaConfig::softcap = c.
struct Softcap {
  double cap = 0;
  template <class S>
  ATTNLAB_HOST_DEVICE S operator()(S u, std::size_t, std::size_t, std::size_t, std::size_t) const {
    using std::tanh;
    using Plain = decltype(value_of(u));
    const Plain c = static_cast<Plain>(cap);
    return c * tanh(u / c);
  }
  // S and the built-in's slope 1 − (S / c)², with the built-in's own functions: one tanh for both.
  template <class T>
  T value_and_slope(T u, std::size_t, std::size_t, std::size_t, std::size_t,
                    const ProgramParams<T>&, T& slope) const {
    const T c = static_cast<T>(cap);
    const T y = kernel_math::softcap_element(u, c);
    slope = kernel_math::softcap_slope(y, c);
    return y;
  }
};

// S = u + m_h · (j − (i + o)): ALiBi with parameter 0 holding the H slopes (learnable: their
// gradients come back in SdpaGrads::dprogram). o is the query offset.
struct Alibi {
  std::size_t query_offset = 0;
  ATTNLAB_NO_EXEC_CHECK
  template <class S, class P>
  ATTNLAB_HOST_DEVICE S operator()(S u, std::size_t, std::size_t h, std::size_t i, std::size_t j,
                                   const P& params) const {
    using Plain = decltype(value_of(u));
    return u + params(0, h) * (static_cast<Plain>(j) - static_cast<Plain>(i + query_offset));
  }
};

// S = u + bias(b, h, i, j) with parameter 0 the bias (1|B, 1|H, Tq, Tk) row-major: an axis of
// extent 1 broadcasts. Its gradient is dS summed over the broadcast axes.
struct Bias {
  std::size_t heads = 1, Tq = 0, Tk = 0;
  bool per_batch = false, per_head = true;
  ATTNLAB_NO_EXEC_CHECK
  template <class S, class P>
  ATTNLAB_HOST_DEVICE S operator()(S u, std::size_t b, std::size_t h, std::size_t i, std::size_t j,
                                   const P& params) const {
    const std::size_t slice = (per_batch ? b * (per_head ? heads : 1) : 0) + (per_head ? h : 0);
    return u + params(0, (slice * Tq + i) * Tk + j);
  }
};

// S = u + table_h[clamp(j − i, −R, R) + R]: a learned relative-position bias (T5's without
// buckets), parameter 0 holding H rows of 2R + 1 entries.
struct RelativeBias {
  std::size_t max_distance = 0;
  ATTNLAB_NO_EXEC_CHECK
  template <class S, class P>
  ATTNLAB_HOST_DEVICE S operator()(S u, std::size_t, std::size_t h, std::size_t i, std::size_t j,
                                   const P& params) const {
    const auto r = static_cast<std::ptrdiff_t>(max_distance);
    std::ptrdiff_t rel = static_cast<std::ptrdiff_t>(j) - static_cast<std::ptrdiff_t>(i);
    rel = rel < -r ? -r : (rel > r ? r : rel);
    return u + params(0, h * (2 * max_distance + 1) + static_cast<std::size_t>(rel + r));
  }
};

}  // namespace programs

namespace masks {

// j ≤ i + o: SdpaConfig::causal with query_offset o.
struct Causal {
  std::size_t query_offset = 0;
  ATTNLAB_HOST_DEVICE bool operator()(std::size_t, std::size_t, std::size_t i,
                                      std::size_t j) const {
    return j <= i + query_offset;
  }
};

// i + o − w < j ≤ i + o: SdpaConfig::window w (with causal and query_offset o).
struct SlidingWindow {
  std::size_t window = 0, query_offset = 0;
  ATTNLAB_HOST_DEVICE bool operator()(std::size_t, std::size_t, std::size_t i,
                                      std::size_t j) const {
    return j <= i + query_offset && j + window > i + query_offset;
  }
};

// The key mask (B, Tk) of the built-in rule as a program: key j of batch row b is visible where
// the mask is nonzero.
struct KeyPadding {
  std::shared_ptr<const std::vector<unsigned char>> mask;
  std::size_t Tk = 0;
  bool operator()(std::size_t b, std::size_t, std::size_t, std::size_t j) const {
    return (*mask)[b * Tk + j] != 0;
  }
};

// Prefix-LM: every query sees the first `prefix` keys (bidirectional), and later keys causally.
struct PrefixLM {
  std::size_t prefix = 0;
  ATTNLAB_HOST_DEVICE bool operator()(std::size_t, std::size_t, std::size_t i,
                                      std::size_t j) const {
    return j < prefix || j <= i;
  }
};

// Packed documents over raw ids: query i sees key j of the same document (ids per position; per
// batch row when per_batch: (B, T) row-major), causally within it when causal. Plain values and a
// pointer, so a device program can carry it (its ids in device memory there).
struct DocumentIds {
  const std::int32_t* ids = nullptr;
  std::size_t T = 0;
  bool per_batch = false, causal = true;
  ATTNLAB_HOST_DEVICE bool operator()(std::size_t b, std::size_t, std::size_t i,
                                      std::size_t j) const {
    const std::int32_t* row = ids + (per_batch ? b * T : 0);
    return row[i] == row[j] && (!causal || j <= i);
  }
};

// DocumentIds over ids it keeps alive (the CPU paths' form).
struct Document {
  std::shared_ptr<const std::vector<std::int32_t>> ids;
  std::size_t T = 0;
  bool per_batch = false, causal = true;
  bool operator()(std::size_t b, std::size_t h, std::size_t i, std::size_t j) const {
    return DocumentIds{ids->data(), T, per_batch, causal}(b, h, i, j);
  }
};

}  // namespace masks

// Factories: the programs above, wrapped for SdpaOptions.
inline std::shared_ptr<const ScoreProgram> softcap_program(double cap) {
  return score_program(programs::Softcap{cap}, "softcap");
}
inline std::shared_ptr<const ScoreProgram> alibi_program(std::size_t query_offset = 0) {
  return score_program(programs::Alibi{query_offset}, "alibi");
}
inline std::shared_ptr<const ScoreProgram> bias_program(std::size_t heads, std::size_t Tq,
                                                        std::size_t Tk, bool per_batch,
                                                        bool per_head) {
  return score_program(programs::Bias{heads, Tq, Tk, per_batch, per_head}, "bias");
}
inline std::shared_ptr<const ScoreProgram> relative_bias_program(std::size_t max_distance) {
  return score_program(programs::RelativeBias{max_distance}, "relative bias");
}
inline std::shared_ptr<const MaskProgram> causal_mask(std::size_t query_offset = 0) {
  return mask_program(masks::Causal{query_offset}, "causal", {false, false});
}
inline std::shared_ptr<const MaskProgram> sliding_window_mask(std::size_t window,
                                                              std::size_t query_offset = 0) {
  return mask_program(masks::SlidingWindow{window, query_offset}, "sliding window", {false, false});
}
inline std::shared_ptr<const MaskProgram> key_padding_mask(std::vector<unsigned char> mask,
                                                           std::size_t Tk) {
  return mask_program(
      masks::KeyPadding{std::make_shared<const std::vector<unsigned char>>(std::move(mask)), Tk},
      "key padding", {true, false});
}
inline std::shared_ptr<const MaskProgram> prefix_lm_mask(std::size_t prefix) {
  return mask_program(masks::PrefixLM{prefix}, "prefix-LM", {false, false});
}
// ids: T document ids (one layout for every batch row), or B·T with per_batch.
inline std::shared_ptr<const MaskProgram> document_mask(std::vector<std::int32_t> ids,
                                                        std::size_t T, bool per_batch = false,
                                                        bool causal = true) {
  return mask_program(
      masks::Document{std::make_shared<const std::vector<std::int32_t>>(std::move(ids)), T,
                      per_batch, causal},
      causal ? "causal document" : "document", {per_batch, false});
}

}  // namespace attnlab::attention
