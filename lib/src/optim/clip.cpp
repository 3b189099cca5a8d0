#include "attnlab/optim/clip.hpp"

#include <cmath>
#include <sstream>

#include <algorithm>
#include <vector>

#include "attnlab/backends/cpu.hpp"
#include "attnlab/buffer.hpp"
#include "attnlab/tensor.hpp"

namespace attnlab {

namespace {
// The backend of a parameter: its Module's (cpu_ops when it lives in the host xarrays).
template <class T>
DeviceOps<T>& backend_of(const Parameter<T>& p) {
  if (!p.on_device()) return cpu_ops<T>();
  return *dynamic_cast<DeviceOps<T>*>(p.device_value.memory());
}
}  // namespace

template <class T>
double grad_norm(const ParameterList<T>& params) {
  // Σ g² per parameter in double on its backend (entries in row-major order), then over the
  // parameters in list order.
  double sum = 0;
  std::vector<double> partial;
  for (const auto& np : params) {
    check_arg(np.param != nullptr, "grad_norm", "parameter '" + np.name + "'", "a Parameter",
              "a null pointer");
    DeviceOps<T>& ops = backend_of(*np.param);
    if (np.param->size() == 0) continue;
    Buffer<double> out(ops, {1}),
        scratch(ops, {std::max<std::size_t>(ops.sum_of_squares_scratch(), 1)});
    ops.sum_of_squares(out.data(), scratch.data(), np.param->grad_data(), np.param->size());
    double host = 0;
    out.copy_to_host(&host);
    sum += host;
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
    backend_of(*np.param).scale(np.param->grad_data(), scale, np.param->size());
  }
  return norm;
}

template double grad_norm<float>(const ParameterList<float>&);
template double grad_norm<double>(const ParameterList<double>&);
template double clip_grad_norm<float>(const ParameterList<float>&, double);
template double clip_grad_norm<double>(const ParameterList<double>&, double);

}  // namespace attnlab
