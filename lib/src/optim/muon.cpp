#include "attnlab/optim/muon.hpp"

#include <algorithm>
#include <cmath>
#include <sstream>

#include "attnlab/tensor.hpp"
#include "option_checks.hpp"

namespace attnlab {

void validate(const MuonOptions& o) {
  option_checks::finite_non_negative("Muon", "lr", o.lr);
  option_checks::below_one("Muon", "momentum", o.momentum);
  check_arg(o.ns_steps >= 1, "Muon", "ns_steps", "an integer >= 1", std::to_string(o.ns_steps));
  option_checks::finite_non_negative("Muon", "weight_decay", o.weight_decay);
  option_checks::finite_positive("Muon", "eps", o.eps);
  for (const double c : o.coefficients) {
    check_arg(std::isfinite(c), "Muon", "coefficients", "finite values", number_text(c));
  }
}

double muon_update_scale(MuonScale scale, std::size_t fan_in, std::size_t fan_out) {
  const double in = static_cast<double>(fan_in), out = static_cast<double>(fan_out);
  if (scale == MuonScale::rms) return 0.2 * std::sqrt(std::max(in, out));
  return std::sqrt(std::max(1.0, out / in));
}

double muon_singular_value_map(double x, const std::array<double, 3>& k, int steps) {
  for (int i = 0; i < steps; ++i) {
    const double x2 = x * x;
    x = k[0] * x + k[1] * x2 * x + k[2] * x2 * x2 * x;
  }
  return x;
}

template <class T>
Muon<T>::Muon(ParameterList<T> params, const MuonOptions& options)
    : Optimizer<T>("Muon", std::move(params), options.lr, options.decay_params), options_(options) {
  validate(options_);
  for (std::size_t i = 0; i < this->parameters().size(); ++i) {
    const auto& shape = this->shape(i);
    std::ostringstream got;
    got << "rank " << shape.size();
    check_arg(shape.size() == 2, "Muon", "parameter '" + this->parameters()[i].name + "'",
              "a matrix (rank 2; route the others to AdamW)", got.str());
  }
  momentum_slot_ = this->add_slot("momentum");
}

template <class T>
void Muon<T>::update(DeviceOps<T>&, T*, const T*, T* const*, std::size_t, std::size_t, bool) {
  throw std::logic_error("Muon::update: Muon updates a matrix at a time (update_matrix)");
}

template <class T>
void Muon<T>::update_matrix(DeviceOps<T>& ops, const std::vector<std::size_t>& shape, T* value,
                            const T* grad, T* const* state, std::size_t, bool decay) {
  const std::size_t r = shape[0], c = shape[1], n = r * c;
  if (n == 0) return;
  if (scratch_on_ != &ops) {  // first step, or the parameters moved: scratch for the largest matrix
    std::size_t most = 0, gram = 0;
    for (std::size_t i = 0; i < this->parameters().size(); ++i) {
      const auto& s = this->shape(i);
      most = std::max(most, s[0] * s[1]);
      gram = std::max(gram, std::min(s[0], s[1]) * std::min(s[0], s[1]));
    }
    x_ = Buffer<T>(ops, {most});
    next_ = Buffer<T>(ops, {most});
    gram_ = Buffer<T>(ops, {gram});
    poly_ = Buffer<T>(ops, {gram});
    norm_ = Buffer<double>(ops, {1});
    partial_ = Buffer<double>(ops, {std::max<std::size_t>(ops.sum_of_squares_scratch(), 1)});
    scratch_on_ = &ops;
  }
  // Scalars formed in double, as muon.py forms them in Python, then used in T.
  const double beta = options_.momentum;
  T* x = x_.data();
  T* next = next_.data();
  T* a_mat = gram_.data();
  T* b_mat = poly_.data();
  ops.muon_momentum(x, state[momentum_slot_], grad, n, static_cast<T>(beta),
                    static_cast<T>(1 - beta), options_.nesterov);
  ops.sum_of_squares(norm_.data(), partial_.data(), x, n);
  ops.divide_by_norm(x, norm_.data(), n, static_cast<T>(options_.eps));
  const T ka = static_cast<T>(options_.coefficients[0]);
  const T kb = static_cast<T>(options_.coefficients[1]);
  const T kc = static_cast<T>(options_.coefficients[2]);
  const bool wide = r <= c;  // X (r, c): the Gram matrix is X Xᵀ (r, r) when wide, Xᵀ X (c, c) else
  const std::size_t s = wide ? r : c;
  for (int i = 0; i < options_.ns_steps; ++i) {
    if (wide) {
      ops.gemm(false, true, r, r, c, T(1), x, c, x, c, T(0), a_mat, r);  // A = X Xᵀ
    } else {
      ops.gemm(true, false, c, c, r, T(1), x, c, x, c, T(0), a_mat, c);  // A = Xᵀ X
    }
    ops.copy(b_mat, a_mat, s * s * sizeof(T));
    ops.gemm(false, false, s, s, s, kc, a_mat, s, a_mat, s, kb, b_mat, s);  // B = b A + c A A
    ops.copy(next, x, n * sizeof(T));
    if (wide) {
      ops.gemm(false, false, r, c, r, T(1), b_mat, r, x, c, ka, next, c);  // X = a X + B X
    } else {
      // Transposed: on Y = Xᵀ the step is a Y + B Y, that is a X + X Bᵀ = a X + X B (B symmetric).
      ops.gemm(false, false, r, c, c, T(1), x, c, b_mat, c, ka, next, c);
    }
    std::swap(x, next);
  }
  const double lr = this->lr();
  const double keep =  // the weight decay's multiplier, 1 − lr·λ (decoupled) or 1 − (lr/lr₀)·λ
      decay ? decay_factor(options_.decay, lr, this->base_lr(), options_.weight_decay) : 1.0;
  const double step = lr * muon_update_scale(options_.scale, r, c);
  ops.axpby(value, x, n, static_cast<T>(keep), static_cast<T>(-step));
}

template class Muon<float>;
template class Muon<double>;

}  // namespace attnlab
