// MultiHeadAttention's attention programs (attnlab/nn/multi_head_attention.hpp): the layer's
// score program and its parameters, the per-forward SequenceLayout (packed documents' block mask
// and RoPE positions), and the core on the program path: the host op over copies of the layer's
// buffers, or on a device backend the GPU op's program paths over the buffers themselves.
#include <algorithm>
#include <cassert>
#include <string>
#include <vector>

#include "attnlab/attention/programs.hpp"
#include "attnlab/nn/multi_head_attention.hpp"
#include "attnlab/ops/attention_cuda.hpp"

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
  device_program_ = std::move(spec.device_program);
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
  layout.documents = documents;
  layout.block_mask = std::make_shared<const attention::BlockMask>(attention::build_block_mask(
      attention::document_mask(std::move(documents), T, /*per_batch=*/true, /*causal=*/true),
      {.B = B, .H = 1, .Hkv = 1, .Tq = T, .Tk = T, .D = 1, .Dv = 1}, tile_rows, tile_keys));
  return layout;
}

template <class T>
std::pair<std::size_t, std::size_t> layout_tiles(DeviceOps<T>& ops, const AttentionConfig& c) {
  const std::pair<std::size_t, std::size_t> own{c.sdpa.tile_rows, c.sdpa.tile_keys};
  if (ops.host_memory()) return own;
  const auto launchers = ops.document_mask_program(nullptr, 1);  // never launched: its tile only
  if (!launchers) return own;
  try {
    const auto tile = static_cast<std::size_t>(
        launchers->template get<T>().fused_tile(c.head_dim_k(), c.head_dim_v()));
    return {tile, tile};
  } catch (const std::invalid_argument&) {
    return own;
  }
}
template std::pair<std::size_t, std::size_t> layout_tiles(DeviceOps<float>&,
                                                          const AttentionConfig&);
template std::pair<std::size_t, std::size_t> layout_tiles(DeviceOps<double>&,
                                                          const AttentionConfig&);

std::shared_ptr<const attention::BlockMask> SequenceLayout::block_mask_at(
    std::size_t tile_rows, std::size_t tile_keys) const {
  if (!block_mask ||
      (block_mask->tile_rows() == tile_rows && block_mask->tile_keys() == tile_keys)) {
    return block_mask;
  }
  const AttentionSizes& sizes = block_mask->sizes();
  const auto same = [&](const attention::BlockMask& m) {
    const AttentionSizes& z = m.sizes();
    return m.program_ptr() == block_mask->program_ptr() && m.tile_rows() == tile_rows &&
           m.tile_keys() == tile_keys && z.B == sizes.B && z.H == sizes.H && z.Tq == sizes.Tq &&
           z.Tk == sizes.Tk;
  };
  const std::lock_guard<std::mutex> lock(tiles_->lock);
  for (const auto& m : tiles_->built) {
    if (same(*m)) return m;
  }
  tiles_->built.push_back(std::make_shared<const attention::BlockMask>(
      attention::build_block_mask(block_mask->program_ptr(), sizes, tile_rows, tile_keys)));
  return tiles_->built.back();
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
  const bool device = !this->ops().host_memory();
  if (ctx.program_) {
    // On a device: the GPU op with the program's launchers (the layout's: the backend's own).
    check_arg(!device || !score_program_ || device_program_, op, "score_program",
              "its GPU launchers on a device backend (ScoreProgramSpec::device_program = "
              "attnlab::cuda::device_program(score))",
              "none, on " + this->ops().name());
    check_arg(cache == nullptr, "MultiHeadAttention::forward_cached", "score_program",
              "none with a KV cache (a program sees the query's index within the call)",
              "a program");
  }
  if (score_program_) {
    options.score_program = score_program_;
    options.device_program = device_program_;
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
    if (device) bind_device_documents(ctx, options, B, Tq, *layout);
  }
}

// A layout's document mask on a device backend: its ids uploaded for this forward (kept in ctx
// for the backward), the backend's launchers of masks::DocumentIds over them, and the block mask
// at their fused tile (built once per layout, shared by the layers).
template <class T>
void MultiHeadAttention<T>::bind_device_documents(Context& ctx, SdpaOptions& options, std::size_t B,
                                                  std::size_t Tn, const SequenceLayout& layout) {
  const char* op = "MultiHeadAttention";
  DeviceOps<T>& ops = this->ops();
  check_arg(!score_program_, op, "layout.block_mask",
            "no score program beside a layout's mask on a device backend (one device program "
            "holds both: give the mask in its attnlab::cuda::device_program(score, mask))",
            "a score program, on " + ops.name());
  check_arg(layout.documents.size() == B * Tn, op, "layout.documents",
            "B·T = " + std::to_string(B * Tn) +
                " document ids on a device backend (a layout from document_layout: the GPU "
                "kernels run only its mask)",
            std::to_string(layout.documents.size()));
  ctx.documents_ = Buffer<int>::from_host(ops, layout.documents.data(), {B, Tn});
  auto launchers = ops.document_mask_program(ctx.documents_.data(), Tn);
  check_arg(launchers != nullptr, op, "layout.block_mask", "a backend that runs a document mask",
            ops.name());
  options.device_program = std::move(launchers);
  if (options.path == SdpaPath::fused) {
    const auto tile =
        static_cast<std::size_t>(options.device_program->template get<T>().fused_tile(D_, Dv_));
    options.block_mask = layout.block_mask_at(tile, tile);
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
// A buffer as a host tensor, and back: the program path on a CPU backend runs the host op on host
// tensors.
template <class T>
Tensor4<T> host_tensor(const Buffer<T>& b) {
  Tensor4<T> out({b.dim(0), b.dim(1), b.dim(2), b.dim(3)});
  b.copy_to_host(out.data());
  return out;
}
template <class T>
void copy_into(DeviceOps<T>& ops, Buffer<T>& b, const Tensor4<T>& t) {
  assert(b.size() == t.size());
  if (t.size() > 0) ops.upload(b.data(), t.data(), t.size() * sizeof(T));
}
}  // namespace

// The op over the layer's q, k, v: on a CPU backend the host op (its cache keeps P or O and the
// log-sum-exp); on a device the GPU op's program paths over the layer's own buffers (P or the
// log-sum-exp in ctx, no host copies).
template <class T>
void MultiHeadAttention<T>::program_forward(Context& ctx) {
  DeviceOps<T>& ops = this->ops();
  const AttentionSpec& s = ctx.spec_;
  if (!ops.host_memory()) {
    const AttentionSizes sizes{
        .B = s.B, .H = s.H, .Hkv = s.Hkv, .Tq = s.Tq, .Tk = s.Tk, .D = s.D, .Dv = s.Dv};
    ctx.sdpa_ =
        sdpa_program_cache<T>(ops, resolve_sdpa("sdpa_forward", ctx.options_, sizes), ctx.options_);
    ctx.fused_ = ctx.sdpa_.path == SdpaPath::fused;
    (ctx.fused_ ? ctx.p_ : ctx.lse_) = Buffer<T>();  // the other path's output
    T* aux = ctx.fused_ ? Buffer<T>::reuse(ctx.lse_, ops, {s.B, H_, s.Tq}).data()
                        : Buffer<T>::reuse(ctx.p_, ops, {s.B, H_, s.Tq, s.Tk}).data();
    sdpa_program_forward_device<T>(ops, ctx.sdpa_, params(ctx), ctx.o_.data(), aux);
    return;
  }
  ctx.p_ = ctx.lse_ = Buffer<T>();
  const KeyMask mask = ctx.mask_.empty() ? KeyMask() : mask_to_host(ctx.mask_);
  SdpaOptions options = ctx.options_;
  const std::vector<T> scales = ctx.scale_.to_vector();
  options.head_scale.assign(scales.begin(), scales.end());
  const Tensor4<T> q = host_tensor(ctx.q_), k = host_tensor(ctx.k_), v = host_tensor(ctx.v_);
  const Tensor4<T> o =
      sdpa_forward<T>(ctx.sdpa_, q, k, v, options, ctx.mask_.empty() ? nullptr : &mask);
  ctx.fused_ = ctx.sdpa_.path == SdpaPath::fused;
  copy_into(ops, ctx.o_, o);
}

// dQ, dK, dV of the op into the layer's buffers; the program's parameter grads added in.
template <class T>
void MultiHeadAttention<T>::program_backward(const Context& ctx, const Buffer<T>& dout) {
  DeviceOps<T>& ops = this->ops();
  std::vector<std::vector<T>> dprogram;
  if (!ops.host_memory()) {
    const AttentionSpec& s = ctx.spec_;
    const std::size_t scratch = s.B * H_ * s.Tq * (ctx.fused_ ? 1 : s.Tk);  // row_dot or dS
    dprogram = sdpa_program_backward_device<T>(
        ops, ctx.sdpa_, params(ctx), dout.data(), ctx.o_.data(),
        ctx.fused_ ? ctx.lse_.data() : ctx.p_.data(), dq_.data(), dk_.data(), dv_.data(),
        Buffer<T>::reuse(ds_, ops, {scratch}).data());
  } else {
    const Tensor4<T> d = host_tensor(dout), q = host_tensor(ctx.q_), k = host_tensor(ctx.k_),
                     v = host_tensor(ctx.v_);
    const SdpaGrads<T> g = sdpa_backward<T>(d, ctx.sdpa_, q, k, v);
    copy_into(ops, dq_, g.dq);
    copy_into(ops, dk_, g.dk);
    copy_into(ops, dv_, g.dv);
    for (const auto& t : g.dprogram) dprogram.emplace_back(t.begin(), t.end());
  }
  for (std::size_t k = 0; k < dprogram.size() && k < program_params_.size(); ++k) {
    const std::size_t n = dprogram[k].size();
    Parameter<T>& p = *program_params_[k];
    if (ops.host_memory()) {
      T* grad = p.grad_data();
      for (std::size_t e = 0; e < n; ++e) grad[e] += dprogram[k][e];
    } else {  // grad ← 1·grad + 1·dprogram, on the device
      const Buffer<T> add = Buffer<T>::from_host(ops, dprogram[k].data(), {n});
      ops.axpby(p.grad_data(), add.data(), n, T(1), T(1));
    }
  }
}

#define ATTNLAB_INSTANTIATE_MHA_PROGRAMS(T)                                                       \
  template void MultiHeadAttention<T>::set_score_program(ScoreProgramSpec);                       \
  template void MultiHeadAttention<T>::bind_programs(Context&, SdpaOptions&, std::size_t,         \
                                                     std::size_t, std::size_t, KVCache<T>*,       \
                                                     const SequenceLayout*);                      \
  template void MultiHeadAttention<T>::bind_device_documents(Context&, SdpaOptions&, std::size_t, \
                                                             std::size_t, const SequenceLayout&); \
  template void MultiHeadAttention<T>::program_forward(Context&);                                 \
  template void MultiHeadAttention<T>::program_backward(const Context&, const Buffer<T>&);        \
  template void MultiHeadAttention<T>::rotate_heads(const Context&, T*, std::size_t, std::size_t, \
                                                    std::size_t, bool);
ATTNLAB_INSTANTIATE_MHA_PROGRAMS(float)
ATTNLAB_INSTANTIATE_MHA_PROGRAMS(double)

}  // namespace attnlab
