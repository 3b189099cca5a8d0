// Positional information added to the token embeddings: x[b, t, :] + pos[t, :].
//   learned:    parameter "table" (max_len, C) drawn from N(0, 1) (an embedding like the tokens').
//   sinusoidal: fixed, no parameters. Vaswani et al. 2017, §3.5:
//               pos[t, 2i] = sin(t / 10000^(2i/C)),  pos[t, 2i+1] = cos(t / 10000^(2i/C)).
//   none:       the identity.
//   rope:       the identity here: the attention layers rotate q and k by position instead
//               (AttentionConfig::rope, attnlab/ops/rope.hpp; a Transformer sets it).
#pragma once

#include <string_view>

#include "attnlab/enum_table.hpp"
#include "attnlab/nn/module.hpp"
#include "attnlab/random.hpp"

namespace attnlab {

enum class PositionEncoding { learned, sinusoidal, none, rope };

template <>
struct EnumTable<PositionEncoding> {
  static constexpr EnumEntry<PositionEncoding> entries[] = {
      {PositionEncoding::learned, "learned", "a learned table"},
      {PositionEncoding::sinusoidal, "sinusoidal", "Vaswani et al.'s fixed table"},
      {PositionEncoding::none, "none", "no position signal (suits ALiBi)"},
      {PositionEncoding::rope, "rope", "RoPE: q and k rotated in every block"},
  };
  static constexpr EnumParseText parse = {"parse_position_encoding", "positions"};
};

// The names of EnumTable<PositionEncoding>; parse throws std::invalid_argument naming the value.
inline std::string_view to_string(PositionEncoding kind) {
  return enum_name(kind);
}
inline PositionEncoding parse_position_encoding(std::string_view text) {
  return parse_enum<PositionEncoding>(text);
}

// The (max_len, dim) sinusoidal table.
template <class T>
Tensor2<T> sinusoidal_table(std::size_t max_len, std::size_t dim);

template <class T>
class PositionalEncoding : public SequenceModule<T> {
 public:
  // Draws the learned table from `rng` (nothing is drawn for the other kinds).
  PositionalEncoding(PositionEncoding kind, std::size_t max_len, std::size_t dim, Rng& rng);

  void collect_parameters(const std::string& prefix, ParameterList<T>& out) override;
  std::size_t in_features() const override { return dim_; }
  std::size_t out_features() const override { return dim_; }
  std::string_view type_name() const override { return "PositionalEncoding"; }
  PositionEncoding kind() const { return kind_; }
  std::size_t max_len() const { return max_len_; }

  // x (B, T, C) at positions offset .. offset + T - 1 (incremental decoding; forward() is offset
  // 0). Throws std::invalid_argument when offset + T > max_len. No backward.
  Buffer<T> forward_at(const Buffer<T>& x, std::size_t offset);

  Parameter<T> table;  // (max_len, C): learned, or the fixed sinusoids (not listed as a parameter)

 protected:
  // Throws std::invalid_argument when T > max_len.
  Buffer<T> forward_impl(const Buffer<T>& x) override;
  Buffer<T> backward_impl(const Buffer<T>& dy) override;
  void reset_cache() override {
    SequenceModule<T>::reset_cache();
    fixed_ = Buffer<T>();
  }

 private:
  PositionEncoding kind_;
  std::size_t max_len_, dim_;
  Buffer<T> fixed_;     // the sinusoidal table on the backend (not a parameter)
  Buffer<T> y_, dpos_;  // reused output and gradient buffers
};

}  // namespace attnlab
