#include "attnlab/ops/linear.hpp"

#include <algorithm>
#include <deque>
#include <stdexcept>
#include <type_traits>
#include <vector>

#include "../parallel_rows.hpp"
#include "attnlab/blas.hpp"
#include "attnlab/threads.hpp"
#include "kernels/linear.hpp"
#include "shape_helpers.hpp"

namespace attnlab {

namespace {
std::ptrdiff_t extent(std::size_t x) {
  return static_cast<std::ptrdiff_t>(x);
}

// The expected shape of a rank-N tensor whose last extent is `last` (leading extents free).
template <std::size_t N>
std::vector<std::ptrdiff_t> with_last(std::size_t last) {
  std::vector<std::ptrdiff_t> shape(N, kAnyExtent);
  shape[N - 1] = extent(last);
  return shape;
}

using shape_helpers::dims;

}  // namespace

namespace detail {

namespace {
// A chunk smaller than this is not worth a thread.
constexpr std::size_t kMinRowsPerChunk = 64;
}  // namespace

std::size_t linear_chunks(std::size_t rows) {
  const auto threads = static_cast<std::size_t>(num_threads());
  return std::max<std::size_t>(1, std::min(threads, rows / kMinRowsPerChunk));
}

namespace {

// Under a bf16 scope a float linear rounds each operand once per call (W is read by every row
// chunk, dy by both products of the backward), where a gemm per chunk would round its own copies;
// the gemms then read the rounded rows. Same bits: each chunk's gemm sees the same rounded values
// with the same compact strides. The calling thread's scratch, reused from call to call.
struct Rounded {
  blas::Bf16Operand x, w, dy;
};

// What the CPU keeps in an OperandKeep: the roundings of the compact matrices it was given since
// its last clear(), found by address and shape. A deque, so that an entry stays where it is while
// another is added within one call; cleared entries keep their storage for the next forward.
class RoundedKeep final : public OperandKeep::State {
 public:
  void clear() override {
    for (Entry& e : entries_) e.held = false;
  }
  // The rounding of src (rows x cols, compact): held, or made now into a free entry (one of the
  // same shape when there is one, so its storage fits).
  const blas::Bf16Operand& rounded(const float* src, std::size_t rows, std::size_t cols) {
    Entry* free = nullptr;
    for (Entry& e : entries_) {
      const bool same_shape = e.rows == rows && e.cols == cols;
      if (e.held && e.src == src && same_shape) return e.operand;
      if (!e.held && (!free || same_shape)) free = &e;
    }
    if (!free) free = &entries_.emplace_back();
    free->operand.round(src, int(rows), int(cols), int(cols));
    free->src = src, free->rows = rows, free->cols = cols, free->held = true;
    return free->operand;
  }

 private:
  struct Entry {
    const float* src = nullptr;
    std::size_t rows = 0, cols = 0;
    bool held = false;
    blas::Bf16Operand operand;
  };
  std::deque<Entry> entries_;
};

template <class T>
Rounded* rounded_operands() {
  if constexpr (std::is_same_v<T, float>) {
    if (blas::gemm_precision() == GemmPrecision::bf16) {
      thread_local Rounded scratch;
      return &scratch;
    }
  }
  return nullptr;
}

// A compact rows x cols matrix rounded: from `keep` when there is one (held there, or rounded into
// it), else into the scratch `into`, with its column sums when asked (dy's are db). Only floats are
// ever rounded.
template <class T>
const blas::Bf16Operand* rounded(blas::Bf16Operand& into, OperandKeep* keep, const T* src,
                                 std::size_t rows, std::size_t cols, T* column_sums = nullptr) {
  if constexpr (std::is_same_v<T, float>) {
    if (keep) return &keep->state<RoundedKeep>().rounded(src, rows, cols);
    into.round(src, int(rows), int(cols), int(cols), column_sums);
  }
  return &into;
}

// C = op(A) op(B) (+ C when beta is 1) for one chunk: A starts at row a_row of a (row stride lda),
// B at row b_row of b; on their rounded copies ra and rb when there are some.
template <class T>
void chunk_gemm(bool trans_a, bool trans_b, int m, int n, int k, const T* a, int lda,
                const blas::Bf16Operand* ra, std::size_t a_row, const T* b, int ldb,
                const blas::Bf16Operand* rb, std::size_t b_row, T beta, T* c, int ldc) {
  if constexpr (std::is_same_v<T, float>) {
    if (ra) {
      blas::gemm_bf16(trans_a, trans_b, m, n, k, 1.f, *ra, int(a_row), *rb, int(b_row), beta, c,
                      ldc);
      return;
    }
  }
  blas::gemm<T>(trans_a, trans_b, m, n, k, T(1), a + a_row * lda, lda, b + b_row * ldb, ldb, beta,
                c, ldc);
}

}  // namespace

template <class T>
void linear_forward_rows(T* y, const T* x, const T* w, const T* b, std::size_t rows, std::size_t in,
                         std::size_t out, bool w_transposed, OperandKeep* keep) {
  const std::size_t chunks = linear_chunks(rows);
  const int ld_w = int(w_transposed ? in : out);
  const blas::Bf16Operand *rx = nullptr, *rw = nullptr;
  if (Rounded* scratch = rounded_operands<T>()) {
    rx = rounded(scratch->x, keep, x, rows, in);
    rw = rounded(scratch->w, keep, w, w_transposed ? out : in, std::size_t(ld_w));
  }
#pragma omp parallel for num_threads(int(chunks)) schedule(static)
  for (std::size_t c = 0; c < chunks; ++c) {
    const std::size_t r0 = rows * c / chunks, r1 = rows * (c + 1) / chunks;
    if (r1 == r0) continue;
    //                          (r,In) x (In,Out) -> (r,Out), or x wᵀ: (r,In) x (Out,In)ᵀ -> (r,Out)
    chunk_gemm<T>(false, w_transposed, int(r1 - r0), int(out), int(in), x, int(in), rx, r0, w, ld_w,
                  rw, 0, T(0), y + r0 * out, int(out));
    if (b) {
      for (std::size_t r = r0; r < r1; ++r) {
        T* row = y + r * out;
        for (std::size_t k = 0; k < out; ++k) row[k] += b[k];
      }
    }
  }
}

template <class T>
void linear_backward_rows(T* dx, T* dw, T* db, const T* dy, const T* x, const T* w,
                          std::size_t rows, std::size_t in, std::size_t out, T* partial_dw,
                          bool w_transposed, bool accumulate_dw, OperandKeep* keep) {
  const std::size_t chunks = linear_chunks(rows);
  if (rows == 0 && !accumulate_dw) std::fill(dw, dw + in * out, T(0));
  const int ld_w = int(w_transposed ? in : out);
  const blas::Bf16Operand *rx = nullptr, *rw = nullptr, *rdy = nullptr;
  if (Rounded* scratch = rows > 0 ? rounded_operands<T>() : nullptr) {
    rx = rounded(scratch->x, keep, x, rows, in);
    rdy = rounded(scratch->dy, nullptr, dy, rows, out, db);  // db summed in the same read of dy
    if (dx) rw = rounded(scratch->w, keep, w, w_transposed ? out : in, std::size_t(ld_w));
  }
  // dW is a sum over rows: each chunk writes its own partial, summed below in chunk order.
#pragma omp parallel for num_threads(int(chunks)) schedule(static)
  for (std::size_t c = 0; c < chunks; ++c) {
    const std::size_t r0 = rows * c / chunks, r1 = rows * (c + 1) / chunks;
    const int r = int(r1 - r0);
    if (r == 0) continue;  // only when rows = 0
    // dx = dy Wᵀ                                     (r,Out) x (Out,In) -> (r,In)
    if (dx) {
      chunk_gemm<T>(false, !w_transposed, r, int(in), int(out), dy, int(out), rdy, r0, w, ld_w, rw,
                    0, T(0), dx + r0 * in, int(in));
    }
    T* dwc = c == 0 ? dw : partial_dw + (c - 1) * in * out;
    const T beta = c == 0 && accumulate_dw ? T(1) : T(0);
    if (w_transposed) {  // dW stored (Out,In): dyᵀ x    (Out,r) x (r,In) -> (Out,In)
      chunk_gemm<T>(true, false, int(out), int(in), r, dy, int(out), rdy, r0, x, int(in), rx, r0,
                    beta, dwc, int(in));
    } else {  // dW = xᵀ dy                           (In,r) x (r,Out) -> (In,Out)
      chunk_gemm<T>(true, false, int(in), int(out), r, x, int(in), rx, r0, dy, int(out), rdy, r0,
                    beta, dwc, int(out));
    }
  }
  // The partials and db are sums over chunks / rows; cut over their elements instead, each element
  // summed in chunk / row order, so the bits do not depend on this second cut.
  if (chunks > 1) {
    for_row_chunks(in * out, chunks, [&](std::size_t i0, std::size_t i1, std::size_t) {
      for (std::size_t c = 1; c < chunks; ++c) {
        const T* part = partial_dw + (c - 1) * in * out;
        for (std::size_t i = i0; i < i1; ++i) dw[i] += part[i];
      }
    });
  }
  if (db && !rdy) {  // the same sums, in the same order, as dy's rounding makes
    std::fill(db, db + out, T(0));
    for_row_chunks(out, rows, [&](std::size_t c0, std::size_t c1, std::size_t) {
      for (std::size_t r = 0; r < rows; ++r) {
        const T* row = dy + r * out;
        for (std::size_t c = c0; c < c1; ++c) db[c] += row[c];
      }
    });
  }
}

template void linear_forward_rows<float>(float*, const float*, const float*, const float*,
                                         std::size_t, std::size_t, std::size_t, bool, OperandKeep*);
template void linear_forward_rows<double>(double*, const double*, const double*, const double*,
                                          std::size_t, std::size_t, std::size_t, bool,
                                          OperandKeep*);
template void linear_backward_rows<float>(float*, float*, float*, const float*, const float*,
                                          const float*, std::size_t, std::size_t, std::size_t,
                                          float*, bool, bool, OperandKeep*);
template void linear_backward_rows<double>(double*, double*, double*, const double*, const double*,
                                           const double*, std::size_t, std::size_t, std::size_t,
                                           double*, bool, bool, OperandKeep*);

}  // namespace detail

template <class T, std::size_t N>
Tensor<T, N> linear_forward(LinearCache<T, N>& cache, const Tensor<T, N>& x, const Tensor2<T>& w,
                            const Tensor1<T>* b) {
  const std::size_t in = w.shape()[0], out = w.shape()[1];
  check_arg(in > 0 && out > 0, "linear_forward", "w", "a non-empty (In, Out) matrix",
            format_shape_of(w.shape()));
  check_extents("linear_forward", "x", dims(x.shape()), with_last<N>(in));
  if (b) check_shape("linear_forward", "b", *b, {extent(out)});
  const std::size_t rows = x.size() / in;
  auto y_shape = x.shape();
  y_shape[N - 1] = out;
  Tensor<T, N> y(y_shape);
  detail::linear_forward_rows(y.data(), x.data(), w.data(), b ? b->data() : nullptr, rows, in, out);
  detail::assign_copy(cache.x, x);
  return y;
}

template <class T, std::size_t N>
LinearGrads<T, N> linear_backward(const Tensor<T, N>& dy, const LinearCache<T, N>& cache,
                                  const Tensor2<T>& w, bool with_bias) {
  if (cache.x.size() == 0) {
    throw std::logic_error("linear_backward: the cache is empty: call linear_forward first");
  }
  const std::size_t in = w.shape()[0], out = w.shape()[1];
  auto expected = dims(cache.x.shape());
  expected[N - 1] = out;
  check_extents("linear_backward", "dy", dims(dy.shape()),
                std::vector<std::ptrdiff_t>(expected.begin(), expected.end()));
  check_extents("linear_backward", "x (cache)", dims(cache.x.shape()), with_last<N>(in));
  const std::size_t rows = cache.x.size() / in;
  LinearGrads<T, N> g{Tensor<T, N>(cache.x.shape()), Tensor2<T>({in, out}), Tensor1<T>()};
  if (with_bias) g.db = Tensor1<T>::from_shape({out});
  std::vector<T> partial_dw((detail::linear_chunks(rows) - 1) * in * out);
  detail::linear_backward_rows(g.dx.data(), g.dw.data(), with_bias ? g.db.data() : nullptr,
                               dy.data(), cache.x.data(), w.data(), rows, in, out,
                               partial_dw.data());
  return g;
}

#define ATTNLAB_INSTANTIATE_LINEAR(T, N)                                                          \
  template Tensor<T, N> linear_forward<T, N>(LinearCache<T, N>&, const Tensor<T, N>&,             \
                                             const Tensor2<T>&, const Tensor1<T>*);               \
  template LinearGrads<T, N> linear_backward<T, N>(const Tensor<T, N>&, const LinearCache<T, N>&, \
                                                   const Tensor2<T>&, bool);
ATTNLAB_INSTANTIATE_LINEAR(float, 2)
ATTNLAB_INSTANTIATE_LINEAR(float, 3)
ATTNLAB_INSTANTIATE_LINEAR(double, 2)
ATTNLAB_INSTANTIATE_LINEAR(double, 3)
#undef ATTNLAB_INSTANTIATE_LINEAR

}  // namespace attnlab
