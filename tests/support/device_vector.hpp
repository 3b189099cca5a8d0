// Device memory for the device-op tests (tests/backends/test_device_ops*.cpp): a vector of E in a
// backend's memory, NaN-filled when made empty so that an element an op never wrote shows, and
// inputs rounded to T so that the double CPU reference sees exactly the device's inputs.
#pragma once

#include <array>
#include <cstring>
#include <vector>

#include "attnlab/device_ops.hpp"
#include "attnlab/random.hpp"
#include "attnlab/tensor.hpp"

namespace attnlab::test {

// `n` elements of E in the memory of `ops`, released on destruction.
template <class E, class T>
class DeviceVector {
 public:
  // Filled with NaN (E floating) or 0xFF bytes.
  DeviceVector(DeviceOps<T>& ops, std::size_t n) : ops_(ops), n_(n) {
    data_ = static_cast<E*>(ops_.allocate(n * sizeof(E)));
    std::vector<E> poison(n);
    std::memset(poison.data(), 0xFF, n * sizeof(E));
    ops_.upload(data_, poison.data(), n * sizeof(E));
  }
  DeviceVector(DeviceOps<T>& ops, const std::vector<E>& host) : ops_(ops), n_(host.size()) {
    data_ = static_cast<E*>(ops_.allocate(n_ * sizeof(E)));
    ops_.upload(data_, host.data(), n_ * sizeof(E));
  }
  ~DeviceVector() { ops_.release(data_); }
  DeviceVector(const DeviceVector&) = delete;
  DeviceVector& operator=(const DeviceVector&) = delete;

  E* get() const { return data_; }
  std::vector<E> host() const {
    std::vector<E> h(n_);
    ops_.download(h.data(), data_, n_ * sizeof(E));
    return h;
  }

 private:
  DeviceOps<T>& ops_;
  std::size_t n_;
  E* data_ = nullptr;
};

// x rounded to T (in place), and its values as T.
template <class T, class Tensor>
std::vector<T> rounded(Tensor& x) {
  for (auto& v : x) v = static_cast<double>(static_cast<T>(v));
  return std::vector<T>(x.begin(), x.end());
}

template <class T, std::size_t N>
Tensor<double, N> random_rounded(const std::array<std::size_t, N>& shape, Rng& rng,
                                 double std = 1.0) {
  auto x = randn<double, N>(shape, rng, std);
  rounded<T>(x);
  return x;
}

template <class T, class Tensor>
std::vector<T> values(const Tensor& x) {
  return std::vector<T>(x.begin(), x.end());
}

}  // namespace attnlab::test
