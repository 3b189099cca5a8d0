// The gemm dispatch: OpenBLAS's calls, the thread split, the float engine and blas_info (the other
// parts: blas_private.hpp). OpenBLAS's cblas.h is included only here and in blas_core.cpp, neither
// of which includes xtensor (cblas.h clashes with xtensor-blas's declarations).
#include "attnlab/blas.hpp"

#include <cblas.h>

#include <atomic>
#include <cstdlib>
#include <mutex>
#include <optional>
#include <stdexcept>
#include <string>

#include "blas_private.hpp"

namespace attnlab {
namespace blas {

namespace {

CBLAS_TRANSPOSE to_cblas(bool trans) {
  return trans ? CblasTrans : CblasNoTrans;
}

// The engine of float gemms (BlasInfo::engine), set once by ensure_checked before any gemm runs.
std::atomic<GemmEngine> float_engine{GemmEngine::openblas};

BlasInfo& info_storage() {
  static BlasInfo info;
  return info;
}

std::atomic<bool> init_called{false};

// Fills info's engine fields from ATTNLAB_GEMM and sets float_engine. Changes nothing outside
// attnlab, so the check of a gemm before init runs it too.
void select_engine(BlasInfo& info) {
  using detail::add_warning;
  const char* env = std::getenv("ATTNLAB_GEMM");
  const std::string request = env && *env ? env : "auto";
  const std::optional<GemmEngine> named = find_enum<GemmEngine>(request);
  info.engine = GemmEngine::openblas;
  info.engine_name = info.library;
  if (named == GemmEngine::openblas) {
    info.engine_reason = "ATTNLAB_GEMM=" + request;
  } else if (request == "auto" || named == GemmEngine::onednn) {
    const detail::OneDnn* dnn = detail::onednn();
    if (!dnn) {
      info.engine_reason = "built without oneDNN";
      if (named)
        add_warning(info, "ATTNLAB_GEMM=" + request +
                              " ignored: this attnlab was built without oneDNN; float gemms run "
                              "in " +
                              info.library);
    } else {
      const std::string why =
          named ? "ATTNLAB_GEMM=" + request : "faster than OpenBLAS on a step's shapes";
      if (dnn->self_check()) {
        info.engine = GemmEngine::onednn;
        info.engine_name = dnn->name();
        info.engine_reason = why;
      } else {
        info.engine_reason = "oneDNN failed attnlab's sgemm self-check";
        add_warning(info, dnn->name() + " failed attnlab's sgemm self-check (" + why +
                              "); float gemms run in " + info.library);
      }
    }
  } else {
    info.engine_reason = "ATTNLAB_GEMM=" + request + " is not an engine";
    add_warning(info, "ATTNLAB_GEMM=" + request + " ignored: expected auto, " +
                          enum_names<GemmEngine>(NameList::or_words) + "; float gemms run in " +
                          info.library);
  }
  float_engine.store(info.engine, std::memory_order_relaxed);
}

}  // namespace

namespace detail {

void openblas_gemm(bool trans_a, bool trans_b, int m, int n, int k, float alpha, const float* a,
                   int lda, const float* b, int ldb, float beta, float* c, int ldc) {
  cblas_sgemm(CblasRowMajor, to_cblas(trans_a), to_cblas(trans_b), m, n, k, alpha, a, lda, b, ldb,
              beta, c, ldc);
}

void openblas_gemm(bool trans_a, bool trans_b, int m, int n, int k, double alpha, const double* a,
                   int lda, const double* b, int ldb, double beta, double* c, int ldc) {
  cblas_dgemm(CblasRowMajor, to_cblas(trans_a), to_cblas(trans_b), m, n, k, alpha, a, lda, b, ldb,
              beta, c, ldc);
}

void serial_gemm(bool trans_a, bool trans_b, int m, int n, int k, float alpha, const float* a,
                 int lda, const float* b, int ldb, float beta, float* c, int ldc) {
  if (float_engine.load(std::memory_order_relaxed) == GemmEngine::onednn) {
    onednn()->gemm(trans_a, trans_b, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
    return;
  }
  openblas_gemm(trans_a, trans_b, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
}

void serial_gemm(bool trans_a, bool trans_b, int m, int n, int k, double alpha, const double* a,
                 int lda, const double* b, int ldb, double beta, double* c, int ldc) {
  openblas_gemm(trans_a, trans_b, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
}

// serial_gemm split over the calling thread's count (split_gemm).
template <class T>
void gemm_impl(bool trans_a, bool trans_b, int m, int n, int k, T alpha, const T* a, int lda,
               const T* b, int ldb, T beta, T* c, int ldc) {
  const auto serial = [](auto... args) { serial_gemm(args...); };
  split_gemm(serial, trans_a, trans_b, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
}

bool env_is_one(const char* name) {
  const char* v = std::getenv(name);
  return v && std::string(v) == "1";
}

void add_warning(BlasInfo& info, const std::string& warning) {
  info.warning += (info.warning.empty() ? "" : "; ") + warning;
}

bool openblas_self_check() {
  const bool corrupt = env_is_one("ATTNLAB_BLAS_SIMULATE_BAD_KERNEL");
  const auto sgemm = [](auto... args) { openblas_gemm(args...); };
  for (bool trans_a : {false, true}) {
    for (bool trans_b : {false, true}) {
      if (!gemm_exact<float>(sgemm, trans_a, trans_b, corrupt)) return false;
      if (!gemm_exact<double>(sgemm, trans_a, trans_b, false)) return false;
    }
  }
  return true;
}

// Fills info_storage() once, before the first gemm or by init: the core, the float engine and the
// bf16 engine. Nothing in it changes after that (the core is chosen when OpenBLAS loads), so gemms
// in flight need no lock.
void ensure_checked() {
  static std::once_flag checked;
  std::call_once(checked, [] {
    (void)describe_core(info_storage());
    select_engine(info_storage());
    select_bf16(info_storage());
  });
}

}  // namespace detail

void init() {
  detail::ensure_checked();
  init_called.store(true, std::memory_order_release);
}

bool initialized() {
  return init_called.load(std::memory_order_acquire);
}

template <>
void gemm<float>(bool trans_a, bool trans_b, int m, int n, int k, float alpha, const float* a,
                 int lda, const float* b, int ldb, float beta, float* c, int ldc) {
  detail::ensure_checked();
  if (detail::bf16_active()) {
    detail::bf16_gemm(trans_a, trans_b, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
    return;
  }
  detail::gemm_impl(trans_a, trans_b, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
}

template <>
void gemm<double>(bool trans_a, bool trans_b, int m, int n, int k, double alpha, const double* a,
                  int lda, const double* b, int ldb, double beta, double* c, int ldc) {
  detail::ensure_checked();
  detail::gemm_impl(trans_a, trans_b, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
}

}  // namespace blas

const BlasInfo& blas_info() {
  blas::detail::ensure_checked();
  return blas::info_storage();
}

std::string blas_summary(const BlasInfo& info) {
  std::string line = info.library + ", core " + info.core + " (";
  if (info.switched) line += "switched from " + info.openblas_core + ": ";
  line += info.reason + ")";
  if (!info.engine_name.empty())
    line += "; float gemm: " + info.engine_name + " (" + info.engine_reason + ")";
  if (!info.bf16_engine_name.empty())
    line += "; bf16 gemm: " + info.bf16_engine_name + " (" + info.bf16_reason + ")";
  return line;
}

std::string to_string(const CpuFeatures& cpu) {
  std::string out;
  auto add = [&out](bool has, const char* name) {
    if (!has) return;
    if (!out.empty()) out += ' ';
    out += name;
  };
  add(cpu.avx2, "avx2");
  add(cpu.fma, "fma");
  add(cpu.avx512f, "avx512f");
  add(cpu.avx512bw, "avx512bw");
  add(cpu.avx512dq, "avx512dq");
  add(cpu.avx512vl, "avx512vl");
  add(cpu.avx512bf16, "avx512bf16");
  return out.empty() ? "none" : out;
}

}  // namespace attnlab
