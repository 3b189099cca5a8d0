// Public entry points reject wrong ranks and shapes with ShapeError (and other bad arguments with
// std::invalid_argument), naming the op and the argument: one table row per bad call.
#include <doctest/doctest.h>

#include <functional>
#include <limits>
#include <stdexcept>
#include <string>
#include <vector>

#include <xtensor/xarray.hpp>
#include <xtensor/xbuilder.hpp>

#include "attnlab/ops/attention.hpp"
#include "attnlab/ops/softmax.hpp"
#include "attnlab/tensor.hpp"

using namespace attnlab;

namespace {

struct BadCall {
  std::string what;
  std::function<void()> call;
  std::string expected;  // the start of the message: "op: argument expected"
};

template <class Error>
void check_table(const std::vector<BadCall>& table) {
  for (const auto& row : table) {
    CAPTURE(row.what);
    try {
      row.call();
      FAIL("no exception for: " << row.what);
    } catch (const Error& e) {
      const std::string message = e.what();
      CAPTURE(message);
      CHECK(message.rfind(row.expected, 0) == 0);
    }
  }
}

template <class T>
Tensor4<T> zeros4(std::size_t a, std::size_t b, std::size_t c, std::size_t d) {
  return xt::zeros<T>({a, b, c, d});
}

}  // namespace

TEST_CASE_TEMPLATE("hardening: sdpa_forward and sdpa_scores reject every wrong shape", T, float,
                   double) {
  // q (B,H,Tq,D) = (2,4,5,16), k (2,4,7,16), v (2,4,7,8)
  const auto q = zeros4<T>(2, 4, 5, 16);
  const auto k = zeros4<T>(2, 4, 7, 16);
  const auto v = zeros4<T>(2, 4, 7, 8);
  const xt::xarray<T> qa = q, ka = k, va = v;
  const KeyMask mask3 = xt::ones<bool>({2, 3});
  const KeyMask mask_b = xt::ones<bool>({1, 7});
  SdpaOptions three_heads;
  three_heads.head_scale = {1.0, 1.0, 1.0};
  SdpaCache<T> c;
  const std::vector<BadCall> shape_errors = {
      {"k batch", [&] { sdpa_forward(c, q, zeros4<T>(3, 4, 7, 16), v); },
       "sdpa_forward: k expected"},
      {"k and v heads differ", [&] { sdpa_forward(c, q, zeros4<T>(2, 2, 7, 16), v); },
       "sdpa_forward: v expected (2, 2, 7, *), got (2, 4, 7, 8)"},
      {"k head dim", [&] { sdpa_forward(c, q, zeros4<T>(2, 4, 7, 15), v); },
       "sdpa_forward: k expected (2, 4, *, 16), got (2, 4, 7, 15)"},
      {"v batch", [&] { sdpa_forward(c, q, k, zeros4<T>(1, 4, 7, 8)); },
       "sdpa_forward: v expected"},
      {"v heads", [&] { sdpa_forward(c, q, k, zeros4<T>(2, 5, 7, 8)); },
       "sdpa_forward: v expected"},
      {"v keys", [&] { sdpa_forward(c, q, k, zeros4<T>(2, 4, 8, 8)); },
       "sdpa_forward: v expected (2, 4, 7, *), got (2, 4, 8, 8)"},
      {"mask keys", [&] { sdpa_forward(c, q, k, v, SdpaOptions{}, &mask3); },
       "sdpa_forward: key_mask expected (2, 7), got (2, 3)"},
      {"mask batch", [&] { sdpa_forward(c, q, k, v, SdpaOptions{}, &mask_b); },
       "sdpa_forward: key_mask expected (2, 7), got (1, 7)"},
      {"head_scale length", [&] { sdpa_forward(c, q, k, v, three_heads); },
       "sdpa_forward: head_scale expected (4,), got (3,)"},
      {"rank-3 q (xarray)",
       [&] {
         sdpa_forward<T>(c, xt::xarray<T>(xt::zeros<T>({2, 5, 16})), ka, va);
       },
       "sdpa_forward: q expected (*, *, *, *), got (2, 5, 16)"},
      {"rank-5 k (xarray)",
       [&] {
         sdpa_forward<T>(c, qa, xt::xarray<T>(xt::zeros<T>({1, 2, 4, 7, 16})), va);
       },
       "sdpa_forward: k expected (*, *, *, *), got (1, 2, 4, 7, 16)"},
      {"rank-2 v (xarray)",
       [&] {
         sdpa_forward<T>(c, qa, ka, xt::xarray<T>(xt::zeros<T>({7, 8})));
       },
       "sdpa_forward: v expected (*, *, *, *), got (7, 8)"},
      {"scores: k head dim", [&] { sdpa_scores(q, zeros4<T>(2, 4, 7, 4)); },
       "sdpa_scores: k expected (2, 4, *, 16), got (2, 4, 7, 4)"},
      {"scores: mask", [&] { sdpa_scores(q, k, SdpaOptions{}, &mask3); },
       "sdpa_scores: key_mask expected (2, 7), got (2, 3)"},
  };
  check_table<ShapeError>(shape_errors);

  SdpaOptions negative, zero_head;
  negative.scale = -1.0;
  zero_head.head_scale = {1.0, 0.0, 1.0, 1.0};
  const std::vector<BadCall> argument_errors = {
      {"negative explicit scale", [&] { sdpa_forward(c, q, k, v, negative); },
       "sdpa_forward: scale expected a finite scale > 0"},
      {"k heads not dividing q heads",
       [&] { sdpa_forward(c, q, zeros4<T>(2, 3, 7, 16), zeros4<T>(2, 3, 7, 8)); },
       "sdpa_forward: Hkv (key/value heads) expected a divisor of H = 4, got 3"},
      {"a zero head scale", [&] { sdpa_forward(c, q, k, v, zero_head); },
       "sdpa_forward: head_scale expected a finite scale > 0"},
      {"zero queries", [&] { sdpa_forward(c, zeros4<T>(2, 4, 0, 16), k, v); },
       "sdpa_forward: q, k expected non-zero Tq, Tk and D"},
      {"zero keys", [&] { sdpa_forward(c, q, zeros4<T>(2, 4, 0, 16), zeros4<T>(2, 4, 0, 8)); },
       "sdpa_forward: q, k expected non-zero Tq, Tk and D"},
      {"zero head dim", [&] { sdpa_forward(c, zeros4<T>(2, 4, 5, 0), zeros4<T>(2, 4, 7, 0), v); },
       "sdpa_forward: q, k expected non-zero Tq, Tk and D"},
  };
  check_table<std::invalid_argument>(argument_errors);
}

TEST_CASE_TEMPLATE("hardening: sdpa_backward rejects tensors that do not match the forward", T,
                   float, double) {
  const auto q = zeros4<T>(2, 4, 5, 16);
  const auto k = zeros4<T>(2, 4, 7, 16);
  const auto v = zeros4<T>(2, 4, 7, 8);
  SdpaCache<T> c;
  sdpa_forward(c, q, k, v);
  const auto dout = zeros4<T>(2, 4, 5, 8);
  const std::vector<BadCall> table = {
      {"dout queries", [&] { sdpa_backward(zeros4<T>(2, 4, 6, 8), c, q, k, v); },
       "sdpa_backward: dout expected (2, 4, 5, 8), got (2, 4, 6, 8)"},
      {"dout value dim", [&] { sdpa_backward(zeros4<T>(2, 4, 5, 16), c, q, k, v); },
       "sdpa_backward: dout expected (2, 4, 5, 8)"},
      {"q not the forward's", [&] { sdpa_backward(dout, c, zeros4<T>(2, 4, 5, 8), k, v); },
       "sdpa_backward: q expected (2, 4, 5, 16), got (2, 4, 5, 8)"},
      {"k not the forward's", [&] { sdpa_backward(dout, c, q, zeros4<T>(2, 4, 6, 16), v); },
       "sdpa_backward: k expected (2, 4, 7, 16), got (2, 4, 6, 16)"},
      {"v not the forward's", [&] { sdpa_backward(dout, c, q, k, zeros4<T>(1, 4, 7, 8)); },
       "sdpa_backward: v expected (2, 4, 7, 8), got (1, 4, 7, 8)"},
  };
  check_table<ShapeError>(table);
  // A mismatch is reported before anything is computed: the cache is still usable.
  CHECK_NOTHROW(sdpa_backward(dout, c, q, k, v));
}

TEST_CASE("hardening: softmax_backward rejects mismatched shapes at every rank") {
  const std::vector<BadCall> table = {
      {"rank 1",
       [] {
         softmax_backward<double, 1>(Tensor1<double>(xt::zeros<double>({3})),
                                     Tensor1<double>(xt::zeros<double>({4})));
       },
       "softmax_backward: dp expected (4,), got (3,)"},
      {"rank 2",
       [] {
         softmax_backward<float, 2>(Tensor2<float>(xt::zeros<float>({2, 3})),
                                    Tensor2<float>(xt::zeros<float>({2, 4})));
       },
       "softmax_backward: dp expected (2, 4), got (2, 3)"},
      {"rank 3",
       [] {
         softmax_backward<double, 3>(Tensor3<double>(xt::zeros<double>({2, 3, 4})),
                                     Tensor3<double>(xt::zeros<double>({3, 3, 4})));
       },
       "softmax_backward: dp expected (3, 3, 4), got (2, 3, 4)"},
      {"rank 4",
       [] {
         softmax_backward<float, 4>(Tensor4<float>(xt::zeros<float>({1, 2, 3, 4})),
                                    Tensor4<float>(xt::zeros<float>({1, 2, 3, 5})));
       },
       "softmax_backward: dp expected (1, 2, 3, 5), got (1, 2, 3, 4)"},
  };
  check_table<ShapeError>(table);
}

TEST_CASE("hardening: the values in a message: numbers as an ostream writes them, long text cut") {
  CHECK(number_text(0.001) == "0.001");
  CHECK(number_text(1e-12) == "1e-12");
  CHECK(number_text(-2.5) == "-2.5");
  CHECK(number_text(1234567.0) == "1.23457e+06");
  CHECK(number_text(std::numeric_limits<double>::infinity()) == "inf");
  CHECK(number_text(-std::numeric_limits<double>::infinity()) == "-inf");
  CHECK(number_text(std::numeric_limits<double>::quiet_NaN()).find("nan") != std::string::npos);
  // An optimizer's bad value reaches its message through it.
  try {
    check_arg(false, "AdamW", "lr", "a finite value >= 0", number_text(-1e-3));
    FAIL("check_arg did not throw");
  } catch (const std::invalid_argument& e) {
    CHECK(std::string(e.what()) == "AdamW: lr expected a finite value >= 0, got -0.001");
  }

  CHECK(shown_text("short", 200) == "short");
  const std::string long_text(300, 'a');
  CHECK(shown_text(long_text, 200) == std::string(200, 'a') + "... (300 characters)");
  // "é" is two bytes: a cut at its second byte backs up to its first.
  const std::string accents = "a" + std::string(3, ' ') + "\xC3\xA9\xC3\xA9";  // a, 3 spaces, é, é
  CHECK(shown_text(accents, 5) == "a   ... (8 characters)");
  CHECK(shown_text(accents, 6) == "a   \xC3\xA9... (8 characters)");
}
