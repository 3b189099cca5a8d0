// Data-parallel training across processes: a communicator, and the two collectives a training loop
// needs (the gradient allreduce and the replica check).
//
// Each process (rank) holds the whole model and computes the gradient of its share of the global
// batch. allreduce_gradients then sums the ranks' gradients, each first scaled by its share of the
// global loss's normaliser, so that every rank holds the gradient of the global batch's loss and
// every rank's optimizer takes the same step. check_replicas compares a checksum of the parameters
// across the ranks and names the first rank that drifted.
//
// The transport is Open MPI (or any MPI) when attnlab is built with it (ATTNLAB_MPI, mpi_built()),
// and the processes were started by an MPI launcher (mpirun, srun): init_distributed() then returns
// the world communicator. Otherwise it returns the single-process communicator, whose collectives
// do nothing, so the same loop runs unchanged. NCCL would be a third implementation of the same
// interface (device pointers, a stream); it is not built (examples/README.md, "More than one
// machine").
//
// Collectives are blocking and must be called by every rank in the same order. Host memory only: a
// device backend's gradients are staged through the host (allreduce_gradients does it).
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include "attnlab/nn/parameter.hpp"

namespace attnlab {

class Communicator {
 public:
  virtual ~Communicator() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;
  // "single process", "MPI (Open MPI v4.1.4), 2 processes".
  virtual std::string name() const = 0;
  // In place: data[i] becomes the sum over the ranks of their data[i].
  virtual void allreduce_sum(float* data, std::size_t n) = 0;
  virtual void allreduce_sum(double* data, std::size_t n) = 0;
  // In place: the maximum over the ranks.
  virtual void allreduce_max(double* data, std::size_t n) = 0;
  // Every rank's value, in rank order.
  virtual std::vector<std::uint64_t> allgather(std::uint64_t value) = 0;
  // Ends every process of the job with `code` (MPI_Abort): for an application whose rank failed
  // while the others may wait in a collective. The library itself never calls it.
  [[noreturn]] virtual void abort(int code) = 0;
};

// The communicator of a process that trains alone: rank 0 of 1; the collectives are no-ops.
Communicator& single_process();

// True when attnlab was built with MPI support (ATTNLAB_MPI).
bool mpi_built();
// True when this process was started by an MPI launcher (Open MPI's mpirun, or a PMI/PMIx
// launcher such as srun): read from the launcher's environment variables, before any MPI call.
bool launched_by_mpi();

// The process's communicator. With MPI support and an MPI launch: initialises MPI (thread level
// FUNNELED) and returns the world communicator, which finalises MPI when destroyed; otherwise a
// handle to single_process(). Call once per process, from main. Throws std::runtime_error when
// MPI's initialisation fails.
std::unique_ptr<Communicator> init_distributed(int* argc, char*** argv);

// The rows [begin, end) of a global batch of `batch` rows that rank `rank` of `size` takes:
// contiguous, by global sample index, sizes differing by at most one. std::invalid_argument naming
// `what` (e.g. "train: batch") when batch < size (a rank would have no rows).
struct Shard {
  std::size_t begin = 0, end = 0;
  std::size_t size() const { return end - begin; }
};
Shard shard_rows(std::size_t batch, int rank, int size, const std::string& what = "batch");

// The weight of one piece of a batch (a rank's shard, a micro-batch of gradient accumulation, or
// both) whose gradient is that of its own mean loss, such that the weighted sum over the pieces is
// the gradient of the whole batch's mean loss (mean over its labelled positions): the piece's
// labelled positions over the batch's, labelled / total_labelled; when the batch has none (every
// gradient is then 0), its rows' share, rows / total_rows (0 when total_rows is 0).
double labelled_share(std::size_t labelled, std::size_t rows, std::size_t total_labelled,
                      std::size_t total_rows);

// Sums the gradients of `params` over the ranks, in place, after scaling this rank's by `weight`.
// With weight = (this rank's labelled positions) / (the global batch's), and each rank's gradient
// that of its shard's mean loss, every rank ends with the gradient of the global batch's mean loss.
// Buckets of at most bucket_bytes are summed with one allreduce each, in the parameter order;
// `staging` is the host buffer (kept by the caller across steps, so no step allocates). Device
// gradients (Parameter::on_device) are downloaded into it and uploaded back.
template <class T>
void allreduce_gradients(Communicator& comm, const ParameterList<T>& params, double weight,
                         std::vector<T>& staging, std::size_t bucket_bytes = 8u << 20);

// A 64-bit FNV-1a hash of the parameters' values in order (host copy: bring a device model's host
// copy up to date first).
template <class T>
std::uint64_t parameter_checksum(const ParameterList<T>& params);

// Thrown by check_replicas on every rank.
class ReplicaMismatch : public std::runtime_error {
 public:
  ReplicaMismatch(int rank, std::size_t step, const std::string& what)
      : std::runtime_error(what), rank_(rank), step_(step) {}
  int rank() const { return rank_; }
  std::size_t step() const { return step_; }

 private:
  int rank_;
  std::size_t step_;
};

// Compares every rank's parameter_checksum with rank 0's. On a mismatch, every rank throws
// ReplicaMismatch naming the first rank that differs and `step`.
template <class T>
void check_replicas(Communicator& comm, const ParameterList<T>& params, std::size_t step);

extern template void allreduce_gradients<float>(Communicator&, const ParameterList<float>&, double,
                                                std::vector<float>&, std::size_t);
extern template void allreduce_gradients<double>(Communicator&, const ParameterList<double>&,
                                                 double, std::vector<double>&, std::size_t);
extern template std::uint64_t parameter_checksum<float>(const ParameterList<float>&);
extern template std::uint64_t parameter_checksum<double>(const ParameterList<double>&);
extern template void check_replicas<float>(Communicator&, const ParameterList<float>&, std::size_t);
extern template void check_replicas<double>(Communicator&, const ParameterList<double>&,
                                            std::size_t);

}  // namespace attnlab
