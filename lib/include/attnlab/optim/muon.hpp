// Muon: momentum on each weight matrix, its update orthogonalised by a few Newton–Schulz
// iterations (Keller Jordan, "Muon: An optimizer for hidden layers in neural networks", 2024; the
// reference code is KellerJordan/Muon's muon.py, the optimiser of modded-nanogpt and of nanochat's
// MuonAdamW).
//
// Per step t, for each matrix parameter W with grad G (stored (In, Out) as attnlab's Linear stores
// it: fan_in rows, fan_out columns):
//   M  = lerp(M, G, 1 − momentum)                          the momentum buffer (slot "momentum")
//   U  = lerp(G, M, momentum)  (nesterov)   or   U = M    (not nesterov)
//   X  = U / (‖U‖_F + eps)                                  eps 1e-7: every singular value <= 1
//   repeat ns_steps times, on the wide orientation (A the smaller Gram matrix):
//     A = X Xᵀ,  B = b A + c A A,  X = a X + B X           (a, b, c) = (3.4445, −4.7750, 2.0315)
//   W  = W · (1 − decay) − lr · scale · X
// with decay = lr · weight_decay (decoupled, muon.py's) or (lr / lr₀) · weight_decay (independent,
// WeightDecayMode; lr₀ = Optimizer::base_lr(), the lr it was built with unless set), and the
// update scale
//   spectral:  √max(1, fan_out / fan_in)      muon.py's max(1, size(-2) / size(-1))^0.5 on torch's
//                                              (Out, In) weight: the default;
//   rms:       0.2 · √max(fan_out, fan_in)    Liu et al., "Muon is Scalable for LLM Training"
//                                              (Moonshot AI, 2025): the update's RMS matches
//                                              AdamW's, so AdamW's lr and weight decay carry over.
// The iteration maps each singular value σ of U/‖U‖_F to φ⁵(σ), φ(x) = a x + b x³ + c x⁵, which
// lands in about [0.7, 1.2] for σ not much smaller than 1/a⁵ (muon_band() computes it). The
// reference runs it in bf16; attnlab runs it in T through the backend's GEMM (BLAS or oneDNN on
// the CPU, cuBLAS on a GPU), three GEMMs per iteration.
//
// Only matrices: every parameter must have rank 2 (std::invalid_argument naming it otherwise).
// Route embeddings, the head, norms, biases and scales to AdamW (attnlab/optim/param_groups.hpp).
#pragma once

#include <array>
#include <string_view>

#include "attnlab/buffer.hpp"
#include "attnlab/optim/optimizer.hpp"

namespace attnlab {

enum class MuonScale { spectral, rms };

template <>
struct EnumTable<MuonScale> {
  static constexpr EnumEntry<MuonScale> entries[] = {
      {MuonScale::spectral, "spectral", "sqrt(max(1, fan_out/fan_in)), muon.py's"},
      {MuonScale::rms, "rms", "0.2 sqrt(max(fan_in, fan_out)), matching AdamW's update RMS"},
  };
  static constexpr EnumParseText parse = {"Muon", "scale", NameList::pipes, false};
};

// The names of EnumTable<MuonScale>; std::invalid_argument naming Muon's scale otherwise.
inline std::string_view to_string(MuonScale v) {
  return enum_name(v);
}
inline MuonScale parse_muon_scale(std::string_view text) {
  return parse_enum<MuonScale>(text);
}

struct MuonOptions {
  double lr = 0.02;        // finite, >= 0 (muon.py's default)
  double momentum = 0.95;  // in [0, 1)
  bool nesterov = true;
  int ns_steps = 5;         // >= 1
  double weight_decay = 0;  // finite, >= 0
  WeightDecayMode decay = WeightDecayMode::decoupled;
  MuonScale scale = MuonScale::spectral;
  double eps = 1e-7;  // finite, > 0: X = U / (‖U‖_F + eps)
  std::array<double, 3> coefficients{3.4445, -4.7750, 2.0315};  // (a, b, c), finite
  DecayParams decay_params = DecayParams::all;  // all matrices anyway: all and matrices agree
};

// Throws std::invalid_argument "Muon: <field> expected ..., got ..." for a bad field.
void validate(const MuonOptions& options);

// The update scale of a (fan_in, fan_out) matrix under `scale` (above).
double muon_update_scale(MuonScale scale, std::size_t fan_in, std::size_t fan_out);

// φ applied `steps` times to x: where the iteration takes a singular value x of U / ‖U‖_F.
double muon_singular_value_map(double x, const std::array<double, 3>& coefficients, int steps);

template <class T>
class Muon final : public Optimizer<T> {
 public:
  // State: slot "momentum" per parameter.
  Muon(ParameterList<T> params, const MuonOptions& options);
  const MuonOptions& options() const { return options_; }

 private:
  bool per_parameter() const override { return true; }
  void update_matrix(DeviceOps<T>& ops, const std::vector<std::size_t>& shape, T* value,
                     const T* grad, T* const* state, std::size_t t, bool decay) override;
  // Never called (per_parameter); defined to complete the interface.
  void update(DeviceOps<T>& ops, T* value, const T* grad, T* const* state, std::size_t n,
              std::size_t t, bool decay) override;

  MuonOptions options_;
  std::size_t momentum_slot_ = 0;
  // Scratch on the parameters' backend, sized for the largest matrix: the update X and the next
  // iterate, the Gram matrix A and B, Σ x² and its partial sums.
  DeviceMemory* scratch_on_ = nullptr;
  Buffer<T> x_, next_, gram_, poly_;
  Buffer<double> norm_, partial_;
};

extern template class Muon<float>;
extern template class Muon<double>;

}  // namespace attnlab
