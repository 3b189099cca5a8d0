#include "attnlab/nn/gradcheck_module.hpp"

#include <vector>

#include "attnlab/random.hpp"

namespace attnlab {

namespace {

double projection(const Tensor3<double>& y, const Tensor3<double>& r) {
  double l = 0;
  for (std::size_t i = 0; i < y.size(); ++i) l += y.data()[i] * r.data()[i];
  return l;
}

// Checks every named parameter of `module` against `loss`, with the analytic grads as they are.
void check_parameters(Module<double>& module, const std::function<double()>& loss, double eps,
                      GradcheckReport& report) {
  auto params = module.parameters();
  // Snapshot the analytic grads: the numeric pass must not depend on what the grads hold.
  std::vector<xt::xarray<double>> analytic;
  analytic.reserve(params.size());
  for (auto& p : params) analytic.push_back(p.param->grad);
  for (std::size_t i = 0; i < params.size(); ++i) {
    auto& value = params[i].param->value;
    const GradcheckTensor t{params[i].name, value.data(), analytic[i].data(),
                            std::vector<std::size_t>(value.shape().begin(), value.shape().end())};
    auto part = check_gradients({t}, loss, eps);
    report.results.push_back(std::move(part.results.front()));
  }
}

}  // namespace

GradcheckReport check_module_gradients(Module<double>& module, const Tensor3<double>& x,
                                       const SequenceFunction& forward,
                                       const SequenceFunction& backward,
                                       const ModuleGradcheckOptions& options) {
  Tensor3<double> input = x;  // perturbed in place by the input check
  module.zero_grad();
  const Tensor3<double> y = forward(input);
  Rng rng(options.seed);
  const Tensor3<double> r = randn<double, 3>({y.shape()[0], y.shape()[1], y.shape()[2]}, rng);
  const Tensor3<double> dx = backward(r);
  check_shape(
      "check_module_gradients", "dx", dx,
      {std::ptrdiff_t(x.shape()[0]), std::ptrdiff_t(x.shape()[1]), std::ptrdiff_t(x.shape()[2])});
  const auto loss = [&] { return projection(forward(input), r); };
  GradcheckReport report;
  if (options.check_input) {
    report = check_gradients(
        {{"x", input.data(), dx.data(), {x.shape()[0], x.shape()[1], x.shape()[2]}}}, loss,
        options.eps);
  }
  check_parameters(module, loss, options.eps, report);
  return report;
}

GradcheckReport check_module_gradients(SequenceModule<double>& module, const Tensor3<double>& x,
                                       const ModuleGradcheckOptions& options) {
  return check_module_gradients(
      module, x, [&](const Tensor3<double>& in) { return module.forward(in); },
      [&](const Tensor3<double>& dy) { return module.backward(dy); }, options);
}

GradcheckReport check_parameter_gradients(Module<double>& module,
                                          const std::function<double(bool)>& loss, double eps) {
  module.zero_grad();
  loss(true);
  GradcheckReport report;
  check_parameters(
      module, [&] { return loss(false); }, eps, report);
  return report;
}

}  // namespace attnlab
