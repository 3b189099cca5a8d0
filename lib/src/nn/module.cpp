#include "attnlab/nn/module.hpp"

#include <cstdint>
#include <cstring>
#include <type_traits>
#include <vector>

#include "../parallel_rows.hpp"
#include "attnlab/attention/dropout.hpp"

namespace attnlab {

template <class T>
bool all_finite_host(const T* x, std::size_t n) {
  // A value is not finite exactly when its exponent bits are all ones (inf and NaN).
  using Bits = std::conditional_t<sizeof(T) == 4, std::uint32_t, std::uint64_t>;
  constexpr Bits exponent =
      static_cast<Bits>(sizeof(T) == 4 ? 0x7f800000ull : 0x7ff0000000000000ull);
  std::vector<unsigned char> bad(detail::row_chunks(n, 1), 0);
  detail::for_chunks(n, bad.size(), [&](std::size_t i0, std::size_t i1, std::size_t c) {
    Bits any = 0;
    for (std::size_t i = i0; i < i1; ++i) {
      Bits bits;
      std::memcpy(&bits, x + i, sizeof bits);
      any |= static_cast<Bits>((bits & exponent) == exponent);
    }
    bad[c] = any != 0;
  });
  for (unsigned char b : bad)
    if (b) return false;
  return true;
}

template bool all_finite_host<float>(const float*, std::size_t);
template bool all_finite_host<double>(const double*, std::size_t);

void throw_wrong_backend(std::string_view op, std::string_view arg, const DeviceMemory& expected,
                         const DeviceMemory* actual) {
  std::string message(op);
  message.append(": ").append(arg).append(" expected on backend '").append(expected.name());
  message.append("', got '").append(actual ? actual->name() : std::string("none")).append("'");
  throw std::invalid_argument(message);
}

template <class T>
void Module<T>::zero_grad() {
  DeviceOps<T>& backend = ops();
  for (auto& np : parameters()) backend.zero(np.param->grad_data(), np.param->size() * sizeof(T));
}

template <class T>
void Module<T>::set_backend(DeviceOps<T>* backend) {
  ops_ = backend;
  arena_values_ = Buffer<T>();
  arena_grads_ = Buffer<T>();
  reset_cache();
  for_each_child([backend](Module<T>& child) { child.set_backend(backend); });
}

template <class T>
void Module<T>::train(bool on) {
  training_ = on;
  for_each_child([on](Module<T>& child) { child.train(on); });
}

template <class T>
std::uint32_t Module<T>::key_tree(std::uint64_t seed, std::uint64_t step, std::uint32_t index) {
  dropout_seed_ = seed;
  dropout_step_ = step;
  dropout_index_ = index++;
  for_each_child([&](Module<T>& child) { index = child.key_tree(seed, step, index); });
  return index;
}

template <class T>
void Module<T>::set_dropout_key(std::uint64_t seed, std::uint64_t step) {
  key_tree(seed, step, 0);
}

template <class T>
std::uint64_t Module<T>::next_dropout_key() {
  return attention::dropout_key(dropout_seed_, dropout_step_++, dropout_index_);
}

template <class T>
void Module<T>::to(DeviceOps<T>& target) {
  if (&ops() == &target) return;
  ParameterList<T> params = parameters();
  copy_to_host(true);  // values and grads back into the xarrays, from wherever they are
  for (auto& np : params) {
    np.param->device_value = Buffer<T>();
    np.param->device_grad = Buffer<T>();
  }
  set_backend(&target);
  if (target.host_memory()) return;
  std::size_t total = 0;
  for (const auto& np : params) total += np.param->size();
  arena_values_ = Buffer<T>(target, {total});
  arena_grads_ = Buffer<T>(target, {total});
  std::size_t offset = 0;
  for (auto& np : params) {
    Parameter<T>& p = *np.param;
    const std::vector<std::size_t> shape(p.value.shape().begin(), p.value.shape().end());
    p.device_value = Buffer<T>::view(arena_values_, offset, shape);
    p.device_grad = Buffer<T>::view(arena_grads_, offset, shape);
    if (p.size() > 0) {
      target.upload(p.device_value.data(), p.value.data(), p.size() * sizeof(T));
      target.upload(p.device_grad.data(), p.grad.data(), p.size() * sizeof(T));
    }
    offset += p.size();
  }
}

template <class T>
void Module<T>::copy_to_host(bool grads) {
  for (auto& np : parameters()) {
    Parameter<T>& p = *np.param;
    if (!p.on_device()) continue;
    p.device_value.copy_to_host(p.value.data());
    if (grads) {
      p.grad.resize(p.value.shape());
      p.device_grad.copy_to_host(p.grad.data());
    }
  }
}

template <class T>
void Module<T>::copy_to_device() {
  for (auto& np : parameters()) {
    Parameter<T>& p = *np.param;
    if (!p.on_device()) continue;
    check_extents(
        "Module::copy_to_device", "parameter '" + np.name + "'",
        std::vector<std::size_t>(p.value.shape().begin(), p.value.shape().end()),
        std::vector<std::ptrdiff_t>(p.device_value.shape().begin(), p.device_value.shape().end()));
    ops().upload(p.device_value.data(), p.value.data(), p.size() * sizeof(T));
  }
}

template class Module<float>;
template class Module<double>;

}  // namespace attnlab
