#include "attnlab/app/study.hpp"

#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <mutex>
#include <optional>
#include <set>
#include <sstream>
#include <thread>

#include <limits>

#include <nlohmann/json.hpp>

#include "attnlab/app/plot.hpp"
#include "attnlab/app/progress.hpp"
#include "attnlab/app/report.hpp"

namespace attnlab::app {

namespace {

const StudyArm kNone{"none", Scaling::none, false, false};
const StudyArm kSqrt{"sqrt_dk", Scaling::sqrt_dk, false, false};
const StudyArm kDk{"dk", Scaling::dk, false, false};
// The stabilisers start from the default scale and add QK-norm or a learnable per-head scale.
const StudyArm kQkNorm{"qk_norm", Scaling::sqrt_dk, true, false};
const StudyArm kLearnable{"learnable", Scaling::sqrt_dk, false, true};
// The magnitude control: µP's 8/d_k (equal to 1/√d_k at d_k = 64, as microsoft/mup sets it) and
// 4/d_k, and 1/(4√d_k), so that the exponent (−1 against −½) and the constant can be told apart:
// at d_k = 16, 4/d_k equals 1/√d_k and 1/d_k equals 1/(4√d_k).
const StudyArm kDkTimes8{"dk_x8", Scaling::dk, false, false, 8};
const StudyArm kDkTimes4{"dk_x4", Scaling::dk, false, false, 4};
const StudyArm kSqrtDkQuarter{"sqrt_dk_x0.25", Scaling::sqrt_dk, false, false, 0.25};
// Gemma 2's attention softcap, 50, on the default scale.
const StudyArm kSoftcap{"softcap", Scaling::sqrt_dk, false, false, 1, 50};
// The modern block's attention (with RoPE in the group's base): each scaling mode with
// qk-layernorm, and each with the softcap, so that the report can say whether the mode still
// matters once q and k are normalised or the logits capped.
const StudyArm kNoneQk{"none_qknorm", Scaling::none, true, false};
const StudyArm kSqrtQk{"sqrt_dk_qknorm", Scaling::sqrt_dk, true, false};
const StudyArm kDkQk{"dk_qknorm", Scaling::dk, true, false};
const StudyArm kNoneCap{"none_softcap", Scaling::none, false, false, 1, 50};
const StudyArm kSqrtCap{"sqrt_dk_softcap", Scaling::sqrt_dk, false, false, 1, 50};
const StudyArm kDkCap{"dk_softcap", Scaling::dk, false, false, 1, 50};

// The proxies preset's ablations of qk-layernorm's instability (C2) and of the short warmup: its
// gains γ frozen at their initial 1 (lr_mult 0), its shifts β kept at their initial 0 (the same as
// no shift: a β_k · q̂ term is a key bias that can grow without bound) and its gains at 0.1× the
// LR; a warmup of 60 and 150 steps (20% and 50% of the run) instead of 15 for 1/√d_k and for
// qk-norm.
ParamGroupSpec qk_norm_params(const char* name, const char* field, double lr_mult) {
  ParamGroupSpec spec;
  spec.name = name;
  spec.match.pattern = std::string("blocks.*.attn.*_norm.") + field;
  spec.lr_mult = lr_mult;
  return spec;
}
const StudyArm kQkNormGainFrozen{"qk_norm_gain_frozen",
                                 Scaling::sqrt_dk,
                                 true,
                                 false,
                                 1,
                                 0,
                                 -1,
                                 {qk_norm_params("qk_gain", "gamma", 0)}};
const StudyArm kQkNormNoShift{"qk_norm_no_shift",
                              Scaling::sqrt_dk,
                              true,
                              false,
                              1,
                              0,
                              -1,
                              {qk_norm_params("qk_shift", "beta", 0)}};
const StudyArm kQkNormGainSlow{"qk_norm_gain_lr0.1",
                               Scaling::sqrt_dk,
                               true,
                               false,
                               1,
                               0,
                               -1,
                               {qk_norm_params("qk_gain", "gamma", 0.1)}};
const StudyArm kSqrtWarm60{"sqrt_dk_warmup60", Scaling::sqrt_dk, false, false, 1, 0, 60};
const StudyArm kSqrtWarm150{"sqrt_dk_warmup150", Scaling::sqrt_dk, false, false, 1, 0, 150};
const StudyArm kQkNormWarm60{"qk_norm_warmup60", Scaling::sqrt_dk, true, false, 1, 0, 60};
const StudyArm kQkNormWarm150{"qk_norm_warmup150", Scaling::sqrt_dk, true, false, 1, 0, 150};

// The study's model: 1 layer, 1 head, attention-only, d_model 64, d_v = 64, LayerNorm (so the
// attention input has unit RMS), no positional embedding (recall is order-free), AdamW(0.9, 0.95)
// without weight decay or clipping, warmup then cosine decay.
TrainConfig study_base(int steps, int batch) {
  TrainConfig c;
  c.task.kind = TaskKind::recall;
  c.model.block.attention.d_model = 64;
  c.model.block.attention.heads = 1;
  c.model.block.attention.d_v = 64;
  c.model.layers = 1;
  c.model.block.attn_only = true;
  c.model.block.norm = Norm::layernorm;
  c.model.positions = PositionEncoding::none;
  c.optimizer = OptimizerKind::adamw;
  c.beta1 = 0.9;
  c.beta2 = 0.95;
  c.weight_decay = 0;
  c.clip = 0;
  c.schedule = LrScheduleKind::warmup_cosine;
  c.steps = steps;
  c.warmup = steps / 10;
  c.batch = batch;
  c.eval_every = std::max(1, steps / 20);
  c.eval_size = 256;
  c.progress = false;
  return c;
}

// n peak LRs from `from` up in half-decades (1e-4, 3.16e-4, 1e-3, ...), rounded to 3 digits.
std::vector<double> half_decades(double from, int n) {
  std::vector<double> v;
  for (int i = 0; i < n; ++i) {
    const double x = from * std::pow(10.0, 0.5 * i);
    char buf[32];
    std::snprintf(buf, sizeof buf, "%.3g", x);
    v.push_back(std::strtod(buf, nullptr));
  }
  return v;
}

// The quick preset's grid: the three modes × d_k {16, 64, 256} × 8 peak LRs from 1e-4 to 0.316 in
// half-decades (wide enough that every mode's window shows both edges) × 5 seeds, 400 steps.
StudyGroup quick_group() {
  StudyGroup g;
  g.name = "recall/adamw";
  g.base = study_base(kQuickSteps, kQuickBatch);
  // 16 pairs over 32 keys and 32 values: learnable by one head within the quick budget; the task
  // defaults (32 pairs over 64 symbols) take 3-4x longer per step.
  g.base.task.keys = 32;
  g.base.task.values = 32;
  g.base.task.pairs = 16;
  g.arms = {kNone, kSqrt, kDk};
  g.d_k = {16, 64, 256};
  g.lrs = half_decades(1e-4, 8);
  g.seeds = {0, 1, 2, 3, 4};
  return g;
}

// Wortsman et al. 2023's small-scale proxies ("Small-scale proxies for large-scale Transformer
// training instabilities"), scaled to 2 cores: character-level Shakespeare, block 64, batch 16;
// 2 pre-LN layers, MLP 4C, causal, RoPE, no biases; AdamW (0.9, 0.95), ε 1e-8, clip 1,
// independent weight decay 1e-4, z-loss 1e-4 (their defaults), warmup 5%, cosine to 1e-5; their
// LR grid {3e-4 ... 0.3}, 5 seeds. One group per width d_model 64, 128, 256 at the fixed head
// dimension 32 (2, 4, 8 heads), so the tables and the checks compare widths. Arms: 1/√d_k, with
// qk-layernorm, 1/d_k (their Fig. E.6) and Gemma 2's attention softcap 50; at widths 64 and 128
// the seven ablations above in groups of their own.
// Sized from the 2-seed run without ablations (168 runs, 2,568 s with --jobs 2, so a run cost 6.2,
// 17 and 68 core-seconds at width 64, 128, 256, setup and evals included): 910 runs are about
// 18,600 core-seconds, 2.6 h with --jobs 2. What was cut to fit (theirs -> here): 1e5 steps ->
// 300; batch 256 x 512 tokens -> 16 x 64 characters; C4 -> the plays; depth scaled with width ->
// 2 layers; warmup 5k steps -> 5%; bf16 -> fp32.
StudyGroup proxies_group(int d_model, int steps) {
  StudyGroup g;
  g.name = "proxies/w" + std::to_string(d_model);
  TrainConfig& c = g.base;
  c.task.kind = TaskKind::text;
  c.task.block = 64;
  c.data_file = "data/shakespeare/plays.txt";
  c.model.layers = 2;
  c.model.block.attention.d_model = static_cast<std::size_t>(d_model);
  c.model.block.attention.heads = static_cast<std::size_t>(d_model / 32);
  c.model.block.attention.d_v = 32;
  c.model.block.attention.sdpa.causal = true;
  c.model.block.attn_only = false;
  c.model.block.bias = false;
  c.model.block.norm = Norm::layernorm;
  c.model.positions = PositionEncoding::rope;
  c.optimizer = OptimizerKind::adamw;
  c.beta1 = 0.9;
  c.beta2 = 0.95;
  c.clip = 1;
  c.weight_decay = 1e-4;
  c.decay = WeightDecayMode::independent;
  c.z_loss = 1e-4;
  c.schedule = LrScheduleKind::warmup_cosine;
  c.min_lr = 1e-5;
  c.steps = steps;
  c.warmup = steps / 20;
  c.batch = 16;
  c.eval_every = std::max(1, steps / 10);
  c.eval_size = 64;
  c.progress = false;
  g.arms = {kSqrt, kQkNorm, kDk, kSoftcap};
  g.d_k = {32};
  g.lrs = {3e-4, 1e-3, 3e-3, 1e-2, 3e-2, 1e-1, 3e-1};
  g.seeds = {0, 1, 2, 3, 4};
  return g;
}

}  // namespace

StudyPlan study_preset(const std::string& preset) {
  return study_preset(parse_enum<StudyPreset>(preset));
}

StudyPlan study_preset(StudyPreset preset) {
  StudyPlan plan;
  plan.preset = enum_name(preset);
  if (preset == StudyPreset::micro) {
    StudyGroup g;
    g.name = "recall/adamw";
    g.base = study_base(20, 8);
    g.base.task.keys = 8;
    g.base.task.values = 8;
    g.base.task.pairs = 4;
    g.base.model.block.attention.d_model = 16;
    g.base.model.block.attention.d_v = 16;
    g.base.eval_size = 32;
    g.base.eval_every = 10;
    g.arms = {kNone, kSqrt, kDk};
    g.d_k = {4, 16};
    g.lrs = {1e-2, 1e-1};
    g.seeds = {0};
    plan.groups.push_back(g);
  } else if (preset == StudyPreset::quick) {
    plan.groups.push_back(quick_group());
  } else if (preset == StudyPreset::full) {
    // Sized to finish within 60 minutes on 2 cores with --jobs 2 (data/results/full/study.json
    // gives its wall time). The cuts that make it fit: the recall task is the quick preset's (16
    // pairs) at d_k <= 256, and only the three scaling modes on recall get the 1600-step budget
    // and 5 seeds at every budget; the stabilisers have 5 seeds at 400 steps; SGD and mqar have 3
    // seeds at 400 steps (mqar: 6 LRs up to 0.0316); the text arm 2 seeds of 150 steps at 5 LRs.
    // The magnitude control (8/d_k, 4/d_k, 1/(4√d_k) beside 1/√d_k and 1/d_k, in a group of its
    // own so that its tables compare the five within the same seeds) has 3 seeds at 400 steps, as
    // has the modern block's attention (RoPE; each mode with qk-layernorm, and with a softcap).
    StudyGroup a = quick_group();
    a.budgets = {kQuickSteps, 4 * kQuickSteps};
    plan.groups.push_back(a);
    StudyGroup st = quick_group();
    st.name = "recall/adamw-stabilisers";
    st.arms = {kQkNorm, kLearnable};
    plan.groups.push_back(st);
    StudyGroup mag = quick_group();
    mag.name = "recall/adamw-magnitude";
    mag.arms = {kSqrtDkQuarter, kSqrt, kDk, kDkTimes4, kDkTimes8};
    mag.seeds = {0, 1, 2};
    plan.groups.push_back(mag);
    StudyGroup mod = quick_group();
    mod.name = "recall/adamw-modern";
    mod.base.model.positions = PositionEncoding::rope;
    // RoPE alone (1/√d_k and 1/d_k without qk-norm or softcap) beside them, so that the tables
    // can tell what RoPE does from what qk-norm does.
    mod.arms = {kSqrt, kDk, kNoneQk, kSqrtQk, kDkQk, kNoneCap, kSqrtCap, kDkCap};
    mod.seeds = {0, 1, 2};
    plan.groups.push_back(mod);
    StudyGroup s = quick_group();
    s.name = "recall/sgd";
    s.base.optimizer = OptimizerKind::sgd;
    s.base.momentum = 0.9;
    s.lrs = half_decades(1e-2, 8);
    s.seeds = {0, 1, 2};
    plan.groups.push_back(s);
    StudyGroup m = quick_group();
    m.name = "mqar/adamw";
    m.base.task.kind = TaskKind::mqar;
    m.base.task.keys = 32;
    m.base.task.values = 32;
    m.base.task.pairs = 8;
    m.base.task.queries = 4;
    m.base.model.layers = 2;
    m.base.model.positions = PositionEncoding::learned;
    m.base.model.block.attention.sdpa.causal = true;
    m.lrs = half_decades(1e-4, 6);
    m.seeds = {0, 1, 2};
    plan.groups.push_back(m);
    StudyGroup t = quick_group();
    t.name = "text/adamw";
    t.base.task.kind = TaskKind::text;
    t.base.task.block = 64;
    t.base.data_file = "data/shakespeare/plays.txt";
    t.base.model.layers = 2;
    t.base.model.block.attention.heads = 2;
    t.base.model.block.attention.d_model = 64;
    t.base.model.block.attention.d_v = 32;
    t.base.model.block.attn_only = false;
    t.base.model.block.attention.sdpa.causal = true;
    t.base.model.positions = PositionEncoding::learned;
    t.base.steps = 150;
    t.base.warmup = 15;
    t.base.eval_every = 15;
    t.base.batch = 16;
    t.base.eval_size = 64;
    t.lrs = half_decades(1e-3, 5);
    t.seeds = {0, 1};
    plan.groups.push_back(t);
  } else if (preset == StudyPreset::proxies) {
    for (int width : {64, 128, 256}) plan.groups.push_back(proxies_group(width, kProxiesSteps));
    // The ablations at the two widths that cost least (a width-256 step costs 4x a width-128
    // one), in groups of their own: a group's tables and the checks judge a run against the best
    // loss of its group and width, which the ablations must not move. Their baselines are the
    // width's own group (the same seeds, so the same weights at step 0 and the same batches).
    for (int width : {64, 128}) {
      StudyGroup a = proxies_group(width, kProxiesSteps);
      a.name += "-ablations";
      a.arms = {kQkNormGainFrozen, kQkNormNoShift, kQkNormGainSlow, kSqrtWarm60,
                kSqrtWarm150,      kQkNormWarm60,  kQkNormWarm150};
      plan.groups.push_back(a);
    }
  }
  return plan;
}

}  // namespace attnlab::app
