// The saturation sweep at initialisation reproduces the seed's argument with the study's real
// initialisation: Var(q·k) ≈ d_k; unscaled attention saturates as d_k grows, 1/√d_k keeps it flat,
// and 1/d_k drifts towards uniform attention.
#include <doctest/doctest.h>

#include "attnlab/app/saturation.hpp"

using namespace attnlab;
using namespace attnlab::app;

TEST_CASE(
    "saturation sweep: Var(q.k) ~ d_k, and entropy falls unscaled, stays flat under sqrt_dk") {
  SaturationConfig c;
  c.d_k = {4, 64, 1024};
  c.batch = 4;
  c.keys = 32;
  const auto rows = saturation_sweep(c);
  REQUIRE(rows.size() == 9);
  auto at = [&](std::size_t d, Scaling m) {
    for (const auto& r : rows)
      if (r.d_k == d && r.mode == m) return r;
    FAIL("missing row");
    return SaturationRow{};
  };
  for (const auto& r : rows) CHECK(r.qk_var_ratio == doctest::Approx(1.0).epsilon(0.3));
  // Unscaled: entropy collapses and rows saturate as d_k grows; the Jacobian vanishes with them.
  CHECK(at(1024, Scaling::none).entropy_ratio < 0.2);
  CHECK(at(1024, Scaling::none).saturated > 0.5);
  CHECK(at(1024, Scaling::none).jacobian_norm < 0.5 * at(4, Scaling::none).jacobian_norm);
  // sqrt_dk: flat in d_k (within 10%), nothing saturated.
  CHECK(at(1024, Scaling::sqrt_dk).entropy_ratio ==
        doctest::Approx(at(4, Scaling::sqrt_dk).entropy_ratio).epsilon(0.1));
  CHECK(at(1024, Scaling::sqrt_dk).saturated == 0.0);
  // dk: logits shrink like 1/sqrt(d_k), so attention tends to uniform.
  CHECK(at(1024, Scaling::dk).entropy_ratio > 0.99);
}
