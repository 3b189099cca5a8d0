// The data-parallel collectives under a real MPI job: run by tests/mpi/run_mpi_tests.sh as
// `mpirun -np 2 attnlab_mpi_tests`. Every rank runs every case in the same order (the collectives
// pair up). With one process the cases cannot say anything, so main exits 77 (ctest: skipped).
//   - allreduce_gradients: a Transformer<double>'s gradient from two unequal shards with unequal
//     labelled counts equals the whole batch's to 1e-12, in one bucket and in many small ones;
//   - 50 AdamW steps sharded across the ranks follow the single-process losses and weights to
//     1e-12 (double);
//   - device gradients (the emulated CUDA device) are staged through the host;
//   - check_replicas passes on equal replicas and names the drifted rank and the step.
#define DOCTEST_CONFIG_IMPLEMENT
#include <doctest/doctest.h>

#include <cstdint>
#include <cstdio>
#include <memory>

#include "attnlab/backends/emulated.hpp"
#include "attnlab/blas.hpp"
#include "attnlab/distributed.hpp"
#include "attnlab/nn/transformer.hpp"
#include "attnlab/ops/cross_entropy.hpp"
#include "attnlab/optim/adamw.hpp"
#include "attnlab/random.hpp"
#include "attnlab/threads.hpp"
#include "helpers.hpp"

using namespace attnlab;

namespace {

Communicator* g_comm = nullptr;

TransformerConfig tiny_config() {
  TransformerConfig c;
  c.vocab_sizes = {7};
  c.max_len = 6;
  c.block.attention.d_model = 8;
  c.block.attention.heads = 2;
  c.block.attention.sdpa.causal = true;
  c.block.d_ff = 12;
  c.layers = 2;
  c.out_vocab = 5;
  return c;
}

// A global batch of 7 rows (shards of 3 and 4 on two ranks) whose rows have unequal labelled
// counts, so the ranks' loss weights differ.
struct GlobalBatch {
  TokenIds ids, targets;
};
GlobalBatch make_batch(std::uint64_t seed) {
  Rng rng(seed);
  GlobalBatch g{TokenIds({7, 6}), TokenIds({7, 6})};
  for (auto& x : g.ids) x = static_cast<int>(rng.below(7));
  for (std::size_t b = 0; b < 7; ++b)
    for (std::size_t t = 0; t < 6; ++t)
      g.targets(b, t) = (t + b) % 3 == 0 && b < 4 ? kIgnoreIndex : static_cast<int>(rng.below(5));
  return g;
}

TokenIds rows_of(const TokenIds& x, const Shard& s) {
  TokenIds out({s.size(), x.shape()[1]});
  std::copy(x.data() + s.begin * x.shape()[1], x.data() + s.end * x.shape()[1], out.data());
  return out;
}

std::size_t labelled(const TokenIds& t) {
  return static_cast<std::size_t>(
      std::count_if(t.begin(), t.end(), [](int v) { return v != kIgnoreIndex; }));
}

// One step's loss and gradient: the whole batch on `whole`, this rank's shard on `part` followed by
// allreduce_gradients. Returns {whole loss, global loss from the shards}.
std::pair<double, double> both_gradients(Transformer<double>& whole, Transformer<double>& part,
                                         const GlobalBatch& g, std::vector<double>& staging,
                                         std::size_t bucket_bytes) {
  Communicator& comm = *g_comm;
  whole.zero_grad();
  const auto full = softmax_cross_entropy<double, 3>(whole.forward({g.ids}), g.targets);
  whole.backward(full.dlogits);

  const Shard s = shard_rows(g.ids.shape()[0], comm.rank(), comm.size());
  const TokenIds ids = rows_of(g.ids, s), targets = rows_of(g.targets, s);
  part.zero_grad();
  const auto mine = softmax_cross_entropy<double, 3>(part.forward({ids}), targets);
  part.backward(mine.dlogits);
  const double weight =
      static_cast<double>(labelled(targets)) / static_cast<double>(labelled(g.targets));
  allreduce_gradients(comm, part.parameters(), weight, staging, bucket_bytes);
  double loss = mine.loss * weight;
  comm.allreduce_sum(&loss, 1);
  return {full.loss, loss};
}

}  // namespace

TEST_CASE("mpi: sharded gradients summed by allreduce_gradients equal the whole batch's (double)") {
  for (std::size_t bucket : {std::size_t(8) << 20, std::size_t(200)}) {  // one bucket; many
    CAPTURE(bucket);
    Rng r1(3), r2(3);
    Transformer<double> whole(tiny_config(), r1), part(tiny_config(), r2);
    std::vector<double> staging;
    const auto [full, sharded] = both_gradients(whole, part, make_batch(11), staging, bucket);
    CHECK(std::abs(full - sharded) <= 1e-12 * std::abs(full));
    const auto pw = whole.parameters(), pp = part.parameters();
    for (std::size_t i = 0; i < pw.size(); ++i) {
      CAPTURE(pw[i].name);
      CHECK(test::rel_error(pw[i].param->grad, pp[i].param->grad) <= 1e-12);
    }
    CHECK(staging.size() == std::min<std::size_t>(bucket / sizeof(double), staging.size()));
  }
}

TEST_CASE("mpi: 50 sharded AdamW steps follow the single-process losses and weights (double)") {
  Rng r1(5), r2(5);
  Transformer<double> whole(tiny_config(), r1), part(tiny_config(), r2);
  const AdamWOptions o{3e-3, 0.9, 0.99, 1e-8, 0.1};
  AdamW<double> opt_whole(whole.parameters(), o), opt_part(part.parameters(), o);
  std::vector<double> staging;
  double worst = 0;
  for (int step = 0; step < 50; ++step) {
    const auto [full, sharded] =
        both_gradients(whole, part, make_batch(100 + step), staging, 8u << 20);
    worst = std::max(worst, std::abs(full - sharded) / std::abs(full));
    opt_whole.step();
    opt_part.step();
  }
  MESSAGE("worst relative loss difference over 50 steps: " << worst);
  CHECK(worst <= 1e-12);
  const auto pw = whole.parameters(), pp = part.parameters();
  for (std::size_t i = 0; i < pw.size(); ++i) {
    CAPTURE(pw[i].name);
    CHECK(test::rel_error(pw[i].param->value, pp[i].param->value) <= 1e-12);
  }
  check_replicas(*g_comm, part.parameters(), 50);  // the replicas agree bit for bit
}

TEST_CASE("mpi: gradients on a device backend are staged through the host") {
  Communicator& comm = *g_comm;
  const auto ops = emulated::make_device_ops<double>();
  const int n = comm.size(), r = comm.rank();
  // Two parameters whose gradients are rank-dependent: grad[i] = (r + 1) · (i + 1).
  std::vector<Parameter<double>> store(2);
  ParameterList<double> params;
  for (std::size_t k = 0; k < store.size(); ++k) {
    const std::size_t size = 5 + 3 * k;
    xt::xarray<double> value = xt::zeros<double>({size}), grad = xt::zeros<double>({size});
    for (std::size_t i = 0; i < size; ++i) grad(i) = (r + 1) * static_cast<double>(i + 1);
    store[k] = Parameter<double>(value, grad);
    store[k].device_value = Buffer<double>::from_host(*ops, value.data(), {size});
    store[k].device_grad = Buffer<double>::from_host(*ops, grad.data(), {size});
    store[k].grad.fill(-1);  // the host copy must not be what is summed
    params.push_back({"p" + std::to_string(k), &store[k]});
  }
  std::vector<double> staging;
  allreduce_gradients(comm, params, 0.5, staging, 4 * sizeof(double));  // buckets split parameters
  const double rank_sum = n * (n + 1) / 2.0;                            // Σ (r + 1)
  for (auto& p : params) {
    xt::xarray<double> back = xt::zeros<double>({p.param->size()});
    ops->download(back.data(), p.param->device_grad.data(), back.size() * sizeof(double));
    for (std::size_t i = 0; i < back.size(); ++i)
      CHECK(back(i) == 0.5 * rank_sum * static_cast<double>(i + 1));
    CHECK(p.param->grad(0) == -1);  // untouched
  }
}

TEST_CASE("mpi: check_replicas passes on equal replicas and names the rank that drifted") {
  Communicator& comm = *g_comm;
  Rng rng(9);
  Transformer<double> model(tiny_config(), rng);
  CHECK_NOTHROW(check_replicas(comm, model.parameters(), 7));
  auto params = model.parameters();
  if (comm.rank() == comm.size() - 1) params.back().param->value(0) += 1e-15;  // one ulp-ish
  try {
    check_replicas(comm, params, 42);
    FAIL("check_replicas did not throw");
  } catch (const ReplicaMismatch& e) {
    CHECK(e.rank() == comm.size() - 1);
    CHECK(e.step() == 42);
    const std::string what = e.what();
    CHECK(what.find("rank " + std::to_string(comm.size() - 1)) != std::string::npos);
    CHECK(what.find("step 42") != std::string::npos);
  }
}

int main(int argc, char** argv) {
  blas::init_process(argv);
  set_num_threads(1);
  const auto comm = init_distributed(&argc, &argv);
  if (comm->size() < 2) {
    std::printf("attnlab_mpi_tests: needs an MPI launch with >= 2 processes (got %d): skipped\n",
                comm->size());
    return 77;
  }
  g_comm = comm.get();
  doctest::Context context(argc, argv);
  if (comm->rank() != 0) context.setOption("out", "/dev/null");  // one report, rank 0's
  const int failed = context.run();
  // A failure on any rank fails the job.
  double any = failed != 0 ? 1.0 : 0.0;
  comm->allreduce_max(&any, 1);
  return any > 0 ? 1 : 0;
}
