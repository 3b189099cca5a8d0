// attnlab/distributed.hpp in one process: the shards of a batch, the single-process communicator,
// and allreduce_gradients' weighting and bucketing (the collectives themselves are proven under
// mpirun: tests/mpi).
#include <doctest/doctest.h>

#include <cmath>
#include <cstdint>

#include "attnlab/distributed.hpp"
#include "attnlab/nn/transformer.hpp"
#include "helpers.hpp"

using namespace attnlab;

TEST_CASE("shard_rows: contiguous shards that cover the batch once, sizes within one") {
  for (std::size_t batch : {1, 2, 7, 12, 32, 33}) {
    for (int size = 1; size <= 5; ++size) {
      if (batch < static_cast<std::size_t>(size)) {
        CHECK_THROWS_WITH_AS(
            shard_rows(batch, 0, size, "train: batch"),
            doctest::Contains("train: batch: expected at least one row per process"),
            std::invalid_argument);
        continue;
      }
      std::size_t next = 0, smallest = batch, largest = 0;
      for (int r = 0; r < size; ++r) {
        const Shard s = shard_rows(batch, r, size);
        CHECK(s.begin == next);
        next = s.end;
        smallest = std::min(smallest, s.size());
        largest = std::max(largest, s.size());
      }
      CHECK(next == batch);
      CHECK(largest - smallest <= 1);
      CHECK(smallest >= 1);
    }
  }
  CHECK_THROWS_AS(shard_rows(8, 2, 2), std::invalid_argument);
  CHECK_THROWS_AS(shard_rows(8, -1, 2), std::invalid_argument);
}

TEST_CASE("single-process communicator: rank 0 of 1, collectives leave the data as it is") {
  Communicator& c = single_process();
  CHECK(c.rank() == 0);
  CHECK(c.size() == 1);
  double d[2] = {1.5, -2};
  c.allreduce_sum(d, 2);
  c.allreduce_max(d, 2);
  CHECK(d[0] == 1.5);
  CHECK(d[1] == -2);
  CHECK(c.allgather(42) == std::vector<std::uint64_t>{42});
  // Not under an MPI launcher: init_distributed gives a single process too.
  if (!launched_by_mpi()) {
    int argc = 0;
    char** argv = nullptr;
    const auto w = init_distributed(&argc, &argv);
    CHECK(w->size() == 1);
    CHECK(w->name() == "single process");
  }
}

TEST_CASE("allreduce_gradients in one process scales by the weight, across bucket boundaries") {
  TransformerConfig cfg;
  cfg.vocab_sizes = {5};
  cfg.max_len = 4;
  cfg.block.attention.d_model = 8;
  cfg.block.attention.heads = 2;
  cfg.layers = 1;
  cfg.out_vocab = 3;
  Rng rng(1);
  Transformer<double> model(cfg, rng);
  auto params = model.parameters();
  std::vector<xt::xarray<double>> before;
  for (auto& p : params) {
    for (auto& g : p.param->grad) g = rng.normal();
    before.push_back(p.param->grad);
  }
  std::vector<double> staging;
  allreduce_gradients(single_process(), params, 1.0, staging);
  CHECK(staging.empty());  // weight 1 in one process: nothing to do, nothing allocated
  allreduce_gradients(single_process(), params, 0.25, staging, 7 * sizeof(double));
  CHECK(staging.size() == 7);  // one bucket's worth, reused
  for (std::size_t i = 0; i < params.size(); ++i) {
    CAPTURE(params[i].name);
    CHECK(test::rel_error(params[i].param->grad, 0.25 * before[i]) < 1e-15);
  }
  // The checksum sees any change of a value, and check_replicas is a no-op alone.
  const std::uint64_t h = parameter_checksum(params);
  params[0].param->value(0) = std::nextafter(params[0].param->value(0), 1e9);
  CHECK(parameter_checksum(params) != h);
  CHECK_NOTHROW(check_replicas(single_process(), params, 3));
}
