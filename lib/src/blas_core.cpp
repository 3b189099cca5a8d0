// Which OpenBLAS core runs, and the one process-wide way to choose it (blas::init_process).
//
// OpenBLAS's DYNAMIC_ARCH build picks its core once, while the library loads (before main), from
// OPENBLAS_CORETYPE or else from the CPU model. On a model it does not know (0.3.21 on Emerald
// Rapids) it falls back to a generic SSE core, several times slower. The only supported way to
// give it another core is that variable at load time, so attnlab never switches a loaded
// OpenBLAS: it calls none of OpenBLAS's internals, and it writes no environment variable of a
// running process (setenv races with every thread that reads the environment, OpenBLAS's own
// worker threads included, which start while the library loads). Instead init_process, an
// explicit call made first in main, starts the program again (execve of /proc/self/exe, same
// argv, same pid) with OPENBLAS_CORETYPE in the new image's environment, so that OpenBLAS loads on
// that core from its first instruction. A restart needs nothing of the old image's threads: execve
// ends them all.
//
// The new image learns what happened from ATTNLAB_BLAS_RESTART: "<from>:<to>" after the restart,
// "<from>:<to>:failed" when <to> failed the sgemm/dgemm self-check and the program was started once
// more on <from>. A process that sees the variable never restarts for the same reason again, so a
// program starts at most three times.
#include <cblas.h>
#include <strings.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

#include "blas_private.hpp"

extern char** environ;

namespace attnlab {
namespace blas {

namespace {

constexpr const char* kRestartVariable = "ATTNLAB_BLAS_RESTART";

// The instruction sets that separate OpenBLAS's x86-64 cores, in increasing order.
enum class Isa { sse3, ssse3, sse4_2, avx, avx2_fma, avx512, avx512_bf16 };

struct CoreName {
  const char* name;  // as openblas_get_corename() spells it
  Isa isa;           // what its kernels need
  bool forcible;     // accepted by ATTNLAB_BLAS_CORE (and by OpenBLAS 0.3.21's OPENBLAS_CORETYPE)
};

// dynamic.c's corename[] (0.3.21, plus SapphireRapids from 0.3.22). Every core below avx2_fma is a
// generic choice on a CPU that has AVX2 + FMA: the SSE cores are what OpenBLAS falls back to for
// models it does not know, the AVX ones (Sandybridge, the AMD Bulldozer family) predate AVX2.
// Cooperlake is not forcible: 0.3.21 reports it but refuses the name in OPENBLAS_CORETYPE ("Core
// not found"), and its sgemm and dgemm kernels are SkylakeX's (it adds only bf16 kernels, which
// attnlab does not call: its bf16 gemms run in oneDNN or in the float engine).
constexpr CoreName kCores[] = {
    {"Unknown", Isa::sse3, false},
    {"Katmai", Isa::sse3, false},
    {"Coppermine", Isa::sse3, false},
    {"Northwood", Isa::sse3, false},
    {"Prescott", Isa::sse3, true},
    {"Banias", Isa::sse3, false},
    {"Atom", Isa::ssse3, false},
    {"Core2", Isa::ssse3, true},
    {"Penryn", Isa::ssse3, false},
    {"Dunnington", Isa::ssse3, false},
    {"Nehalem", Isa::sse4_2, true},
    {"Athlon", Isa::sse3, false},
    {"Opteron", Isa::sse3, false},
    {"Opteron_SSE3", Isa::sse3, false},
    {"Barcelona", Isa::sse3, false},
    {"Nano", Isa::sse3, false},
    {"Sandybridge", Isa::avx, true},
    {"Bobcat", Isa::sse3, false},
    {"Bulldozer", Isa::avx, false},
    {"Piledriver", Isa::avx, false},
    {"Haswell", Isa::avx2_fma, true},
    {"Steamroller", Isa::avx, false},
    {"Excavator", Isa::avx, false},
    {"Zen", Isa::avx2_fma, true},
    {"SkylakeX", Isa::avx512, true},
    {"Cooperlake", Isa::avx512_bf16, false},
    {"SapphireRapids", Isa::avx512_bf16, false},
};

const CoreName* find_core(const std::string& name) {
  for (const CoreName& core : kCores)
    if (strcasecmp(core.name, name.c_str()) == 0) return &core;
  return nullptr;
}

bool same_core(const std::string& a, const std::string& b) {
  return strcasecmp(a.c_str(), b.c_str()) == 0;
}

CpuFeatures detect_cpu() {
  __builtin_cpu_init();
  CpuFeatures cpu;
  cpu.avx2 = __builtin_cpu_supports("avx2");
  cpu.fma = __builtin_cpu_supports("fma");
  cpu.avx512f = __builtin_cpu_supports("avx512f");
  cpu.avx512bw = __builtin_cpu_supports("avx512bw");
  cpu.avx512dq = __builtin_cpu_supports("avx512dq");
  cpu.avx512vl = __builtin_cpu_supports("avx512vl");
  cpu.avx512bf16 = __builtin_cpu_supports("avx512bf16");
  return cpu;
}

Isa cpu_isa(const CpuFeatures& cpu) {
  const bool avx512 = cpu.avx512f && cpu.avx512bw && cpu.avx512dq && cpu.avx512vl;
  if (avx512 && cpu.avx2 && cpu.fma) return cpu.avx512bf16 ? Isa::avx512_bf16 : Isa::avx512;
  if (cpu.avx2 && cpu.fma) return Isa::avx2_fma;
  if (__builtin_cpu_supports("avx")) return Isa::avx;
  if (__builtin_cpu_supports("sse4.2")) return Isa::sse4_2;
  return __builtin_cpu_supports("ssse3") ? Isa::ssse3 : Isa::sse3;
}

const char* isa_name(Isa isa) {
  static constexpr const char* kNames[] = {"SSE3",     "SSSE3",   "SSE4.2",      "AVX",
                                           "AVX2+FMA", "AVX-512", "AVX-512 BF16"};
  return kNames[static_cast<int>(isa)];
}

// The best forcible core for a CPU of at least AVX2 + FMA.
const char* best_core(Isa isa) {
  return isa >= Isa::avx512 ? "SkylakeX" : "Haswell";
}

std::string env_text(const char* name) {
  const char* v = std::getenv(name);
  return v ? v : "";
}

// "OpenBLAS 0.3.21" from "OpenBLAS 0.3.21 NO_LAPACKE DYNAMIC_ARCH ...".
std::string library_name() {
  const std::string config = openblas_get_config();
  const auto first = config.find(' ');
  const auto second = first == std::string::npos ? first : config.find(' ', first + 1);
  return config.substr(0, second);
}

bool dynamic_arch() {
  return std::string(openblas_get_config()).find("DYNAMIC_ARCH") != std::string::npos;
}

std::string forcible_names() {
  std::string names;
  for (const CoreName& core : kCores)
    if (core.forcible) names.append(names.empty() ? "" : ", ").append(core.name);
  return names;
}

// What a restart handed down (kRestartVariable), when it did.
struct Restart {
  std::string from, to;
  bool failed = false;
};

std::optional<Restart> restart_state() {
  const std::string text = env_text(kRestartVariable);
  const auto colon = text.find(':');
  if (colon == std::string::npos) return std::nullopt;
  Restart r;
  r.from = text.substr(0, colon);
  r.to = text.substr(colon + 1);
  const auto second = r.to.find(':');
  if (second != std::string::npos) {
    r.failed = r.to.substr(second + 1) == "failed";
    r.to.resize(second);
  }
  return r;
}

// The core attnlab wants when OpenBLAS loaded `current`: `target` (empty: keep `current`) and why,
// or, when it keeps, the reason and any warning.
struct Choice {
  std::string target, why, reason, warning;
};

Choice choose_core(const std::string& current, Isa isa, bool restarted) {
  Choice c;
  const std::string user_core = env_text("OPENBLAS_CORETYPE");
  const std::string request = env_text("ATTNLAB_BLAS_CORE");
  // After a restart the variable is attnlab's own; ATTNLAB_BLAS_SIMULATE_FALLBACK (tests) marks a
  // user's value as what OpenBLAS would have chosen by itself.
  if (!restarted && !user_core.empty() && env_text("ATTNLAB_BLAS_SIMULATE_FALLBACK") != "1") {
    c.reason = "OPENBLAS_CORETYPE=" + user_core + " set by the user";
    return c;
  }
  if (request == "keep") {
    c.reason = "ATTNLAB_BLAS_CORE=keep";
    return c;
  }
  if (!dynamic_arch()) {
    c.reason = "this OpenBLAS has one fixed core";
    if (!request.empty()) c.warning = "ATTNLAB_BLAS_CORE=" + request + " ignored: " + c.reason;
    return c;
  }
  if (!request.empty() && same_core(request, current)) {
    c.reason = "ATTNLAB_BLAS_CORE=" + request + ", already active";
    return c;
  }
  if (!request.empty()) {
    const CoreName* forced = find_core(request);
    if (!forced || !forced->forcible) {
      c.reason = "kept: ATTNLAB_BLAS_CORE=" + request + " is not a core attnlab can select";
      c.warning = "ATTNLAB_BLAS_CORE=" + request + " ignored: expected keep or one of " +
                  forcible_names() + "; running " + current;
      return c;
    }
    if (forced->isa > isa) {
      c.reason = "kept: ATTNLAB_BLAS_CORE=" + request + " needs " + isa_name(forced->isa);
      c.warning = "ATTNLAB_BLAS_CORE=" + request + " ignored: " + forced->name + " needs " +
                  isa_name(forced->isa) + ", which this CPU lacks; running " + current;
      return c;
    }
    c.target = forced->name;
    c.why = "ATTNLAB_BLAS_CORE=" + request;
  } else {
    const CoreName* chosen = find_core(current);
    if (!chosen || chosen->isa >= Isa::avx2_fma || isa < Isa::avx2_fma) {
      c.reason = "OpenBLAS's choice for this CPU";
      return c;
    }
    c.target = best_core(isa);
    c.why = std::string("generic fallback on a CPU with ") + isa_name(isa);
  }
  if (same_core(c.target, current)) {
    c.reason = c.why + ", already active";
    c.target.clear();
  }
  return c;
}

// Starts this program again with OPENBLAS_CORETYPE=coretype and kRestartVariable=state added to
// (or replacing those in) the environment. Returns only when execve failed: why.
std::string restart(char* const argv[], const std::string& coretype, const std::string& state) {
  std::vector<std::string> entries;
  const std::string core_key = "OPENBLAS_CORETYPE=";
  const std::string state_key = std::string(kRestartVariable) + "=";
  for (char** e = environ; e && *e; ++e) {
    const std::string entry = *e;
    if (entry.rfind(core_key, 0) == 0 || entry.rfind(state_key, 0) == 0) continue;
    entries.push_back(entry);
  }
  entries.push_back(core_key + coretype);
  entries.push_back(state_key + state);
  std::vector<char*> envp;
  for (std::string& entry : entries) envp.push_back(entry.data());
  envp.push_back(nullptr);
  std::fflush(nullptr);  // the new image would drop what the old one buffered
  execve("/proc/self/exe", argv, envp.data());
  return std::string("execve(/proc/self/exe) failed: ") + std::strerror(errno);
}

// Set by init_process before it calls init(): why a wanted restart did not happen.
std::string& restart_failure() {
  static std::string failure;
  return failure;
}

}  // namespace

namespace detail {

std::string describe_core(BlasInfo& info) {
  info.library = library_name();
  info.cpu = detect_cpu();
  info.openblas_core = info.core = openblas_get_corename();
  const Isa isa = cpu_isa(info.cpu);
  if (const std::optional<Restart> r = restart_state()) {
    info.openblas_core = r->from;
    const Choice c = choose_core(r->from, isa, true);
    const std::string why = c.why.empty() ? std::string(kRestartVariable) + " set" : c.why;
    const bool asked = !env_text("ATTNLAB_BLAS_CORE").empty();
    const std::string slower = asked ? "" : ", which may be several times slower";
    if (r->failed) {
      info.reason = "kept: " + r->to + " failed attnlab's sgemm/dgemm self-check";
      info.warning = "BLAS core " + r->to + " failed attnlab's sgemm/dgemm self-check (" + why +
                     "); running " + info.core + slower;
    } else if (same_core(info.core, r->to)) {
      info.switched = true;
      info.reason = why;
    } else {
      info.reason = "kept: " + r->to + " is not available in this OpenBLAS";
      info.warning = "BLAS core " + r->to + " is not available in this OpenBLAS (" + why +
                     "); running " + info.core + slower;
    }
    return "";
  }
  const Choice c = choose_core(info.core, isa, false);
  if (c.target.empty()) {
    info.reason = c.reason;
    info.warning = c.warning;
    return "";
  }
  const std::string& failure = restart_failure();
  if (!failure.empty()) {
    info.reason = "kept: " + c.why + ", but the restart failed";
    info.warning = "BLAS core " + info.core + " kept (" + c.why + "): restarting on " + c.target +
                   " failed: " + failure;
  } else {
    info.reason = "kept: " + c.why + ", but blas::init_process() was not called";
    info.warning = "BLAS core " + info.core + " kept (" + c.why +
                   "): call attnlab::blas::init_process(argv) first in main to run " + c.target;
  }
  return c.target;
}

}  // namespace detail

void init_process(char* const argv[]) {
  if (!argv || !argv[0])
    throw std::invalid_argument(
        "blas::init_process: argv expected main's argv (argv[0] set), got a null pointer");
  if (!initialized()) {
    BlasInfo info;
    const std::string target = detail::describe_core(info);
    const std::optional<Restart> r = restart_state();
    if (!target.empty()) {
      restart_failure() = restart(argv, target, info.core + ":" + target);
    } else if (r && info.switched && !detail::openblas_self_check()) {
      const std::string failure = restart(argv, r->from, r->from + ":" + r->to + ":failed");
      throw std::runtime_error("blas::init_process: OpenBLAS core " + r->to +
                               " failed attnlab's sgemm/dgemm self-check, and restarting on " +
                               r->from + " failed: " + failure);
    }
  }
  init();
}

}  // namespace blas
}  // namespace attnlab
