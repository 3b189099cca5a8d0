// JSON of a study plan: the presets as data (`attnlab study --config FILE`).
#include <nlohmann/json.hpp>

#include "../config_file.hpp"
#include "attnlab/app/study.hpp"
#include "attnlab/io/config_json.hpp"

namespace attnlab::app {

ATTNLAB_JSON_FIELDS(StudyArm, name, scaling, qk_norm, learnable_scale, scale_multiplier, softcap,
                    warmup, param_groups)
ATTNLAB_JSON_FIELDS(StudyGroup, name, base, arms, d_k, lrs, seeds, budgets)
ATTNLAB_JSON_FIELDS(StudyPlan, preset, groups)

void read_study_file(const std::string& path, StudyPlan& plan) {
  read_config_file_text(path, "study config",
                        [&](const std::string& text) { read_study_text(text, plan); });
}

void read_study_text(const std::string& text, StudyPlan& plan) {
  try {
    config_json::parse(text).get_to(plan);
  } catch (const nlohmann::json::exception& e) {
    throw std::invalid_argument(e.what());
  }
}

std::string to_json_text(const StudyPlan& plan) {
  return nlohmann::json(plan).dump(2);
}

}  // namespace attnlab::app
