// The one translation unit that compiles the CUDA kernel sources for the emulated device.
#include "attnlab/backends/emulated.hpp"

#include <stdexcept>

#include "emulated_device_ops.hpp"

namespace attnlab::emulated {

template class EmulatedDeviceOps<float>;
template class EmulatedDeviceOps<double>;

template <class T>
std::unique_ptr<DeviceOps<T>> make_device_ops() {
  return std::make_unique<EmulatedDeviceOps<T>>();
}

template <class T>
std::size_t live_allocations(const DeviceOps<T>& ops) {
  const auto* emulated = dynamic_cast<const EmulatedDeviceOps<T>*>(&ops);
  if (emulated == nullptr) {
    throw std::invalid_argument(
        "emulated::live_allocations: ops expected an emulated device, got " + ops.name());
  }
  return emulated->live_allocations();
}

template std::unique_ptr<DeviceOps<float>> make_device_ops<float>();
template std::unique_ptr<DeviceOps<double>> make_device_ops<double>();
template std::size_t live_allocations<float>(const DeviceOps<float>&);
template std::size_t live_allocations<double>(const DeviceOps<double>&);

}  // namespace attnlab::emulated
