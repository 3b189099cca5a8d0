// MultiHeadAttention's attention programs (attnlab/nn/multi_head_attention.hpp): the layer's
// score program and its parameters, the per-forward SequenceLayout (packed documents' block mask
// and RoPE positions), and the core on the program path, the host op over the layer's buffers.
#include <algorithm>
#include <cassert>
#include <string>
#include <vector>

#include "attnlab/attention/programs.hpp"
#include "attnlab/nn/multi_head_attention.hpp"

namespace attnlab {

template <class T>
void MultiHeadAttention<T>::set_score_program(ScoreProgramSpec spec) {
  const char* op = "MultiHeadAttention::set_score_program";
  if (w_q.on_device() || !program_params_.empty() || score_program_) {
    throw std::logic_error(std::string(op) +
                           ": call it once, before Module::to and before the parameters go to an "
                           "optimizer (the parameter list would change under them)");
  }
  check_arg(spec.program != nullptr, op, "spec.program", "a score program", "none");
  check_arg(!config_.alibi && config_.sdpa.softcap == 0, op, "config",
            "no alibi and no sdpa.softcap beside a score program (give them in the program: "
            "attnlab/attention/programs.hpp has each)",
            config_.alibi ? "alibi" : "sdpa.softcap " + std::to_string(config_.sdpa.softcap));
  for (std::size_t k = 0; k < spec.params.size(); ++k) {
    const auto& [name, values] = spec.params[k];
    const std::string field = "spec.params[" + std::to_string(k) + "]";
    check_arg(!name.empty() && name.find('.') == std::string::npos, op, field + ".name",
              "a non-empty name without '.'", "'" + name + "'");
    for (std::size_t e = 0; e < k; ++e) {
      check_arg(spec.params[e].first != name, op, field + ".name", "a name not used before",
                "'" + name + "' again");
    }
    check_arg(!values.empty(), op, field + " ('" + name + "')", "at least one value", "none");
    xt::xarray<T> v = xt::zeros<T>({values.size()});
    for (std::size_t e = 0; e < values.size(); ++e) v(e) = static_cast<T>(values[e]);
    program_params_.push_back(std::make_unique<Parameter<T>>(make_parameter<T>(std::move(v))));
    program_names_.push_back(name);
  }
  score_program_ = std::move(spec.program);
}

SequenceLayout document_layout(std::vector<std::int32_t> documents, std::size_t B, std::size_t T,
                               bool restart_positions, std::size_t tile_rows,
                               std::size_t tile_keys) {
  const char* op = "document_layout";
  check_arg(B > 0 && T > 0, op, "B, T", "> 0", std::to_string(B) + ", " + std::to_string(T));
  check_arg(documents.size() == B * T, op, "documents", "B·T = " + std::to_string(B * T) + " ids",
            std::to_string(documents.size()));
  SequenceLayout layout;
  if (restart_positions) {
    layout.positions.resize(B * T);
    for (std::size_t b = 0; b < B; ++b) {
      std::size_t start = 0;
      for (std::size_t t = 0; t < T; ++t) {
        if (t > 0 && documents[b * T + t] != documents[b * T + t - 1]) start = t;
        layout.positions[b * T + t] = t - start;
      }
    }
  }
  layout.block_mask = std::make_shared<const attention::BlockMask>(attention::build_block_mask(
      attention::document_mask(std::move(documents), T, /*per_batch=*/true, /*causal=*/true),
      {.B = B, .H = 1, .Hkv = 1, .Tq = T, .Tk = T, .D = 1, .Dv = 1}, tile_rows, tile_keys));
  return layout;
}

// The programs of one call into its options: the layer's score program with its parameters'
// values, the layout's block mask (which replaces the causal rule; path auto treats it as causal,
// the fused path skipping its empty tiles) and RoPE positions.
template <class T>
void MultiHeadAttention<T>::bind_programs(Context& ctx, SdpaOptions& options, std::size_t B,
                                          std::size_t Tq, std::size_t Tk, KVCache<T>* cache,
                                          const SequenceLayout* layout) {
  const char* op = "MultiHeadAttention";
  const bool layout_mask = layout && layout->block_mask;
  ctx.program_ = score_program_ || layout_mask;
  ctx.positions_.clear();
  if (layout && !layout->positions.empty() && config_.rope) {
    check_arg(layout->positions.size() == B * Tq, op, "layout.positions",
              "B·T = " + std::to_string(B * Tq) + " positions",
              std::to_string(layout->positions.size()));
    ctx.positions_ = layout->positions;
  }
  if (ctx.program_) {
    check_arg(this->ops().host_memory(), op, score_program_ ? "score_program" : "layout.block_mask",
              "a backend with host memory (attention programs run on the CPU paths)",
              this->ops().name());
    check_arg(cache == nullptr, "MultiHeadAttention::forward_cached", "score_program",
              "none with a KV cache (a program sees the query's index within the call)",
              "a program");
  }
  if (score_program_) {
    options.score_program = score_program_;
    options.program_params.clear();
    for (const auto& p : program_params_) {
      const T* v = p->value_data();
      options.program_params.emplace_back(v, v + p->size());
    }
  }
  if (layout_mask) {
    check_arg(config_.sdpa.window == 0, op, "layout.block_mask",
              "a layer without sdpa.window (the mask replaces the causal rule and the window)",
              "window " + std::to_string(config_.sdpa.window));
    options.causal = false;
    options.query_offset = 0;
    options.block_mask = layout->block_mask;
    if (options.path == SdpaPath::automatic) {
      options.path = resolve_sdpa_path(SdpaPath::automatic, Tk, /*causal=*/true);
    }
  }
}

// Without positions: every row at offset .. offset + Tn − 1 (one call). With positions: each run of
// consecutive positions in a row, for each head, one call at the run's first position.
template <class T>
void MultiHeadAttention<T>::rotate_heads(const Context& ctx, T* x, std::size_t heads,
                                         std::size_t Tn, std::size_t offset, bool inverse) {
  const std::size_t B = ctx.spec_.B;
  if (ctx.positions_.empty()) return rotate(x, B * heads, Tn, offset, inverse);
  const std::size_t* pos = ctx.positions_.data();
  for (std::size_t b = 0; b < B; ++b) {
    const std::size_t* row = pos + b * Tn;
    for (std::size_t t0 = 0, t1 = 0; t0 < Tn; t0 = t1) {
      for (t1 = t0 + 1; t1 < Tn && row[t1] == row[t1 - 1] + 1;) ++t1;
      for (std::size_t h = 0; h < heads; ++h) {
        rotate(x + ((b * heads + h) * Tn + t0) * D_, 1, t1 - t0, row[t0], inverse);
      }
    }
  }
}

namespace {
// A host-memory buffer as a tensor, and back (the program path: the host op on the buffers).
template <class T>
Tensor4<T> host_tensor(const Buffer<T>& b) {
  Tensor4<T> out({b.dim(0), b.dim(1), b.dim(2), b.dim(3)});
  std::copy(b.data(), b.data() + b.size(), out.data());
  return out;
}
template <class T>
void copy_into(Buffer<T>& b, const Tensor4<T>& t) {
  assert(b.size() == t.size());
  std::copy(t.data(), t.data() + t.size(), b.data());
}
}  // namespace

// The host op over the layer's q, k, v (host memory): its cache keeps P or O and the log-sum-exp.
template <class T>
void MultiHeadAttention<T>::program_forward(Context& ctx) {
  ctx.p_ = ctx.lse_ = Buffer<T>();
  const KeyMask mask = ctx.mask_.empty() ? KeyMask() : mask_to_host(ctx.mask_);
  SdpaOptions options = ctx.options_;
  const std::vector<T> scales = ctx.scale_.to_vector();
  options.head_scale.assign(scales.begin(), scales.end());
  const Tensor4<T> o =
      sdpa_forward<T>(ctx.sdpa_, host_tensor(ctx.q_), host_tensor(ctx.k_), host_tensor(ctx.v_),
                      options, ctx.mask_.empty() ? nullptr : &mask);
  ctx.fused_ = ctx.sdpa_.path == SdpaPath::fused;
  copy_into(ctx.o_, o);
}

// dQ, dK, dV of the host op into the layer's buffers; the program's parameter grads added in.
template <class T>
void MultiHeadAttention<T>::program_backward(const Context& ctx, const Buffer<T>& dout) {
  const SdpaGrads<T> g = sdpa_backward<T>(host_tensor(dout), ctx.sdpa_, host_tensor(ctx.q_),
                                          host_tensor(ctx.k_), host_tensor(ctx.v_));
  copy_into(dq_, g.dq);
  copy_into(dk_, g.dk);
  copy_into(dv_, g.dv);
  for (std::size_t k = 0; k < g.dprogram.size() && k < program_params_.size(); ++k) {
    T* grad = program_params_[k]->grad_data();
    for (std::size_t e = 0; e < g.dprogram[k].size(); ++e) grad[e] += g.dprogram[k](e);
  }
}

#define ATTNLAB_INSTANTIATE_MHA_PROGRAMS(T)                                                       \
  template void MultiHeadAttention<T>::set_score_program(ScoreProgramSpec);                       \
  template void MultiHeadAttention<T>::bind_programs(Context&, SdpaOptions&, std::size_t,         \
                                                     std::size_t, std::size_t, KVCache<T>*,       \
                                                     const SequenceLayout*);                      \
  template void MultiHeadAttention<T>::program_forward(Context&);                                 \
  template void MultiHeadAttention<T>::program_backward(const Context&, const Buffer<T>&);        \
  template void MultiHeadAttention<T>::rotate_heads(const Context&, T*, std::size_t, std::size_t, \
                                                    std::size_t, bool);
ATTNLAB_INSTANTIATE_MHA_PROGRAMS(float)
ATTNLAB_INSTANTIATE_MHA_PROGRAMS(double)

}  // namespace attnlab
