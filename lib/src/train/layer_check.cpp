#include "attnlab/train/layer_check.hpp"

#include <stdexcept>

#include "attnlab/ops/attention.hpp"
#include "attnlab/random.hpp"

namespace attnlab::train {

const std::vector<std::string>& checkable_layers() {
  static const std::vector<std::string> layers = {"attention"};
  return layers;
}

GradcheckReport check_layer(const std::string& layer, const ModelSpec& spec, int batch, int seq,
                            std::uint64_t seed) {
  validate(spec);
  const std::size_t B = static_cast<std::size_t>(batch), T = static_cast<std::size_t>(seq);
  const std::size_t H = static_cast<std::size_t>(spec.heads);
  const std::size_t D = static_cast<std::size_t>(spec.d_k ? spec.d_k : spec.d_model / spec.heads);
  const std::size_t Dv = static_cast<std::size_t>(spec.d_v ? spec.d_v : spec.d_model / spec.heads);
  Rng rng(seed);
  if (layer == "attention") {
    auto q = randn<double, 4>({B, H, T, D}, rng);
    auto k = randn<double, 4>({B, H, T, D}, rng);
    auto v = randn<double, 4>({B, H, T, Dv}, rng);
    const auto r = randn<double, 4>({B, H, T, Dv}, rng);
    SdpaOptions o;
    o.scaling = spec.scaling;
    o.scale = spec.scale;
    o.causal = spec.causal;
    auto loss = [&] {
      SdpaCache<double> c;
      const auto out = sdpa_forward(c, q, k, v, o);
      double l = 0;
      for (std::size_t i = 0; i < out.size(); ++i) l += out.data()[i] * r.data()[i];
      return l;
    };
    SdpaCache<double> cache;
    sdpa_forward(cache, q, k, v, o);
    const auto g = sdpa_backward(r, cache, q, k, v);
    return check_gradients({{"q", q.data(), g.dq.data(), {B, H, T, D}},
                            {"k", k.data(), g.dk.data(), {B, H, T, D}},
                            {"v", v.data(), g.dv.data(), {B, H, T, Dv}}},
                           loss);
  }
  throw std::invalid_argument("gradcheck: layer expected one of the checkable layers, got '" +
                              layer + "'");
}

}  // namespace attnlab::train
