#include "attnlab/optim/clip.hpp"

#include <cmath>
#include <sstream>

#include "attnlab/tensor.hpp"

namespace attnlab {

template <class T>
double grad_norm(const ParameterList<T>& params) {
  double sum = 0;  // fixed order: parameters in list order, entries row-major
  for (const auto& np : params) {
    check_arg(np.param != nullptr, "grad_norm", "parameter '" + np.name + "'", "a Parameter",
              "a null pointer");
    const T* grad = np.param->grad.data();
    const std::size_t n = np.param->grad.size();
    for (std::size_t j = 0; j < n; ++j) {
      const double g = static_cast<double>(grad[j]);
      sum += g * g;
    }
  }
  return std::sqrt(sum);
}

template <class T>
double clip_grad_norm(const ParameterList<T>& params, double max_norm) {
  std::ostringstream got;
  got << max_norm;
  check_arg(std::isfinite(max_norm) && max_norm > 0, "clip_grad_norm", "max_norm",
            "a finite value > 0", got.str());
  const double norm = grad_norm(params);
  if (!std::isfinite(norm) || norm <= max_norm) return norm;
  const T scale = static_cast<T>(max_norm / (norm + kClipNormEps));
  for (const auto& np : params) {
    T* grad = np.param->grad.data();
    const std::size_t n = np.param->grad.size();
    for (std::size_t j = 0; j < n; ++j) grad[j] *= scale;
  }
  return norm;
}

template double grad_norm<float>(const ParameterList<float>&);
template double grad_norm<double>(const ParameterList<double>&);
template double clip_grad_norm<float>(const ParameterList<float>&, double);
template double clip_grad_norm<double>(const ParameterList<double>&, double);

}  // namespace attnlab
