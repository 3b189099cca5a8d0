// libFuzzer target: a study plan's JSON (attnlab study --config) through its reader: every group's
// base is a run config, checked as fuzz_run_config checks one, with the key path of the group
// ("groups[2].base.model.layers"). Accepted or refused with std::invalid_argument, never another
// exception or an allocation over -malloc_limit_mb; an accepted plan reads back from its own JSON
// to the same plan, and each group's base either validates with a finite memory estimate or is
// refused.
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <stdexcept>
#include <string>

#include "attnlab/app/run_config.hpp"
#include "attnlab/app/study.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  using namespace attnlab::app;
  const std::string text(reinterpret_cast<const char*>(data), size);
  StudyPlan plan;
  try {
    read_study_text(text, plan);
  } catch (const std::invalid_argument&) {
    return 0;
  }
  const std::string written = to_json_text(plan);
  StudyPlan back;
  read_study_text(written, back);
  if (to_json_text(back) != written) __builtin_trap();
  for (const StudyGroup& g : plan.groups) {
    try {
      validate(g.base);
      if (!std::isfinite(estimate_memory(g.base).total())) __builtin_trap();
    } catch (const std::invalid_argument&) {
    }
  }
  return 0;
}
