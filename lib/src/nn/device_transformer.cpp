// DeviceTransformer and DeviceOptimizer (attnlab/nn/device_transformer.hpp): the CPU Transformer's
// forward and backward (nn/transformer.cpp, transformer_block.cpp, multi_head_attention.cpp,
// feed_forward.cpp, embedding.cpp, positional.cpp) written once more as device operations, in the
// same order of operations, on activations kept for the backward pass.
#include "attnlab/nn/device_transformer.hpp"

#include <algorithm>
#include <cmath>
#include <stdexcept>
#include <string>

#include "attnlab/cuda_train.hpp"
#include "attnlab/ops/cross_entropy.hpp"
#include "attnlab/ops/embedding.hpp"
#include "attnlab/ops/layernorm.hpp"
#include "attnlab/ops/rmsnorm.hpp"
#include "attnlab/optim/clip.hpp"

namespace attnlab {

namespace {

// A growable device array of E on `ops`; the contents are not kept when it grows.
template <class T, class E>
class DeviceVec {
 public:
  explicit DeviceVec(DeviceOps<T>* ops = nullptr) : ops_(ops) {}
  ~DeviceVec() { free(); }
  DeviceVec(DeviceVec&& o) noexcept : ops_(o.ops_), data_(o.data_), capacity_(o.capacity_) {
    o.data_ = nullptr;
    o.capacity_ = 0;
  }
  DeviceVec& operator=(DeviceVec&&) = delete;
  DeviceVec(const DeviceVec&) = delete;

  // At least n elements (reallocated, contents lost, when it must grow).
  E* reserve(std::size_t n) {
    if (n > capacity_) {
      free();
      data_ = static_cast<E*>(ops_->allocate(n * sizeof(E)));
      capacity_ = n;
    }
    return data_;
  }
  E* data() const { return data_; }

 private:
  void free() {
    if (data_) ops_->release(data_);
    data_ = nullptr;
    capacity_ = 0;
  }
  DeviceOps<T>* ops_;
  E* data_ = nullptr;
  std::size_t capacity_ = 0;
};

std::size_t element_count(const std::vector<std::size_t>& shape) {
  std::size_t n = 1;
  for (std::size_t e : shape) n *= e;
  return n;
}

}  // namespace

template <class T>
struct DeviceTransformer<T>::Impl {
  using Buf = DeviceVec<T, T>;

  // Parameter pointers of one block (null when absent).
  struct BlockParams {
    T *ln1_g = nullptr, *ln1_b = nullptr, *ln2_g = nullptr, *ln2_b = nullptr;
    T *w_q = nullptr, *w_k = nullptr, *w_v = nullptr, *w_o = nullptr;
    T *qn_g = nullptr, *qn_b = nullptr, *kn_g = nullptr, *kn_b = nullptr, *log_scale = nullptr;
    T *fc1_w = nullptr, *fc1_b = nullptr, *fc2_w = nullptr, *fc2_b = nullptr;
  };
  // Activations one block keeps for its backward pass.
  struct BlockCache {
    explicit BlockCache(DeviceOps<T>* o)
        : a(o),
          mean1(o),
          rstd1(o),
          q_raw(o),
          k_raw(o),
          q_mean(o),
          q_rstd(o),
          k_mean(o),
          k_rstd(o),
          q(o),
          k(o),
          v(o),
          p(o),
          lse(o),
          o(o),
          merged(o),
          h(o),
          m(o),
          mean2(o),
          rstd2(o),
          u(o),
          g(o),
          y(o),
          scale(o) {}
    Buf a, mean1, rstd1;                                          // norm1(x)
    Buf q_raw, k_raw, q_mean, q_rstd, k_mean, k_rstd;             // QK-norm inputs and stats
    Buf q, k, v;                                                  // heads fed to the core
    Buf p, lse, o;                                                // weights or LSE, output
    Buf merged, h;                                                // merged heads, x + attn
    Buf m, mean2, rstd2, u, g, y;                                 // norm2(h), fc1, gelu, output
    Buf scale;                                                    // (H,) per-head scales
    const T *x_in = nullptr, *a_ptr = nullptr, *m_ptr = nullptr;  // block input, norm outputs
    bool fused = false;                                           // the path the forward ran
  };

  Impl(Transformer<T>& host, DeviceOps<T>& o)
      : ops(&o),
        config(host.config()),
        params(&o),
        grads(&o),
        pos_fixed(&o),
        ids(&o),
        targets(&o),
        mask(&o),
        x0(&o),
        tmp(&o),
        zf(&o),
        zmean(&o),
        zrstd(&o),
        logits(&o),
        dlogits(&o),
        row_loss(&o),
        loss_value(&o),
        d1(&o),
        d2(&o),
        d3(&o),
        dq(&o),
        dk(&o),
        dv(&o),
        dmerged(&o),
        dout(&o),
        dff1(&o),
        dff2(&o),
        dqn(&o),
        dkn(&o),
        wide(&o),
        ds(&o),
        sum_scratch(&o),
        sums(&o) {
    C = config.block.attention.d_model;
    H = config.block.attention.heads;
    D = config.block.attention.head_dim_k();
    Dv = config.block.attention.head_dim_v();
    F = config.block.d_ff;
    V = config.out_vocab;
    const ParameterList<T> list = host.parameters();
    std::size_t offset = 0;
    for (const auto& np : list) {
      names.push_back(np.name);
      shapes.emplace_back(np.param->value.shape().begin(), np.param->value.shape().end());
      offsets.push_back(offset);
      offset += np.param->value.size();
    }
    total = offset;
    params.reserve(total);
    grads.reserve(total);
    upload(list);
    for (std::size_t f = 0; f < config.vocab_sizes.size(); ++f) {
      field_tables.push_back(param("embed.fields." + std::to_string(f) + ".table"));
      field_grads.push_back(grad("embed.fields." + std::to_string(f) + ".table"));
    }
    if (config.positions == PositionEncoding::learned) {
      pos_table = param("pos.table");
      pos_grad = grad("pos.table");
    } else if (config.positions == PositionEncoding::sinusoidal) {
      const Tensor2<T> table = sinusoidal_table<T>(config.max_len, C);
      pos_table = pos_fixed.reserve(table.size());
      ops->upload(pos_table, table.data(), table.size() * sizeof(T));
    }
    for (std::size_t l = 0; l < config.layers; ++l) {
      const std::string p = "blocks." + std::to_string(l) + ".";
      BlockParams b;
      if (config.block.norm != Norm::none) {
        b.ln1_g = param(p + "ln1.gamma");
        if (config.block.norm == Norm::layernorm) b.ln1_b = param(p + "ln1.beta");
        if (!config.block.attn_only) {
          b.ln2_g = param(p + "ln2.gamma");
          if (config.block.norm == Norm::layernorm) b.ln2_b = param(p + "ln2.beta");
        }
      }
      b.w_q = param(p + "attn.w_q");
      b.w_k = param(p + "attn.w_k");
      b.w_v = param(p + "attn.w_v");
      b.w_o = param(p + "attn.w_o");
      if (config.block.attention.qk_norm) {
        b.qn_g = param(p + "attn.q_norm.gamma");
        b.qn_b = param(p + "attn.q_norm.beta");
        b.kn_g = param(p + "attn.k_norm.gamma");
        b.kn_b = param(p + "attn.k_norm.beta");
      }
      if (config.block.attention.learnable_scale) b.log_scale = param(p + "attn.log_scale");
      if (!config.block.attn_only) {
        b.fc1_w = param(p + "mlp.fc1.w");
        b.fc1_b = param(p + "mlp.fc1.b");
        b.fc2_w = param(p + "mlp.fc2.w");
        b.fc2_b = param(p + "mlp.fc2.b");
      }
      blocks.push_back(b);
      caches.emplace_back(ops);
      if (!config.block.attention.learnable_scale) {
        // The fixed scale of every head, as MultiHeadAttention::head_scales gives it.
        const std::vector<T> s(H, static_cast<T>(resolve_scale(config.block.attention.sdpa, D)));
        ops->upload(caches.back().scale.reserve(H), s.data(), H * sizeof(T));
      } else {
        caches.back().scale.reserve(H);
      }
    }
    if (config.block.norm != Norm::none) {
      lnf_g = param("ln_f.gamma");
      if (config.block.norm == Norm::layernorm) lnf_b = param("ln_f.beta");
    }
    head_w = param("head.w");
    if (config.block.attention.sdpa.path == SdpaPath::fused) ops->check_fused(D, Dv);
  }

  std::size_t index_of(const std::string& name) const {
    for (std::size_t i = 0; i < names.size(); ++i)
      if (names[i] == name) return i;
    throw std::invalid_argument("DeviceTransformer: no parameter named '" + name + "'");
  }
  T* param(const std::string& name) { return params.data() + offsets[index_of(name)]; }
  T* grad(const std::string& name) { return grads.data() + offsets[index_of(name)]; }
  T* grad_of_param(const T* p) { return grads.data() + (p - params.data()); }

  void check_list(const ParameterList<T>& list, const char* op) const {
    check_arg(list.size() == names.size(), op, "params",
              std::to_string(names.size()) + " parameters (Transformer::parameters())",
              std::to_string(list.size()));
    for (std::size_t i = 0; i < list.size(); ++i) {
      check_arg(list[i].param != nullptr, op, "parameter '" + names[i] + "'", "a Parameter",
                "a null pointer");
      check_arg(list[i].name == names[i], op, "parameter " + std::to_string(i),
                "'" + names[i] + "'", "'" + list[i].name + "'");
      const auto& s = list[i].param->value.shape();
      const std::vector<std::size_t> shape(s.begin(), s.end());
      check_extents(op, "parameter '" + names[i] + "'", shape,
                    std::vector<std::ptrdiff_t>(shapes[i].begin(), shapes[i].end()));
    }
  }

  void upload(const ParameterList<T>& list) {
    check_list(list, "DeviceTransformer::upload_parameters");
    for (std::size_t i = 0; i < list.size(); ++i) {
      ops->upload(params.data() + offsets[i], list[i].param->value.data(),
                  list[i].param->value.size() * sizeof(T));
    }
  }

  bool fused() const {
    if (resolve_sdpa_path(config.block.attention.sdpa.path, Tn,
                          config.block.attention.sdpa.causal) != SdpaPath::fused)
      return false;
    if (config.block.attention.sdpa.path == SdpaPath::fused)
      return true;  // checked at construction
    try {           // automatic: the fused path when the device's kernels can take these head dims
      ops->check_fused(D, Dv);
      return true;
    } catch (const std::invalid_argument&) {
      return false;
    }
  }

  AttentionParams<T> sdpa_args(const BlockCache& c) const {
    AttentionParams<T> a;
    static_cast<AttentionSpec&>(a) = attention_spec;
    a.q = c.q.data();
    a.k = c.k.data();
    a.v = c.v.data();
    a.scale = c.scale.data();
    a.key_mask = has_mask ? mask.data() : nullptr;
    return a;
  }

  // y = norm(x) into `out` (stats into mean/rstd); for Norm::none, out = x.
  const T* norm_forward(Buf& out, Buf& mean, Buf& rstd, const T* x, const T* gamma, const T* beta) {
    if (config.block.norm == Norm::none) return x;
    T* y = out.reserve(N * C);
    if (config.block.norm == Norm::layernorm) {
      ops->layernorm_forward(y, mean.reserve(N), rstd.reserve(N), x, gamma, beta, N, C,
                             static_cast<T>(kLayerNormEps));
    } else {
      ops->rmsnorm_forward(y, rstd.reserve(N), x, gamma, N, C, static_cast<T>(kRmsNormEps));
    }
    return y;
  }

  // dx of a norm into `dx` (gamma/beta grads assigned); for Norm::none returns dy itself.
  T* norm_backward_into(T* dx, T* dy, const T* x, const Buf& mean, const Buf& rstd, const T* gamma,
                        const T* beta) {
    if (config.block.norm == Norm::none) return dy;
    if (config.block.norm == Norm::layernorm) {
      ops->layernorm_backward(dx, grad_of_param(gamma), grad_of_param(beta), dy, x, mean.data(),
                              rstd.data(), gamma, N, C);
    } else {
      ops->rmsnorm_backward(dx, grad_of_param(gamma), dy, x, rstd.data(), gamma, N, C);
    }
    return dx;
  }

  void forward(const std::vector<TokenIds>& fields, const KeyMask* key_mask) {
    const char* op = "DeviceTransformer::forward";
    check_arg(fields.size() == config.vocab_sizes.size(), op, "fields",
              std::to_string(config.vocab_sizes.size()) + " id tensors (one per vocabulary)",
              std::to_string(fields.size()));
    const std::size_t b = fields[0].shape()[0], t = fields[0].shape()[1];
    check_arg(b > 0 && t > 0, op, "fields[0]", "a non-empty (B, T) tensor",
              "(" + std::to_string(b) + ", " + std::to_string(t) + ")");
    check_arg(t <= config.max_len, op, "fields (B, T)",
              "T <= max_len = " + std::to_string(config.max_len), "T = " + std::to_string(t));
    for (std::size_t f = 0; f < fields.size(); ++f) {
      check_shape(op, "fields[" + std::to_string(f) + "]", fields[f],
                  {static_cast<std::ptrdiff_t>(b), static_cast<std::ptrdiff_t>(t)});
      const std::size_t vocab = config.vocab_sizes[f];
      for (std::size_t i = 0; i < b * t; ++i) {
        const int id = fields[f].data()[i];
        if (id != kNoToken && (id < 0 || static_cast<std::size_t>(id) >= vocab)) {
          check_arg(false, op,
                    "fields[" + std::to_string(f) + "][" + std::to_string(i / t) + ", " +
                        std::to_string(i % t) + "]",
                    "an id in [0, " + std::to_string(vocab) + ") or -1 (no token)",
                    std::to_string(id));
        }
      }
    }
    if (key_mask)
      check_shape(op, "key_mask", *key_mask,
                  {static_cast<std::ptrdiff_t>(b), static_cast<std::ptrdiff_t>(t)});
    has_forward = has_loss = false;
    B = b;
    Tn = t;
    N = B * Tn;
    // Self-attention over the T tokens; the options' checks are the CPU op's.
    attention_spec =
        make_attention_spec(op, config.block.attention.sdpa,
                            {.B = B, .H = H, .Hkv = H, .Tq = Tn, .Tk = Tn, .D = D, .Dv = Dv});
    const std::size_t nf = fields.size();
    int* id_data = ids.reserve(nf * N);
    for (std::size_t f = 0; f < nf; ++f) {
      ops->upload(id_data + f * N, fields[f].data(), N * sizeof(int));
    }
    has_mask = key_mask != nullptr;
    if (has_mask) {
      std::vector<unsigned char> m(N);
      for (std::size_t i = 0; i < N; ++i) m[i] = key_mask->data()[i] ? 1 : 0;
      ops->upload(mask.reserve(N), m.data(), N);
    }

    // x = Σ_fields embed_f(ids_f) + pos                                        (N, C)
    T* x = x0.reserve(N * C);
    ops->embedding_forward(x, id_data, field_tables[0], N, C);
    for (std::size_t f = 1; f < nf; ++f) {
      T* e = tmp.reserve(N * C);
      ops->embedding_forward(e, id_data + f * N, field_tables[f], N, C);
      ops->add(x, x, e, N * C);
    }
    if (pos_table) ops->add_bias(x, pos_table, B, Tn * C);  // x[b] += pos[0:T] as (T·C,)

    const bool use_fused = fused();
    const T* in = x;
    for (std::size_t l = 0; l < blocks.size(); ++l) in = block_forward(l, in, use_fused);
    block_out = in;
    // logits = head(norm_f(x))
    z = norm_forward(zf, zmean, zrstd, in, lnf_g, lnf_b);
    ops->linear_forward(logits.reserve(N * V), z, head_w, nullptr, N, C, V);
    has_forward = true;
  }

  const T* block_forward(std::size_t l, const T* x, bool use_fused) {
    const BlockParams& bp = blocks[l];
    BlockCache& c = caches[l];
    // h = x + attn(norm1(x))
    const T* a = norm_forward(c.a, c.mean1, c.rstd1, x, bp.ln1_g, bp.ln1_b);
    c.x_in = x;
    c.a_ptr = a;
    const std::size_t HD = H * D, HDv = H * Dv, rows_h = B * H * Tn;
    T* proj = wide.reserve(N * std::max(HD, HDv));
    // Q, K, V projections, split into heads (B,H,T,·); QK-norm over D per head.
    T* q = c.q.reserve(rows_h * D);
    T* k = c.k.reserve(rows_h * D);
    T* v = c.v.reserve(rows_h * Dv);
    ops->linear_forward(proj, a, bp.w_q, nullptr, N, C, HD);
    ops->split_heads(config.block.attention.qk_norm ? c.q_raw.reserve(rows_h * D) : q, proj, B, Tn,
                     H, D);
    ops->linear_forward(proj, a, bp.w_k, nullptr, N, C, HD);
    ops->split_heads(config.block.attention.qk_norm ? c.k_raw.reserve(rows_h * D) : k, proj, B, Tn,
                     H, D);
    ops->linear_forward(proj, a, bp.w_v, nullptr, N, C, HDv);
    ops->split_heads(v, proj, B, Tn, H, Dv);
    if (config.block.attention.qk_norm) {
      const T eps = static_cast<T>(kLayerNormEps);
      ops->layernorm_forward(q, c.q_mean.reserve(rows_h), c.q_rstd.reserve(rows_h), c.q_raw.data(),
                             bp.qn_g, bp.qn_b, rows_h, D, eps);
      ops->layernorm_forward(k, c.k_mean.reserve(rows_h), c.k_rstd.reserve(rows_h), c.k_raw.data(),
                             bp.kn_g, bp.kn_b, rows_h, D, eps);
    }
    if (bp.log_scale) ops->exp(c.scale.data(), bp.log_scale, H);
    T* o = c.o.reserve(rows_h * Dv);
    if (use_fused) {
      ops->sdpa_fused_forward(o, c.lse.reserve(rows_h), sdpa_args(c));
    } else {
      ops->sdpa_reference_forward(o, c.p.reserve(rows_h * Tn), sdpa_args(c));
    }
    c.fused = use_fused;
    T* merged = c.merged.reserve(N * HDv);
    ops->merge_heads(merged, o, B, Tn, H, Dv);
    T* h = c.h.reserve(N * C);
    ops->linear_forward(h, merged, bp.w_o, nullptr, N, HDv, C);
    ops->add(h, x, h, N * C);  // h = x + attn(norm1(x))
    if (config.block.attn_only) return h;
    // y = h + mlp(norm2(h)),  mlp = fc2(gelu(fc1(·)))
    const T* m = norm_forward(c.m, c.mean2, c.rstd2, h, bp.ln2_g, bp.ln2_b);
    c.m_ptr = m;
    T* u = c.u.reserve(N * F);
    ops->linear_forward(u, m, bp.fc1_w, bp.fc1_b, N, C, F);
    T* g = c.g.reserve(N * F);
    ops->gelu_forward(g, u, N * F, false);
    T* y = c.y.reserve(N * C);
    ops->linear_forward(y, g, bp.fc2_w, bp.fc2_b, N, F, C);
    ops->add(y, h, y, N * C);
    return y;
  }

  double loss(const TokenIds& targets_in) {
    if (!has_forward) throw std::logic_error("DeviceTransformer::loss: called before forward");
    const char* op = "DeviceTransformer::loss";
    check_shape(op, "targets", targets_in,
                {static_cast<std::ptrdiff_t>(B), static_cast<std::ptrdiff_t>(Tn)});
    for (std::size_t i = 0; i < N; ++i) {
      const int t = targets_in.data()[i];
      if (t != kIgnoreIndex && (t < 0 || static_cast<std::size_t>(t) >= V)) {
        check_arg(false, op,
                  "targets[" + std::to_string(i / Tn) + ", " + std::to_string(i % Tn) + "]",
                  "a class in [0, " + std::to_string(V) + ") or " + std::to_string(kIgnoreIndex),
                  std::to_string(t));
      }
    }
    int* t = targets.reserve(N);
    ops->upload(t, targets_in.data(), N * sizeof(int));
    T* value = loss_value.reserve(1);
    ops->softmax_cross_entropy(value, dlogits.reserve(N * V), row_loss.reserve(N), logits.data(), t,
                               N, V, kIgnoreIndex);
    T host = 0;
    ops->download(&host, value, sizeof(T));
    has_loss = true;
    return static_cast<double>(host);
  }

  void backward() {
    if (!has_loss) throw std::logic_error("DeviceTransformer::backward: called before loss");
    // Parameters no path reaches (position rows >= T) get zero.
    if (pos_grad) ops->zero(pos_grad, config.max_len * C * sizeof(T));
    // head, then norm_f
    T* dz = d1.reserve(N * C);
    ops->linear_backward(dz, grad_of_param(head_w), nullptr, dlogits.data(), z, head_w, N, C, V);
    const T* dx = norm_backward_into(d2.reserve(N * C), dz, block_out, zmean, zrstd, lnf_g, lnf_b);
    // dx flows through d1/d2/d3 (N, C) buffers; each block writes its result into a free one.
    for (std::size_t l = blocks.size(); l-- > 0;) dx = block_backward(l, dx);
    // positions: dpos[t] = Σ_b dx[b, t]; embeddings: every field receives dx
    if (pos_grad) ops->column_sum(pos_grad, dx, B, Tn * C);
    for (std::size_t f = 0; f < field_tables.size(); ++f) {
      ops->embedding_backward(field_grads[f], dx, ids.data() + f * N, N, config.vocab_sizes[f], C);
    }
  }

  // A (N, C) buffer among d1, d2, d3 that is neither a nor b.
  T* free_stream(const T* a, const T* b) {
    for (Buf* buf : {&d1, &d2, &d3}) {
      T* p = buf->reserve(N * C);
      if (p != a && p != b) return p;
    }
    throw std::logic_error("DeviceTransformer: no free gradient buffer");
  }

  const T* block_backward(std::size_t l, const T* dy) {
    const BlockParams& bp = blocks[l];
    BlockCache& c = caches[l];
    const std::size_t HD = H * D, HDv = H * Dv, rows_h = B * H * Tn;
    const T* dh = dy;  // dL/dh
    if (!config.block.attn_only) {
      // y = h + fc2(gelu(fc1(norm2(h))))
      T* dg = dff1.reserve(N * F);
      ops->linear_backward(dg, grad_of_param(bp.fc2_w), grad_of_param(bp.fc2_b), dy, c.g.data(),
                           bp.fc2_w, N, F, C);
      T* du = dff2.reserve(N * F);
      ops->gelu_backward(du, dg, c.u.data(), N * F, false);
      T* dm = free_stream(dy, nullptr);
      ops->linear_backward(dm, grad_of_param(bp.fc1_w), grad_of_param(bp.fc1_b), du, c.m_ptr,
                           bp.fc1_w, N, C, F);
      T* sum = norm_backward_into(free_stream(dy, dm), dm, c.h.data(), c.mean2, c.rstd2, bp.ln2_g,
                                  bp.ln2_b);
      ops->add(sum, dy, sum, N * C);  // dh = dy + dm
      dh = sum;
    }
    // h = x + w_o(merge(sdpa(split(a w_q), split(a w_k), split(a w_v))))
    T* merged_g = dmerged.reserve(N * std::max(HD, HDv));
    ops->linear_backward(merged_g, grad_of_param(bp.w_o), nullptr, dh, c.merged.data(), bp.w_o, N,
                         HDv, C);
    T* dout_p = dout.reserve(rows_h * Dv);
    ops->split_heads(dout_p, merged_g, B, Tn, H, Dv);
    T* dq_p = dq.reserve(rows_h * D);
    T* dk_p = dk.reserve(rows_h * D);
    T* dv_p = dv.reserve(rows_h * Dv);
    const auto args = sdpa_args(c);
    if (c.fused) {
      ops->sdpa_fused_backward(dq_p, dk_p, dv_p, ds.reserve(rows_h), dout_p, c.o.data(),
                               c.lse.data(), args);
    } else {
      ops->sdpa_reference_backward(dq_p, dk_p, dv_p, ds.reserve(rows_h * Tn), dout_p, c.p.data(),
                                   args);
    }
    // s = exp(log s): dL/dlog s_h = s_h · dL/ds_h = Σ q ⊙ dq over head h (as dQ = s · dZ K).
    if (bp.log_scale) ops->head_dot(grad_of_param(bp.log_scale), c.q.data(), dq_p, B, H, Tn * D);
    if (config.block.attention.qk_norm) {
      T* dq_raw = dqn.reserve(rows_h * D);
      T* dk_raw = dkn.reserve(rows_h * D);
      ops->layernorm_backward(dq_raw, grad_of_param(bp.qn_g), grad_of_param(bp.qn_b), dq_p,
                              c.q_raw.data(), c.q_mean.data(), c.q_rstd.data(), bp.qn_g, rows_h, D);
      ops->layernorm_backward(dk_raw, grad_of_param(bp.kn_g), grad_of_param(bp.kn_b), dk_p,
                              c.k_raw.data(), c.k_mean.data(), c.k_rstd.data(), bp.kn_g, rows_h, D);
      dq_p = dq_raw;
      dk_p = dk_raw;
    }
    // da = (through w_q) + ((through w_k) + (through w_v)), the CPU's order
    T* da_q = free_stream(dh, nullptr);
    T* da_k = free_stream(dh, da_q);
    ops->merge_heads(merged_g, dk_p, B, Tn, H, D);
    ops->linear_backward(da_k, grad_of_param(bp.w_k), nullptr, merged_g, c.a_ptr, bp.w_k, N, C, HD);
    ops->merge_heads(merged_g, dv_p, B, Tn, H, Dv);
    T* da_v = tmp.reserve(N * C);
    ops->linear_backward(da_v, grad_of_param(bp.w_v), nullptr, merged_g, c.a_ptr, bp.w_v, N, C,
                         HDv);
    ops->add(da_k, da_k, da_v, N * C);
    ops->merge_heads(merged_g, dq_p, B, Tn, H, D);
    ops->linear_backward(da_q, grad_of_param(bp.w_q), nullptr, merged_g, c.a_ptr, bp.w_q, N, C, HD);
    ops->add(da_q, da_q, da_k, N * C);
    // norm1, then the residual: dx = dh + norm1'(da)
    T* dx = norm_backward_into(da_k, da_q, c.x_in, c.mean1, c.rstd1, bp.ln1_g, bp.ln1_b);
    ops->add(dx, dh, dx, N * C);
    return dx;
  }

  double sum_squares(const T* x, std::size_t n) {
    double* out = sums.reserve(1);
    ops->sum_of_squares(out, sum_scratch.reserve(ops->sum_of_squares_scratch()), x, n);
    double host = 0;
    ops->download(&host, out, sizeof(double));
    return host;
  }

  template <class E>
  Tensor4<T> download_heads(const DeviceVec<T, E>& buf, std::size_t d) const {
    if (!has_forward) throw std::logic_error("DeviceTransformer: queries/keys before forward");
    Tensor4<T> out({B, H, Tn, d});
    ops->download(out.data(), buf.data(), out.size() * sizeof(T));
    return out;
  }

  DeviceOps<T>* ops;
  TransformerConfig config;
  std::size_t C = 0, H = 0, D = 0, Dv = 0, F = 0, V = 0;
  std::vector<std::string> names;
  std::vector<std::vector<std::size_t>> shapes;
  std::vector<std::size_t> offsets;
  std::size_t total = 0;
  Buf params, grads, pos_fixed;
  std::vector<T*> field_tables, field_grads;
  T *pos_table = nullptr, *pos_grad = nullptr, *lnf_g = nullptr, *lnf_b = nullptr,
    *head_w = nullptr;
  std::vector<BlockParams> blocks;
  std::vector<BlockCache> caches;
  // The last forward.
  std::size_t B = 0, Tn = 0, N = 0;
  AttentionSpec attention_spec;
  bool has_mask = false, has_forward = false, has_loss = false;
  DeviceVec<T, int> ids, targets;
  DeviceVec<T, unsigned char> mask;
  Buf x0, tmp, zf, zmean, zrstd, logits, dlogits, row_loss, loss_value;
  const T *z = nullptr, *block_out = nullptr;
  Buf d1, d2, d3, dq, dk, dv, dmerged, dout, dff1, dff2, dqn, dkn, wide, ds;
  DeviceVec<T, double> sum_scratch, sums;
};

template <class T>
DeviceTransformer<T>::DeviceTransformer(Transformer<T>& host, DeviceOps<T>& ops)
    : impl_(std::make_unique<Impl>(host, ops)) {}

template <class T>
DeviceTransformer<T>::~DeviceTransformer() = default;

template <class T>
const TransformerConfig& DeviceTransformer<T>::config() const {
  return impl_->config;
}

template <class T>
DeviceOps<T>& DeviceTransformer<T>::ops() const {
  return *impl_->ops;
}

template <class T>
void DeviceTransformer<T>::upload_parameters(const ParameterList<T>& params) {
  impl_->upload(params);
}

template <class T>
void DeviceTransformer<T>::download_parameters(const ParameterList<T>& params) const {
  impl_->check_list(params, "DeviceTransformer::download_parameters");
  for (std::size_t i = 0; i < params.size(); ++i) {
    impl_->ops->download(params[i].param->value.data(), impl_->params.data() + impl_->offsets[i],
                         params[i].param->value.size() * sizeof(T));
  }
}

template <class T>
void DeviceTransformer<T>::download_gradients(const ParameterList<T>& params) const {
  impl_->check_list(params, "DeviceTransformer::download_gradients");
  for (std::size_t i = 0; i < params.size(); ++i) {
    params[i].param->grad.resize(params[i].param->value.shape());
    impl_->ops->download(params[i].param->grad.data(), impl_->grads.data() + impl_->offsets[i],
                         params[i].param->grad.size() * sizeof(T));
  }
}

template <class T>
void DeviceTransformer<T>::forward(const std::vector<TokenIds>& fields, const KeyMask* key_mask) {
  impl_->forward(fields, key_mask);
}

template <class T>
Tensor3<T> DeviceTransformer<T>::logits() const {
  if (!impl_->has_forward)
    throw std::logic_error("DeviceTransformer::logits: called before forward");
  Tensor3<T> out({impl_->B, impl_->Tn, impl_->V});
  impl_->ops->download(out.data(), impl_->logits.data(), out.size() * sizeof(T));
  return out;
}

template <class T>
double DeviceTransformer<T>::loss(const TokenIds& targets) {
  return impl_->loss(targets);
}

template <class T>
void DeviceTransformer<T>::backward() {
  impl_->backward();
}

template <class T>
double DeviceTransformer<T>::grad_norm() {
  return std::sqrt(impl_->sum_squares(impl_->grads.data(), impl_->total));
}

template <class T>
double DeviceTransformer<T>::grad_norm(const std::string& name) {
  const std::size_t i = impl_->index_of(name);
  return std::sqrt(
      impl_->sum_squares(impl_->grads.data() + impl_->offsets[i], element_count(impl_->shapes[i])));
}

template <class T>
double DeviceTransformer<T>::clip_grad_norm(double max_norm) {
  check_arg(std::isfinite(max_norm) && max_norm > 0, "DeviceTransformer::clip_grad_norm",
            "max_norm", "a finite value > 0", std::to_string(max_norm));
  const double norm = grad_norm();
  if (!std::isfinite(norm) || norm <= max_norm) return norm;
  impl_->ops->scale(impl_->grads.data(), static_cast<T>(max_norm / (norm + kClipNormEps)),
                    impl_->total);
  return norm;
}

template <class T>
Tensor4<T> DeviceTransformer<T>::queries(std::size_t layer) const {
  return impl_->download_heads(impl_->caches.at(layer).q, impl_->D);
}

template <class T>
Tensor4<T> DeviceTransformer<T>::keys(std::size_t layer) const {
  return impl_->download_heads(impl_->caches.at(layer).k, impl_->D);
}

template <class T>
std::vector<double> DeviceTransformer<T>::head_scales(std::size_t layer) const {
  auto& c = impl_->caches.at(layer);
  const auto& bp = impl_->blocks.at(layer);
  std::vector<T> s(impl_->H);
  if (bp.log_scale) {  // the scales of the next forward, as MultiHeadAttention::head_scales
    impl_->ops->download(s.data(), bp.log_scale, s.size() * sizeof(T));
    for (auto& x : s) x = static_cast<T>(std::exp(static_cast<double>(x)));
  } else {
    impl_->ops->download(s.data(), c.scale.data(), s.size() * sizeof(T));
  }
  return std::vector<double>(s.begin(), s.end());
}

template <class T>
std::size_t DeviceTransformer<T>::parameter_count() const {
  return impl_->total;
}

template <class T>
const std::vector<std::string>& DeviceTransformer<T>::parameter_names() const {
  return impl_->names;
}

template <class T>
const std::vector<std::vector<std::size_t>>& DeviceTransformer<T>::parameter_shapes() const {
  return impl_->shapes;
}

template <class T>
const std::vector<std::size_t>& DeviceTransformer<T>::parameter_offsets() const {
  return impl_->offsets;
}

template <class T>
T* DeviceTransformer<T>::parameter_data() {
  return impl_->params.data();
}

template <class T>
T* DeviceTransformer<T>::gradient_data() {
  return impl_->grads.data();
}

// ---- DeviceOptimizer ------------------------------------------------------------------------

template <class T>
struct DeviceOptimizer<T>::Impl {
  Impl(DeviceTransformer<T>& m, std::string n, double lr_in, std::vector<std::string> slot_names)
      : model(&m), name(std::move(n)), lr(lr_in), slots(std::move(slot_names)) {
    for (std::size_t i = 0; i < slots.size(); ++i) {
      state.emplace_back(&m.ops());
      m.ops().zero(state.back().reserve(m.parameter_count()), m.parameter_count() * sizeof(T));
    }
  }
  DeviceTransformer<T>* model;
  std::string name;
  double lr;
  std::vector<std::string> slots;
  std::vector<DeviceVec<T, T>> state;  // one flat arena per slot
  std::size_t steps = 0;
  bool adamw = true;
  AdamWOptions adamw_options;
  SgdOptions sgd_options;
};

template <class T>
DeviceOptimizer<T>::DeviceOptimizer(DeviceTransformer<T>& model, const AdamWOptions& options) {
  validate(options);
  impl_ = std::make_unique<Impl>(model, "AdamW", options.lr,
                                 std::vector<std::string>{"exp_avg", "exp_avg_sq"});
  impl_->adamw_options = options;
}

template <class T>
DeviceOptimizer<T>::DeviceOptimizer(DeviceTransformer<T>& model, const SgdOptions& options) {
  validate(options);
  impl_ = std::make_unique<Impl>(model, "SGD", options.lr,
                                 options.momentum != 0 ? std::vector<std::string>{"momentum_buffer"}
                                                       : std::vector<std::string>{});
  impl_->adamw = false;
  impl_->sgd_options = options;
}

template <class T>
DeviceOptimizer<T>::~DeviceOptimizer() = default;

template <class T>
const std::string& DeviceOptimizer<T>::name() const {
  return impl_->name;
}

template <class T>
double DeviceOptimizer<T>::lr() const {
  return impl_->lr;
}

template <class T>
void DeviceOptimizer<T>::set_lr(double lr) {
  check_arg(std::isfinite(lr) && lr >= 0, impl_->name, "lr", "a finite value >= 0",
            std::to_string(lr));
  impl_->lr = lr;
}

template <class T>
void DeviceOptimizer<T>::step() {
  auto& m = *impl_->model;
  const std::size_t t = ++impl_->steps, n = m.parameter_count();
  if (impl_->adamw) {
    const auto& o = impl_->adamw_options;
    m.ops().adamw_update(
        m.parameter_data(), impl_->state[0].data(), impl_->state[1].data(), m.gradient_data(), n,
        cuda::adamw_scalars<T>(impl_->lr, o.beta1, o.beta2, o.eps, o.weight_decay, t));
  } else {
    const auto& o = impl_->sgd_options;
    m.ops().sgd_update(m.parameter_data(), impl_->state.empty() ? nullptr : impl_->state[0].data(),
                       m.gradient_data(), n, static_cast<T>(impl_->lr), static_cast<T>(o.momentum),
                       static_cast<T>(o.weight_decay), t == 1);
  }
}

template <class T>
std::size_t DeviceOptimizer<T>::step_count() const {
  return impl_->steps;
}

template <class T>
std::vector<NamedTensor<T>> DeviceOptimizer<T>::state_tensors() const {
  const auto& m = *impl_->model;
  std::vector<NamedTensor<T>> out;
  for (std::size_t i = 0; i < m.parameter_names().size(); ++i) {
    for (std::size_t s = 0; s < impl_->slots.size(); ++s) {
      xt::xarray<T> value = xt::xarray<T>::from_shape(m.parameter_shapes()[i]);
      m.ops().download(value.data(), impl_->state[s].data() + m.parameter_offsets()[i],
                       value.size() * sizeof(T));
      out.emplace_back(optim_state_name(m.parameter_names()[i], impl_->slots[s]), std::move(value));
    }
  }
  return out;
}

template <class T>
void DeviceOptimizer<T>::load_state(const std::vector<NamedTensor<T>>& tensors,
                                    std::size_t step_count) {
  const auto& m = *impl_->model;
  const std::string op = impl_->name + "::load_state";
  const std::size_t expected = m.parameter_names().size() * impl_->slots.size();
  // Where each expected tensor is in `tensors`; everything is checked before anything is copied.
  std::vector<const xt::xarray<T>*> found(expected, nullptr);
  for (const auto& [name, value] : tensors) {
    std::size_t k = expected;
    for (std::size_t i = 0; i < m.parameter_names().size() && k == expected; ++i)
      for (std::size_t s = 0; s < impl_->slots.size(); ++s)
        if (optim_state_name(m.parameter_names()[i], impl_->slots[s]) == name) {
          k = i * impl_->slots.size() + s;
          const auto& shape = m.parameter_shapes()[i];
          const std::vector<std::size_t> got(value.shape().begin(), value.shape().end());
          check_extents(op, "state tensor '" + name + "'", got,
                        std::vector<std::ptrdiff_t>(shape.begin(), shape.end()));
          break;
        }
    check_arg(k < expected, op, "state tensor '" + name + "'", "a state tensor of this optimizer",
              "an unknown name");
    check_arg(found[k] == nullptr, op, "state tensor '" + name + "'", "listed once", "a duplicate");
    found[k] = &value;
  }
  for (std::size_t k = 0; k < expected; ++k) {
    const std::size_t i = k / impl_->slots.size(), s = k % impl_->slots.size();
    check_arg(found[k] != nullptr, op,
              "state tensor '" + optim_state_name(m.parameter_names()[i], impl_->slots[s]) + "'",
              "present", "missing");
  }
  for (std::size_t k = 0; k < expected; ++k) {
    const std::size_t i = k / impl_->slots.size(), s = k % impl_->slots.size();
    m.ops().upload(impl_->state[s].data() + m.parameter_offsets()[i], found[k]->data(),
                   found[k]->size() * sizeof(T));
  }
  impl_->steps = step_count;
}

template class DeviceTransformer<float>;
template class DeviceTransformer<double>;
template class DeviceOptimizer<float>;
template class DeviceOptimizer<double>;

}  // namespace attnlab
