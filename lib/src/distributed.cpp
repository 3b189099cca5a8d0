#include "attnlab/distributed.hpp"

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "attnlab/device_ops.hpp"

#ifdef ATTNLAB_WITH_MPI
#include <mpi.h>
#endif

namespace attnlab {

namespace {

// Stateless: single_process() and init_distributed's own instance behave alike.
class SingleProcess final : public Communicator {
 public:
  int rank() const override { return 0; }
  int size() const override { return 1; }
  std::string name() const override { return "single process"; }
  void allreduce_sum(float*, std::size_t) override {}
  void allreduce_sum(double*, std::size_t) override {}
  void allreduce_max(double*, std::size_t) override {}
  std::vector<std::uint64_t> allgather(std::uint64_t value) override { return {value}; }
  [[noreturn]] void abort(int code) override { std::_Exit(code); }
};

#ifdef ATTNLAB_WITH_MPI
void mpi_check(int rc, const char* call) {
  if (rc == MPI_SUCCESS) return;
  char text[MPI_MAX_ERROR_STRING];
  int len = 0;
  MPI_Error_string(rc, text, &len);
  throw std::runtime_error(std::string(call) + ": " +
                           std::string(text, static_cast<std::size_t>(len)));
}

// MPI_COMM_WORLD; finalises MPI when destroyed. Counts are split into int-sized pieces.
class MpiWorld final : public Communicator {
 public:
  MpiWorld(int* argc, char*** argv) {
    int provided = 0;
    mpi_check(MPI_Init_thread(argc, argv, MPI_THREAD_FUNNELED, &provided), "MPI_Init_thread");
    MPI_Comm_rank(MPI_COMM_WORLD, &rank_);
    MPI_Comm_size(MPI_COMM_WORLD, &size_);
    char version[MPI_MAX_LIBRARY_VERSION_STRING];
    int len = 0;
    MPI_Get_library_version(version, &len);
    std::string v(version, static_cast<std::size_t>(len));
    v = v.substr(0, std::min(v.find(','), v.find('\n')));  // "Open MPI v4.1.4"
    name_ = "MPI (" + v + "), " + std::to_string(size_) + " processes";
  }
  ~MpiWorld() override {
    int finalized = 0;
    MPI_Finalized(&finalized);
    if (!finalized) MPI_Finalize();
  }
  int rank() const override { return rank_; }
  int size() const override { return size_; }
  std::string name() const override { return name_; }
  void allreduce_sum(float* data, std::size_t n) override { reduce(data, n, MPI_FLOAT, MPI_SUM); }
  void allreduce_sum(double* data, std::size_t n) override { reduce(data, n, MPI_DOUBLE, MPI_SUM); }
  void allreduce_max(double* data, std::size_t n) override { reduce(data, n, MPI_DOUBLE, MPI_MAX); }
  std::vector<std::uint64_t> allgather(std::uint64_t value) override {
    std::vector<std::uint64_t> all(static_cast<std::size_t>(size_));
    mpi_check(MPI_Allgather(&value, 1, MPI_UINT64_T, all.data(), 1, MPI_UINT64_T, MPI_COMM_WORLD),
              "MPI_Allgather");
    return all;
  }
  [[noreturn]] void abort(int code) override {
    MPI_Abort(MPI_COMM_WORLD, code);
    std::_Exit(code);  // MPI_Abort does not return; if it did, end this process anyway
  }

 private:
  template <class E>
  void reduce(E* data, std::size_t n, MPI_Datatype type, MPI_Op op) {
    constexpr std::size_t kMaxCount = 1u << 30;
    for (std::size_t at = 0; at < n; at += kMaxCount) {
      const int count = static_cast<int>(std::min(kMaxCount, n - at));
      mpi_check(MPI_Allreduce(MPI_IN_PLACE, data + at, count, type, op, MPI_COMM_WORLD),
                "MPI_Allreduce");
    }
  }
  int rank_ = 0, size_ = 1;
  std::string name_;
};
#endif

// FNV-1a, 64-bit.
std::uint64_t fnv1a(std::uint64_t h, const unsigned char* p, std::size_t n) {
  for (std::size_t i = 0; i < n; ++i) {
    h ^= p[i];
    h *= 0x100000001b3ULL;
  }
  return h;
}

}  // namespace

Communicator& single_process() {
  static SingleProcess instance;
  return instance;
}

bool mpi_built() {
#ifdef ATTNLAB_WITH_MPI
  return true;
#else
  return false;
#endif
}

bool launched_by_mpi() {
  for (const char* v : {"OMPI_COMM_WORLD_SIZE", "PMIX_RANK", "PMI_RANK", "PMI_SIZE"})
    if (std::getenv(v) != nullptr) return true;
  return false;
}

std::unique_ptr<Communicator> init_distributed([[maybe_unused]] int* argc,
                                               [[maybe_unused]] char*** argv) {
#ifdef ATTNLAB_WITH_MPI
  if (launched_by_mpi()) return std::make_unique<MpiWorld>(argc, argv);
#endif
  return std::make_unique<SingleProcess>();
}

Shard shard_rows(std::size_t batch, int rank, int size, const std::string& what) {
  if (size < 1 || rank < 0 || rank >= size)
    throw std::invalid_argument("shard_rows: expected 0 <= rank < size, got rank " +
                                std::to_string(rank) + " of " + std::to_string(size));
  const auto n = static_cast<std::size_t>(size), r = static_cast<std::size_t>(rank);
  if (batch < n)
    throw std::invalid_argument(
        what + ": expected at least one row per process (>= " + std::to_string(n) + " for " +
        std::to_string(n) + " processes), got " + std::to_string(batch));
  return {batch * r / n, batch * (r + 1) / n};
}

double labelled_share(std::size_t labelled, std::size_t rows, std::size_t total_labelled,
                      std::size_t total_rows) {
  if (total_labelled > 0)
    return static_cast<double>(labelled) / static_cast<double>(total_labelled);
  return total_rows > 0 ? static_cast<double>(rows) / static_cast<double>(total_rows) : 0.0;
}

template <class T>
void allreduce_gradients(Communicator& comm, const ParameterList<T>& params, double weight,
                         std::vector<T>& staging, std::size_t bucket_bytes) {
  if (comm.size() == 1 && weight == 1.0) return;
  std::size_t total = 0;
  for (const auto& p : params) total += p.param->size();
  const std::size_t bucket = std::min(total, std::max<std::size_t>(bucket_bytes / sizeof(T), 1));
  if (staging.size() < bucket) staging.resize(bucket);
  const T w = static_cast<T>(weight);
  // The gradients as one flat sequence in the parameter order: `count` values from (param, offset)
  // on, handed to fn(parameter, first value, values, staging slot); returns where it stopped.
  struct Cursor {
    std::size_t param = 0, offset = 0;
  };
  const auto walk = [&](Cursor at, std::size_t count, auto&& fn) {
    for (std::size_t done = 0; done < count;) {  // an empty parameter is stepped over
      Parameter<T>& p = *params[at.param].param;
      const std::size_t n = std::min(p.size() - at.offset, count - done);
      if (n > 0) fn(p, at.offset, n, staging.data() + done);
      done += n;
      at.offset += n;
      if (at.offset == p.size()) {
        ++at.param;
        at.offset = 0;
      }
    }
    return at;
  };
  const auto copy_in = [&](Parameter<T>& p, std::size_t from, std::size_t n, T* dst) {
    if (p.on_device())
      p.device_grad.memory()->download(dst, p.device_grad.data() + from, n * sizeof(T));
    else
      std::memcpy(dst, p.grad.data() + from, n * sizeof(T));
    if (w != T(1))
      for (std::size_t i = 0; i < n; ++i) dst[i] *= w;
  };
  const auto copy_out = [](Parameter<T>& p, std::size_t from, std::size_t n, const T* src) {
    if (p.on_device())
      p.device_grad.memory()->upload(p.device_grad.data() + from, src, n * sizeof(T));
    else
      std::memcpy(p.grad.data() + from, src, n * sizeof(T));
  };
  Cursor at;
  for (std::size_t done = 0; done < total;) {  // a bucket at a time
    const std::size_t count = std::min(bucket, total - done);
    const Cursor next = walk(at, count, copy_in);
    comm.allreduce_sum(staging.data(), count);
    walk(at, count, copy_out);
    at = next;
    done += count;
  }
}

template <class T>
std::uint64_t parameter_checksum(const ParameterList<T>& params) {
  std::uint64_t h = 0xcbf29ce484222325ULL;
  for (const auto& p : params)
    h = fnv1a(h, reinterpret_cast<const unsigned char*>(p.param->value.data()),
              p.param->value.size() * sizeof(T));
  return h;
}

template <class T>
void check_replicas(Communicator& comm, const ParameterList<T>& params, std::size_t step) {
  if (comm.size() == 1) return;
  const std::vector<std::uint64_t> all = comm.allgather(parameter_checksum(params));
  for (std::size_t r = 1; r < all.size(); ++r)
    if (all[r] != all[0]) {
      char hex[64];
      std::snprintf(hex, sizeof hex, "%016llx, rank 0's %016llx",
                    static_cast<unsigned long long>(all[r]),
                    static_cast<unsigned long long>(all[0]));
      throw ReplicaMismatch(static_cast<int>(r), step,
                            "check_replicas: the parameters of rank " + std::to_string(r) +
                                " differ from rank 0's at step " + std::to_string(step) +
                                " (checksum " + hex + "): the replicas drifted apart");
    }
}

template void allreduce_gradients<float>(Communicator&, const ParameterList<float>&, double,
                                         std::vector<float>&, std::size_t);
template void allreduce_gradients<double>(Communicator&, const ParameterList<double>&, double,
                                          std::vector<double>&, std::size_t);
template std::uint64_t parameter_checksum<float>(const ParameterList<float>&);
template std::uint64_t parameter_checksum<double>(const ParameterList<double>&);
template void check_replicas<float>(Communicator&, const ParameterList<float>&, std::size_t);
template void check_replicas<double>(Communicator&, const ParameterList<double>&, std::size_t);

}  // namespace attnlab
