// The trainer's model (attnlab/train/model.hpp): a pre-norm, attention-only Transformer written on
// the functional core (sdpa_forward / sdpa_backward, blas::gemm).
//
//   x = Σ_f E_f[ids_f] (+ P[t])                         (B,T,C)   absent ids add nothing
//   per layer: h = norm(x); q,k,v = h W_q, h W_k, h W_v   (B,T,H·D) (B,T,H·D) (B,T,H·Dv)
//              x = x + merge(sdpa(q, k, v)) W_o            (B,T,H·Dv) x (H·Dv,C) -> (B,T,C)
//   logits = norm(x) W_head                              (B,T,C) x (C,V) -> (B,T,V)
//
// Initialisation: embeddings N(0, 1); every projection N(0, 1/fan_in), so that with the unit-RMS
// output of the norm q·k has variance ≈ d_k at step 0. Draw order: embeddings, then per layer W_q,
// W_k, W_v, W_o, then W_head: it depends on the shapes only, never on the scaling mode.
#include "attnlab/train/model.hpp"

#include <cmath>
#include <stdexcept>

#include "attnlab/blas.hpp"
#include "attnlab/ops/attention.hpp"

namespace attnlab::train {

namespace {

constexpr float kNormEps = 1e-5f;

xt::xarray<float> normal(std::vector<std::size_t> shape, Rng& rng, double std) {
  xt::xarray<float> a = xt::xarray<float>::from_shape(shape);
  for (auto& x : a) x = static_cast<float>(rng.normal() * std);
  return a;
}
xt::xarray<float> filled(std::vector<std::size_t> shape, float v) {
  xt::xarray<float> a = xt::xarray<float>::from_shape(shape);
  a.fill(v);
  return a;
}
Parameter<float> make(xt::xarray<float> value) {
  Parameter<float> p;
  p.grad = xt::zeros_like(value);
  p.value = std::move(value);
  return p;
}

// y (rows, n) = x (rows, k) W (k, n); assigns.
void matmul(float* y, const float* x, const float* w, std::size_t rows, std::size_t k,
            std::size_t n) {
  blas::gemm<float>(false, false, static_cast<int>(rows), static_cast<int>(n), static_cast<int>(k),
                    1.0f, x, static_cast<int>(k), w, static_cast<int>(n), 0.0f, y,
                    static_cast<int>(n));
}
// dx (rows, k) (+)= dy (rows, n) Wᵀ; dW (k, n) += xᵀ dy.
void matmul_backward(float* dx, float dx_beta, float* dw, const float* dy, const float* x,
                     const float* w, std::size_t rows, std::size_t k, std::size_t n) {
  if (dx)
    blas::gemm<float>(false, true, static_cast<int>(rows), static_cast<int>(k), static_cast<int>(n),
                      1.0f, dy, static_cast<int>(n), w, static_cast<int>(n), dx_beta, dx,
                      static_cast<int>(k));
  blas::gemm<float>(true, false, static_cast<int>(k), static_cast<int>(n), static_cast<int>(rows),
                    1.0f, x, static_cast<int>(k), dy, static_cast<int>(n), 1.0f, dw,
                    static_cast<int>(n));
}

bool all_finite(const float* p, std::size_t n) {
  for (std::size_t i = 0; i < n; ++i)
    if (!std::isfinite(p[i])) return false;
  return true;
}

}  // namespace

struct Model::Impl {
  ModelSpec spec;
  TaskShape shape;
  std::size_t C = 0, H = 0, D = 0, Dv = 0, L = 0, V = 0, T = 0;
  std::vector<Parameter<float>> embed;  // per field (vocab_f, C)
  Parameter<float> pos;                 // (T, C) when spec.positions
  struct Layer {
    Parameter<float> gamma, beta;         // (C,)
    Parameter<float> w_q, w_k, w_v, w_o;  // (C, H·D) (C, H·D) (C, H·Dv) (H·Dv, C)
    // caches of the last forward
    Tensor2<float> x_in, h, xhat;  // (B·T, C)
    std::vector<float> inv_std;    // (B·T,)
    Tensor4<float> q, k, v;        // (B,H,T,D) (B,H,T,D) (B,H,T,Dv)
    Tensor2<float> o_merged;       // (B·T, H·Dv)
    SdpaCache<float> attn;
  };
  std::vector<Layer> layers;
  Parameter<float> gamma_f, beta_f, head;  // (C,) (C,) (C, V)
  Tensor2<float> x_final, h_final, xhat_final;
  std::vector<float> inv_std_final;
  Batch batch;  // the last forward's input
  std::size_t B = 0;
  std::string nonfinite;

  SdpaOptions options() const {
    SdpaOptions o;
    o.scaling = spec.scaling;
    o.scale = spec.scale;
    o.causal = spec.causal;
    return o;
  }

  // h = norm(x) row by row; fills xhat and inv_std for the backward.
  void norm_forward(Tensor2<float>& h, Tensor2<float>& xhat, std::vector<float>& inv_std,
                    const Tensor2<float>& x, const Parameter<float>& gamma,
                    const Parameter<float>& beta) const {
    const std::size_t rows = x.shape()[0];
    h = Tensor2<float>::from_shape({rows, C});
    xhat = Tensor2<float>::from_shape({rows, C});
    inv_std.assign(rows, 1.0f);
    for (std::size_t r = 0; r < rows; ++r) {
      const float* xr = x.data() + r * C;
      float* xh = xhat.data() + r * C;
      float* hr = h.data() + r * C;
      if (spec.norm == NormKind::none) {
        std::copy_n(xr, C, xh);
        std::copy_n(xr, C, hr);
        continue;
      }
      double mean = 0, sq = 0;
      if (spec.norm == NormKind::layernorm) {
        for (std::size_t j = 0; j < C; ++j) mean += xr[j];
        mean /= static_cast<double>(C);
      }
      for (std::size_t j = 0; j < C; ++j) sq += (xr[j] - mean) * (xr[j] - mean);
      const float is = static_cast<float>(1.0 / std::sqrt(sq / static_cast<double>(C) + kNormEps));
      inv_std[r] = is;
      for (std::size_t j = 0; j < C; ++j) {
        xh[j] = static_cast<float>(xr[j] - mean) * is;
        hr[j] = xh[j] * gamma.value.data()[j] +
                (spec.norm == NormKind::layernorm ? beta.value.data()[j] : 0.0f);
      }
    }
  }

  // dx (+)= the gradient through the norm of dh; adds into gamma/beta grads.
  void norm_backward(float* dx, const Tensor2<float>& dh, const Tensor2<float>& xhat,
                     const std::vector<float>& inv_std, Parameter<float>& gamma,
                     Parameter<float>& beta) const {
    const std::size_t rows = dh.shape()[0];
    std::vector<float> g(C);
    for (std::size_t r = 0; r < rows; ++r) {
      const float* dy = dh.data() + r * C;
      float* dxr = dx + r * C;
      if (spec.norm == NormKind::none) {
        for (std::size_t j = 0; j < C; ++j) dxr[j] += dy[j];
        continue;
      }
      const float* xh = xhat.data() + r * C;
      double mean_g = 0, mean_gx = 0;
      for (std::size_t j = 0; j < C; ++j) {
        g[j] = dy[j] * gamma.value.data()[j];
        gamma.grad.data()[j] += dy[j] * xh[j];
        if (spec.norm == NormKind::layernorm) beta.grad.data()[j] += dy[j];
        mean_g += g[j];
        mean_gx += static_cast<double>(g[j]) * xh[j];
      }
      mean_g /= static_cast<double>(C);
      mean_gx /= static_cast<double>(C);
      if (spec.norm == NormKind::rmsnorm) mean_g = 0;
      for (std::size_t j = 0; j < C; ++j)
        dxr[j] += inv_std[r] * static_cast<float>(g[j] - mean_g - xh[j] * mean_gx);
    }
  }
};

Model::Model(const ModelSpec& spec, const TaskShape& shape, Rng& rng) : impl_(new Impl) {
  validate(spec);
  if (!spec.attn_only || spec.qk_norm || spec.learnable_scale)
    throw std::invalid_argument(
        "model: this build's trainer model is attention-only without QK-norm or a learnable "
        "scale (use --attn-only; the MLP, --qk-norm and --learnable-scale need the nn stack)");
  Impl& m = *impl_;
  m.spec = spec;
  m.shape = shape;
  m.C = static_cast<std::size_t>(spec.d_model);
  m.H = static_cast<std::size_t>(spec.heads);
  m.D = static_cast<std::size_t>(spec.d_k ? spec.d_k : spec.d_model / spec.heads);
  m.Dv = static_cast<std::size_t>(spec.d_v ? spec.d_v : spec.d_model / spec.heads);
  m.L = static_cast<std::size_t>(spec.layers);
  m.V = static_cast<std::size_t>(shape.output_vocab);
  m.T = static_cast<std::size_t>(shape.seq_len);
  for (int v : shape.field_vocab)
    m.embed.push_back(make(normal({static_cast<std::size_t>(v), m.C}, rng, 1.0)));
  if (spec.positions) m.pos = make(normal({m.T, m.C}, rng, 1.0));
  const double s_in = 1.0 / std::sqrt(static_cast<double>(m.C));
  const double s_o = 1.0 / std::sqrt(static_cast<double>(m.H * m.Dv));
  m.layers.resize(m.L);
  for (auto& l : m.layers) {
    l.gamma = make(filled({m.C}, 1.0f));
    l.beta = make(filled({m.C}, 0.0f));
    l.w_q = make(normal({m.C, m.H * m.D}, rng, s_in));
    l.w_k = make(normal({m.C, m.H * m.D}, rng, s_in));
    l.w_v = make(normal({m.C, m.H * m.Dv}, rng, s_in));
    l.w_o = make(normal({m.H * m.Dv, m.C}, rng, s_o));
  }
  m.gamma_f = make(filled({m.C}, 1.0f));
  m.beta_f = make(filled({m.C}, 0.0f));
  m.head = make(normal({m.C, m.V}, rng, s_in));
}

Model::~Model() = default;

Tensor3<float> Model::forward(const Batch& batch) {
  Impl& m = *impl_;
  check_arg(batch.fields.size() == m.embed.size(), "Model::forward", "fields",
            std::to_string(m.embed.size()), std::to_string(batch.fields.size()));
  const std::size_t B = batch.size(), T = batch.length(), C = m.C, H = m.H, D = m.D, Dv = m.Dv;
  check_arg(!m.spec.positions || T <= m.T, "Model::forward", "sequence length",
            "<= " + std::to_string(m.T), std::to_string(T));
  m.batch = batch;
  m.B = B;
  m.nonfinite.clear();
  const std::size_t N = B * T;
  Tensor2<float> x = Tensor2<float>::from_shape({N, C});
  x.fill(0.0f);
  for (std::size_t f = 0; f < m.embed.size(); ++f) {
    const auto vocab = m.embed[f].value.shape()[0];
    for (std::size_t i = 0; i < N; ++i) {
      const int id = batch.fields[f].data()[i];
      if (id == kAbsent) continue;
      check_arg(id >= 0 && static_cast<std::size_t>(id) < vocab, "Model::forward", "token id",
                "in [0, " + std::to_string(vocab) + ")", std::to_string(id));
      const float* e = m.embed[f].value.data() + static_cast<std::size_t>(id) * C;
      for (std::size_t j = 0; j < C; ++j) x.data()[i * C + j] += e[j];
    }
  }
  if (m.spec.positions)
    for (std::size_t i = 0; i < N; ++i)
      for (std::size_t j = 0; j < C; ++j)
        x.data()[i * C + j] += m.pos.value.data()[(i % T) * C + j];
  if (!all_finite(x.data(), x.size()) && m.nonfinite.empty()) m.nonfinite = "embedding";

  for (std::size_t li = 0; li < m.L; ++li) {
    auto& l = m.layers[li];
    l.x_in = x;
    m.norm_forward(l.h, l.xhat, l.inv_std, x, l.gamma, l.beta);
    std::vector<float> q(N * H * D), k(N * H * D), v(N * H * Dv);
    matmul(q.data(), l.h.data(), l.w_q.value.data(), N, C, H * D);  // (B·T,C) x (C,H·D)
    matmul(k.data(), l.h.data(), l.w_k.value.data(), N, C, H * D);
    matmul(v.data(), l.h.data(), l.w_v.value.data(), N, C, H * Dv);
    l.q = Tensor4<float>::from_shape({B, H, T, D});
    l.k = Tensor4<float>::from_shape({B, H, T, D});
    l.v = Tensor4<float>::from_shape({B, H, T, Dv});
    for (std::size_t b = 0; b < B; ++b)  // (B,T,H,D) -> (B,H,T,D)
      for (std::size_t t = 0; t < T; ++t)
        for (std::size_t h = 0; h < H; ++h) {
          std::copy_n(q.data() + ((b * T + t) * H + h) * D, D,
                      l.q.data() + ((b * H + h) * T + t) * D);
          std::copy_n(k.data() + ((b * T + t) * H + h) * D, D,
                      l.k.data() + ((b * H + h) * T + t) * D);
          std::copy_n(v.data() + ((b * T + t) * H + h) * Dv, Dv,
                      l.v.data() + ((b * H + h) * T + t) * Dv);
        }
    const Tensor4<float> o = sdpa_forward(l.attn, l.q, l.k, l.v, m.options());  // (B,H,T,Dv)
    l.o_merged = Tensor2<float>::from_shape({N, H * Dv});
    for (std::size_t b = 0; b < B; ++b)  // (B,H,T,Dv) -> (B,T,H·Dv)
      for (std::size_t h = 0; h < H; ++h)
        for (std::size_t t = 0; t < T; ++t)
          std::copy_n(o.data() + ((b * H + h) * T + t) * Dv, Dv,
                      l.o_merged.data() + (b * T + t) * H * Dv + h * Dv);
    // x = x + o W_o
    blas::gemm<float>(false, false, static_cast<int>(N), static_cast<int>(C),
                      static_cast<int>(H * Dv), 1.0f, l.o_merged.data(), static_cast<int>(H * Dv),
                      l.w_o.value.data(), static_cast<int>(C), 1.0f, x.data(), static_cast<int>(C));
    if (!all_finite(x.data(), x.size()) && m.nonfinite.empty())
      m.nonfinite = "blocks." + std::to_string(li) + ".attn";
  }
  m.x_final = x;
  m.norm_forward(m.h_final, m.xhat_final, m.inv_std_final, x, m.gamma_f, m.beta_f);
  Tensor3<float> logits = Tensor3<float>::from_shape({B, T, m.V});
  matmul(logits.data(), m.h_final.data(), m.head.value.data(), N, C, m.V);  // (B·T,C) x (C,V)
  if (!all_finite(logits.data(), logits.size()) && m.nonfinite.empty()) m.nonfinite = "head";
  return logits;
}

void Model::backward(const Tensor3<float>& dlogits) {
  Impl& m = *impl_;
  if (m.B == 0) throw std::logic_error("Model::backward called before forward");
  const std::size_t B = m.B, T = m.batch.length(), C = m.C, H = m.H, D = m.D, Dv = m.Dv;
  const std::size_t N = B * T;
  check_shape("Model::backward", "dlogits", dlogits,
              {static_cast<std::ptrdiff_t>(B), static_cast<std::ptrdiff_t>(T),
               static_cast<std::ptrdiff_t>(m.V)});
  // logits = h_final W_head
  Tensor2<float> dh = Tensor2<float>::from_shape({N, C});
  matmul_backward(dh.data(), 0.0f, m.head.grad.data(), dlogits.data(), m.h_final.data(),
                  m.head.value.data(), N, C, m.V);
  Tensor2<float> dx = Tensor2<float>::from_shape({N, C});
  dx.fill(0.0f);
  m.norm_backward(dx.data(), dh, m.xhat_final, m.inv_std_final, m.gamma_f, m.beta_f);
  for (std::size_t li = m.L; li-- > 0;) {
    auto& l = m.layers[li];
    // x_out = x_in + o W_o: dx passes through; do = dx W_oᵀ
    Tensor2<float> d_o = Tensor2<float>::from_shape({N, H * Dv});
    matmul_backward(d_o.data(), 0.0f, l.w_o.grad.data(), dx.data(), l.o_merged.data(),
                    l.w_o.value.data(), N, H * Dv, C);
    Tensor4<float> dout = Tensor4<float>::from_shape({B, H, T, Dv});
    for (std::size_t b = 0; b < B; ++b)
      for (std::size_t h = 0; h < H; ++h)
        for (std::size_t t = 0; t < T; ++t)
          std::copy_n(d_o.data() + (b * T + t) * H * Dv + h * Dv, Dv,
                      dout.data() + ((b * H + h) * T + t) * Dv);
    const SdpaGrads<float> g = sdpa_backward(dout, l.attn, l.q, l.k, l.v);
    std::vector<float> dq(N * H * D), dk(N * H * D), dv(N * H * Dv);
    for (std::size_t b = 0; b < B; ++b)  // (B,H,T,D) -> (B,T,H·D)
      for (std::size_t t = 0; t < T; ++t)
        for (std::size_t h = 0; h < H; ++h) {
          std::copy_n(g.dq.data() + ((b * H + h) * T + t) * D, D,
                      dq.data() + ((b * T + t) * H + h) * D);
          std::copy_n(g.dk.data() + ((b * H + h) * T + t) * D, D,
                      dk.data() + ((b * T + t) * H + h) * D);
          std::copy_n(g.dv.data() + ((b * H + h) * T + t) * Dv, Dv,
                      dv.data() + ((b * T + t) * H + h) * Dv);
        }
    Tensor2<float> dhl = Tensor2<float>::from_shape({N, C});
    matmul_backward(dhl.data(), 0.0f, l.w_q.grad.data(), dq.data(), l.h.data(), l.w_q.value.data(),
                    N, C, H * D);
    matmul_backward(dhl.data(), 1.0f, l.w_k.grad.data(), dk.data(), l.h.data(), l.w_k.value.data(),
                    N, C, H * D);
    matmul_backward(dhl.data(), 1.0f, l.w_v.grad.data(), dv.data(), l.h.data(), l.w_v.value.data(),
                    N, C, H * Dv);
    m.norm_backward(dx.data(), dhl, l.xhat, l.inv_std, l.gamma, l.beta);
  }
  // x = Σ_f E_f[ids] + P[t]
  for (std::size_t f = 0; f < m.embed.size(); ++f)
    for (std::size_t i = 0; i < N; ++i) {
      const int id = m.batch.fields[f].data()[i];
      if (id == kAbsent) continue;
      float* ge = m.embed[f].grad.data() + static_cast<std::size_t>(id) * C;
      for (std::size_t j = 0; j < C; ++j) ge[j] += dx.data()[i * C + j];
    }
  if (m.spec.positions)
    for (std::size_t i = 0; i < N; ++i)
      for (std::size_t j = 0; j < C; ++j)
        m.pos.grad.data()[(i % T) * C + j] += dx.data()[i * C + j];
}

ParameterList<float> Model::parameters() {
  Impl& m = *impl_;
  ParameterList<float> list;
  for (std::size_t f = 0; f < m.embed.size(); ++f)
    list.push_back({"embed.fields." + std::to_string(f), &m.embed[f]});
  if (m.spec.positions) list.push_back({"embed.pos", &m.pos});
  for (std::size_t li = 0; li < m.L; ++li) {
    auto& l = m.layers[li];
    const std::string p = "blocks." + std::to_string(li) + ".";
    if (m.spec.norm != NormKind::none) list.push_back({p + "norm1.gamma", &l.gamma});
    if (m.spec.norm == NormKind::layernorm) list.push_back({p + "norm1.beta", &l.beta});
    list.push_back({p + "attn.w_q", &l.w_q});
    list.push_back({p + "attn.w_k", &l.w_k});
    list.push_back({p + "attn.w_v", &l.w_v});
    list.push_back({p + "attn.w_o", &l.w_o});
  }
  if (m.spec.norm != NormKind::none) list.push_back({"norm_f.gamma", &m.gamma_f});
  if (m.spec.norm == NormKind::layernorm) list.push_back({"norm_f.beta", &m.beta_f});
  list.push_back({"head.weight", &m.head});
  return list;
}

void Model::zero_grad() {
  for (auto& p : parameters()) p.param->grad.fill(0.0f);
}

std::size_t Model::layers() const {
  return impl_->L;
}
std::size_t Model::heads() const {
  return impl_->H;
}

const Tensor4<float>& Model::attention_weights(std::size_t layer) const {
  return impl_->layers.at(layer).attn.p;
}

Tensor4<float> Model::attention_logits(std::size_t layer) const {
  const auto& l = impl_->layers.at(layer);
  return sdpa_scores(l.q, l.k, impl_->options());
}

Tensor4<float> Model::attention_dots(std::size_t layer) const {
  const auto& l = impl_->layers.at(layer);
  SdpaOptions raw = impl_->options();
  raw.scale.reset();
  raw.scaling = Scaling::none;
  return sdpa_scores(l.q, l.k, raw);
}

std::string Model::w_q_name(std::size_t layer) const {
  return "blocks." + std::to_string(layer) + ".attn.w_q";
}
std::string Model::w_k_name(std::size_t layer) const {
  return "blocks." + std::to_string(layer) + ".attn.w_k";
}
std::string Model::first_nonfinite_stage() const {
  return impl_->nonfinite;
}

}  // namespace attnlab::train
