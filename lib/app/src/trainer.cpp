#include "attnlab/app/trainer.hpp"

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <limits>
#include <memory>
#include <regex>
#include <sstream>

#include <nlohmann/json.hpp>

#include "attnlab/app/data_file.hpp"
#include "attnlab/app/loss.hpp"
#include "attnlab/app/metrics.hpp"
#include "attnlab/app/model.hpp"
#include "attnlab/app/run_checkpoint.hpp"
#include "attnlab/blas.hpp"
#include "attnlab/cuda.hpp"
#include "attnlab/nn/device_transformer.hpp"
#include "attnlab/optim/adamw.hpp"
#include "attnlab/optim/clip.hpp"
#include "attnlab/optim/schedule.hpp"
#include "attnlab/optim/sgd.hpp"
#include "attnlab/threads.hpp"

namespace attnlab::app {

std::atomic<bool> g_stop_requested{false};

namespace {

using json = nlohmann::json;
using Clock = std::chrono::steady_clock;

// The data stream's seed: derived from the run seed only (splitmix64 of seed ^ a constant).
std::uint64_t data_seed(std::uint64_t seed) {
  std::uint64_t z = seed ^ 0xda7a5eedULL;
  z += 0x9e3779b97f4a7c15ULL;
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  return z ^ (z >> 31);
}

// The run's recipe as JSON: every field but the run control that a resumed run may change.
json recipe_json(const TrainConfig& c) {
  json j = json::parse(to_json_text(c));
  for (const char* k : {"threads", "out", "save_every", "device", "steps"}) j.erase(k);
  return j;
}

// The first key path where two JSON values differ ("" when equal).
std::string first_difference(const json& a, const json& b, const std::string& path = "") {
  if (a.is_object() && b.is_object()) {
    for (const auto& item : a.items()) {
      const std::string p = path.empty() ? item.key() : path + "." + item.key();
      if (!b.contains(item.key())) return p;
      const std::string d = first_difference(item.value(), b.at(item.key()), p);
      if (!d.empty()) return d;
    }
    return "";
  }
  return a == b ? "" : path;
}

json at_path(const json& j, const std::string& path) {
  return j.at(json::json_pointer("/" + std::regex_replace(path, std::regex("\\."), "/")));
}

double tensor_norm(const xt::xarray<float>& a) {
  double s = 0;
  for (float x : a) s += static_cast<double>(x) * x;
  return std::sqrt(s);
}

Parameter<float>* find_param(const ParameterList<float>& params, const std::string& name) {
  for (const auto& p : params)
    if (p.name == name) return p.param;
  return nullptr;
}

// What one evaluation measures.
struct EvalStats {
  double loss = 0, accuracy = 0;
  std::vector<HeadHealth> health;   // layers × heads, row-major
  std::vector<double> recall_mass;  // layers × heads (recall only)
  double qk_var_ratio = 0;          // layer 0, all heads
};

// One evaluation on the host model, or, when `dev` is given, on the device: its logits come back,
// and the attention metrics are recomputed on the host from each layer's queries and keys (the
// same P and S the host model's attention_weights / attention_scores give).
EvalStats evaluate(Model& model, DeviceTransformer<float>* dev, const Batch& eval,
                   const TaskConfig& task, const TransformerConfig& spec) {
  EvalStats st;
  Tensor3<float> logits;
  if (dev) {
    dev->forward(eval.fields);
    logits = dev->logits();
  } else {
    logits = model.forward(eval);
  }
  const LossResult lr = masked_cross_entropy(logits, eval.targets, false);
  st.loss = lr.loss;
  st.accuracy = lr.accuracy;
  const std::vector<int> key_pos =
      task.kind == TaskKind::recall ? recall_key_positions(eval) : std::vector<int>();
  const SdpaOptions attention = model.transformer().config().block.attention.sdpa;
  Tensor4<float> dots;  // layer 0's unscaled q·k
  for (std::size_t l = 0; l < model.layers(); ++l) {
    Tensor4<float> p, scores;
    if (dev) {
      SdpaOptions o = attention;
      o.head_scale = dev->head_scales(l);
      const Tensor4<float> q = dev->queries(l), k = dev->keys(l);
      p = sdpa_weights<float>(q, k, o);
      scores = sdpa_scores<float>(q, k, o);
      if (l == 0) {
        SdpaOptions raw = attention;  // as Model::attention_dots
        raw.scaling = Scaling::none;
        raw.scale.reset();
        raw.head_scale.clear();
        dots = sdpa_scores<float>(q, k, raw);
      }
    } else {
      p = model.attention_weights(l);
      scores = model.attention_logits(l);
    }
    const auto h = attention_health(p, scores);
    st.health.insert(st.health.end(), h.begin(), h.end());
    if (!key_pos.empty()) {
      const auto m = correct_key_mass(p, eval.length() - 1, key_pos);
      st.recall_mass.insert(st.recall_mass.end(), m.begin(), m.end());
    }
  }
  if (!dev) dots = model.attention_dots(0);
  double mean = 0, sq = 0;
  for (float x : dots) mean += x;
  mean /= static_cast<double>(dots.size());
  for (float x : dots) sq += (x - mean) * (x - mean);
  const auto d_k = static_cast<double>(spec.block.attention.head_dim_k());
  st.qk_var_ratio = sq / static_cast<double>(std::max<std::size_t>(dots.size() - 1, 1)) / d_k;
  return st;
}

std::string csv_header(std::size_t layers, std::size_t heads, bool recall) {
  std::ostringstream os;
  os << "step,loss,eval_loss,eval_acc,lr";
  for (std::size_t l = 0; l < layers; ++l)
    for (std::size_t h = 0; h < heads; ++h) {
      std::string p = "l";  // appended: GCC 12 -O3 warns falsely (-Wrestrict) on "l" + string&&
      p.append(std::to_string(l)).append("h").append(std::to_string(h)).append("_");
      os << ',' << p << "entropy," << p << "max_logit," << p << "saturated," << p << "jacobian";
      if (recall) os << ',' << p << "recall_mass";
    }
  for (std::size_t l = 0; l < layers; ++l) {
    std::string p = "l";
    p.append(std::to_string(l)).append("_");
    os << ',' << p << "wq_grad_norm," << p << "wk_grad_norm," << p << "wq_norm," << p << "wk_norm";
  }
  os << ",jacobian_mean";
  return os.str();
}

std::string g(double x) {
  if (!std::isfinite(x)) return std::isnan(x) ? "nan" : (x > 0 ? "inf" : "-inf");
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.7g", x);
  return buf;
}

std::string format_duration(double s) {
  char buf[32];
  if (!std::isfinite(s) || s < 0) return "?";
  if (s < 60)
    std::snprintf(buf, sizeof buf, "%.0fs", s);
  else if (s < 3600)
    std::snprintf(buf, sizeof buf, "%dm%02ds", static_cast<int>(s) / 60, static_cast<int>(s) % 60);
  else
    std::snprintf(buf, sizeof buf, "%dh%02dm", static_cast<int>(s) / 3600,
                  static_cast<int>(s) % 3600 / 60);
  return buf;
}

void write_summary(const std::string& path, const TrainConfig& c, const TrainResult& r) {
  json j;
  j["config"] = json::parse(to_json_text(c));
  j["steps_done"] = r.steps_done;
  j["init_eval_loss"] = r.init_eval_loss;
  j["final_eval_loss"] = std::isfinite(r.final_eval_loss) ? json(r.final_eval_loss) : json(nullptr);
  j["final_eval_acc"] = r.final_eval_acc;
  j["final_train_loss"] =
      std::isfinite(r.final_train_loss) ? json(r.final_train_loss) : json(nullptr);
  j["steps_to_95"] = r.steps_to_target;
  j["diverged"] = r.diverged;
  if (r.diverged) {
    j["diverged_step"] = r.diverged_step;
    j["status"] = "diverged at step " + std::to_string(r.diverged_step);
    j["first_nonfinite_layer"] = r.diverged_where;
  } else {
    j["status"] = r.interrupted ? "interrupted" : "finished";
  }
  j["init_qk_var_ratio"] = r.init_qk_var_ratio;
  j["seconds"] = r.seconds;
  j["device"] = r.device;
  j["blas_core"] = blas_info().core;
  std::ofstream out(path, std::ios::trunc);
  if (!out) throw std::runtime_error(path + ": cannot open for writing");
  out << j.dump(2) << '\n';
}

}  // namespace

TrainResult train_model(const TrainConfig& config_in, DeviceOps<float>* device_ops) {
  TrainConfig c = config_in;
  RunMeta resumed;
  const bool resuming = !c.resume.empty();
  const std::string resume_path = c.resume + "/model.safetensors";
  if (resuming) {
    resumed = read_run_meta(resume_path);
    TrainConfig saved;
    try {
      read_json_text(resumed.config_json, saved);
    } catch (const std::invalid_argument& e) {
      throw std::invalid_argument(resume_path + ": model_config: " + e.what());
    }
    // The saved config is the recipe; only run control and steps may differ (both resolved, so a
    // run saved before the model recorded its vocabularies compares equal).
    const TaskShape saved_shape = task_shape(saved.task);
    saved.model = resolve_model(saved.model, saved_shape);
    TrainConfig given = config_in;
    given.model = resolve_model(given.model, task_shape(given.task));
    const json want = recipe_json(saved), got = recipe_json(given);
    const std::string diff = first_difference(want, got);
    if (!diff.empty())
      check_arg(false, "train", "resume: " + diff,
                at_path(want, diff).dump() +
                    " (the saved run's; only steps, out, threads, device and save_every may "
                    "change)",
                at_path(got, diff).dump());
    check_arg(config_in.steps >= static_cast<int>(resumed.step), "train", "steps",
              ">= the saved step " + std::to_string(resumed.step) + " when resuming",
              std::to_string(config_in.steps));
    c.model = given.model;
    if (config_in.out == TrainConfig{}.out) c.out = c.resume;
  }
  validate(c);
  set_num_threads(c.threads);
  const TaskShape shape = task_shape(c.task);
  c.model = resolve_model(c.model, shape);  // the effective config records what the task decided

  // Data: generated from the data Rng, or drawn (by the same Rng) from a file.
  Batch file_data;
  const bool from_file = !c.data_file.empty();
  if (from_file) file_data = read_data_file(c.data_file, &shape);
  Batch eval;
  std::string valid = c.valid_file;
  if (valid.empty() && from_file) {
    const auto sibling = std::filesystem::path(c.data_file).parent_path() / "valid.txt";
    if (std::filesystem::exists(sibling) && sibling != std::filesystem::path(c.data_file))
      valid = sibling.string();
  }
  eval = valid.empty() ? eval_batch(c.task, static_cast<std::size_t>(c.eval_size))
                       : read_data_file(valid, &shape);

  Rng init_rng(c.seed);
  Rng data_rng(data_seed(c.seed));
  Model model(c.model, init_rng);
  ParameterList<float> params = model.parameters();
  const AdamWOptions adamw_options{c.lr, c.beta1, c.beta2, 1e-8, c.weight_decay};
  const SgdOptions sgd_options{c.lr, c.momentum, c.weight_decay};
  std::unique_ptr<Optimizer<float>> opt;
  if (c.optimizer == "adamw")
    opt = std::make_unique<AdamW<float>>(params, adamw_options);
  else
    opt = std::make_unique<SGD<float>>(params, sgd_options);
  const LrSchedule schedule =
      c.schedule == "cosine"
          ? LrSchedule::warmup_cosine(c.lr, 0.0, static_cast<std::size_t>(c.warmup),
                                      static_cast<std::size_t>(c.steps))
          : LrSchedule::constant(c.lr);

  std::size_t start = 0;
  if (resuming) {
    StateTensors optim_state;
    for (auto& t : opt->state_tensors()) optim_state.emplace_back(t.first, std::move(t.second));
    load_run_checkpoint(resume_path, params, &optim_state);
    opt->load_state(optim_state, resumed.optimizer_steps);
    data_rng.set_state(resumed.data_rng);
    start = resumed.step;
  }

  // On a device the training step and the eval forward run on a DeviceTransformer; the host model
  // and optimizer stay the mirror that checkpoints and weight norms read (synchronised when they
  // need it), and that replays a batch whose loss went non-finite.
  std::unique_ptr<DeviceTransformer<float>> dev;
  std::unique_ptr<DeviceOptimizer<float>> dev_opt;
  if (c.device == "cuda") {
    if (!device_ops) {
      if (!cuda_available()) {
        check_arg(
            false, "train", "device", "a usable CUDA device for 'cuda'",
            cuda_built() ? "none (no driver or no GPU)" : "none (attnlab was built without CUDA)");
      }
      device_ops = &cuda_device_ops<float>();
    }
    dev = std::make_unique<DeviceTransformer<float>>(model.transformer(), *device_ops);
    if (c.optimizer == "adamw")
      dev_opt = std::make_unique<DeviceOptimizer<float>>(*dev, adamw_options);
    else
      dev_opt = std::make_unique<DeviceOptimizer<float>>(*dev, sgd_options);
    if (resuming) dev_opt->load_state(opt->state_tensors(), opt->step_count());
  }
  const auto sync_parameters = [&] {
    if (dev) dev->download_parameters(params);
  };

  std::filesystem::create_directories(c.out);
  write_config_file(c.out + "/config.json", c);
  const std::string metrics_path = c.out + "/metrics.csv";
  const bool recall = c.task.kind == TaskKind::recall;
  const std::string header = csv_header(model.layers(), model.heads(), recall);
  // On resume, keep the rows up to the saved step and append from there.
  std::vector<std::string> kept_rows;
  if (resuming) {
    std::ifstream in(c.resume + "/metrics.csv");
    std::string line;
    std::getline(in, line);
    while (std::getline(in, line)) {
      const auto comma = line.find(',');
      if (comma == std::string::npos) continue;
      if (std::stoul(line.substr(0, comma)) <= start) kept_rows.push_back(line);
    }
  }
  std::ofstream metrics(metrics_path, std::ios::trunc);
  if (!metrics) throw std::runtime_error(metrics_path + ": cannot open for writing");
  metrics << header << '\n';
  for (const auto& row : kept_rows) metrics << row << '\n';

  TrainResult result;
  result.final_train_loss = std::numeric_limits<double>::quiet_NaN();
  const auto t0 = Clock::now();
  std::vector<double> wq_grad(model.layers(), 0.0), wk_grad(model.layers(), 0.0);

  auto log_row = [&](std::size_t step, double train_loss, const EvalStats& st, double lr) {
    metrics << step << ',' << g(train_loss) << ',' << g(st.loss) << ',' << g(st.accuracy) << ','
            << g(lr);
    double jac = 0;
    for (std::size_t i = 0; i < st.health.size(); ++i) {
      const auto& h = st.health[i];
      metrics << ',' << g(h.entropy) << ',' << g(h.max_abs_logit) << ',' << g(h.saturated_fraction)
              << ',' << g(h.jacobian_norm);
      if (recall) metrics << ',' << g(st.recall_mass[i]);
      jac += h.jacobian_norm;
    }
    for (std::size_t l = 0; l < model.layers(); ++l)
      metrics << ',' << g(wq_grad[l]) << ',' << g(wk_grad[l]) << ','
              << g(tensor_norm(find_param(params, model.w_q_name(l))->value)) << ','
              << g(tensor_norm(find_param(params, model.w_k_name(l))->value));
    metrics << ',' << g(st.health.empty() ? 0.0 : jac / static_cast<double>(st.health.size()))
            << '\n';
    metrics.flush();
    if (st.accuracy >= 0.95 && result.steps_to_target < 0)
      result.steps_to_target = static_cast<int>(step);
  };

  EvalStats st = evaluate(model, dev.get(), eval, c.task, c.model);
  result.init_qk_var_ratio = st.qk_var_ratio;
  result.init_eval_loss = st.loss;
  if (resuming) {
    // The loss at initialisation and the first step at 95% come from the saved rows.
    for (const auto& row : kept_rows) {
      std::stringstream ss(row);
      std::string step_s, loss_s, eval_s, acc_s;
      std::getline(ss, step_s, ',');
      std::getline(ss, loss_s, ',');
      std::getline(ss, eval_s, ',');
      std::getline(ss, acc_s, ',');
      if (std::stoul(step_s) == 0) result.init_eval_loss = std::stod(eval_s);
      if (std::stod(acc_s) >= 0.95 && result.steps_to_target < 0)
        result.steps_to_target = std::stoi(step_s);
    }
  } else {
    log_row(0, std::numeric_limits<double>::quiet_NaN(), st, schedule.lr_at(0));
  }
  result.final_eval_loss = st.loss;
  result.final_eval_acc = st.accuracy;

  const bool tty = c.progress && isatty(fileno(stdout));
  auto save = [&](std::size_t step) {
    if (!c.write_checkpoint) return;
    if (dev) {
      sync_parameters();
      opt->load_state(dev_opt->state_tensors(), dev_opt->step_count());
    }
    RunMeta meta;
    meta.config_json = to_json_text(c);
    meta.step = step;
    meta.optimizer_steps = opt->step_count();
    meta.data_rng = data_rng.state();
    StateTensors state;
    for (auto& t : opt->state_tensors()) state.emplace_back(t.first, std::move(t.second));
    save_run_checkpoint(c.out + "/model.safetensors", params, state, meta);
  };

  const auto B = static_cast<std::size_t>(c.batch);
  std::vector<std::size_t> rows(B);
  std::size_t step = start;
  double last_loss = std::numeric_limits<double>::quiet_NaN();
  for (; step < static_cast<std::size_t>(c.steps); ++step) {
    if (g_stop_requested.load() ||
        (c.stop_after > 0 && step == static_cast<std::size_t>(c.stop_after))) {
      result.interrupted = true;
      break;
    }
    const double lr = schedule.lr_at(step);
    opt->set_lr(lr);
    if (dev_opt) dev_opt->set_lr(lr);
    Batch batch;
    if (from_file) {
      for (auto& r : rows) r = data_rng.below(file_data.size());
      batch = gather_batch(file_data, rows);
    } else {
      batch = generate_batch(c.task, B, data_rng);
    }
    LossResult loss;
    if (dev) {
      dev->forward(batch.fields);
      loss.loss = dev->loss(batch.targets);
    } else {
      const Tensor3<float> logits = model.forward(batch);
      loss = masked_cross_entropy(logits, batch.targets, true);
    }
    if (!std::isfinite(loss.loss)) {
      result.diverged = true;
      result.diverged_step = static_cast<int>(step + 1);
      if (dev) {  // replay the batch on the host mirror, which locates the first non-finite stage
        sync_parameters();
        model.forward(batch);
      }
      result.diverged_where = model.first_nonfinite_stage();
      if (result.diverged_where.empty()) result.diverged_where = "loss";
      last_loss = std::numeric_limits<double>::quiet_NaN();
      break;
    }
    last_loss = loss.loss;
    if (dev) {
      dev->backward();
    } else {
      model.zero_grad();
      model.backward(loss.dlogits);
    }
    const bool log_now = (step + 1) % static_cast<std::size_t>(c.eval_every) == 0 ||
                         step + 1 == static_cast<std::size_t>(c.steps);
    if (log_now)
      for (std::size_t l = 0; l < model.layers(); ++l) {
        wq_grad[l] = dev ? dev->grad_norm(model.w_q_name(l))
                         : tensor_norm(find_param(params, model.w_q_name(l))->grad);
        wk_grad[l] = dev ? dev->grad_norm(model.w_k_name(l))
                         : tensor_norm(find_param(params, model.w_k_name(l))->grad);
      }
    if (c.clip > 0) {
      if (dev)
        dev->clip_grad_norm(c.clip);
      else
        clip_grad_norm(params, c.clip);
    }
    if (dev)
      dev_opt->step();
    else
      opt->step();
    if (log_now) {
      sync_parameters();  // for the weight norms of the row
      st = evaluate(model, dev.get(), eval, c.task, c.model);
      log_row(step + 1, loss.loss, st, lr);
      result.final_eval_loss = st.loss;
      result.final_eval_acc = st.accuracy;
      if (!std::isfinite(st.loss)) {
        result.diverged = true;
        result.diverged_step = static_cast<int>(step + 1);
        result.diverged_where = model.first_nonfinite_stage();
        if (result.diverged_where.empty()) result.diverged_where = "eval loss";
        ++step;
        break;
      }
    }
    if (c.save_every > 0 && (step + 1) % static_cast<std::size_t>(c.save_every) == 0)
      save(step + 1);
    if (c.progress) {
      const double secs = std::chrono::duration<double>(Clock::now() - t0).count();
      const double rate = static_cast<double>(step + 1 - start) / std::max(secs, 1e-9);
      const double eta = static_cast<double>(c.steps - static_cast<int>(step) - 1) / rate;
      if (tty) {
        const int width = 24;
        const int filled = static_cast<int>(width * static_cast<double>(step + 1) / c.steps);
        std::printf("\r[%s%s] step %zu/%d loss %.4f acc %.3f %.1f it/s ETA %s   ",
                    std::string(static_cast<std::size_t>(filled), '#').c_str(),
                    std::string(static_cast<std::size_t>(width - filled), '.').c_str(), step + 1,
                    c.steps, loss.loss, result.final_eval_acc, rate, format_duration(eta).c_str());
        std::fflush(stdout);
      } else if (log_now) {
        std::printf("step %zu/%d loss %.4f eval_loss %.4f eval_acc %.3f lr %.3g %.1f it/s ETA %s\n",
                    step + 1, c.steps, loss.loss, st.loss, st.accuracy, lr, rate,
                    format_duration(eta).c_str());
        std::fflush(stdout);
      }
    }
  }
  if (tty) std::printf("\n");
  result.steps_done = static_cast<int>(step);
  result.final_train_loss = last_loss;
  if (result.diverged) result.final_eval_loss = std::numeric_limits<double>::quiet_NaN();
  result.seconds = std::chrono::duration<double>(Clock::now() - t0).count();
  result.device = dev ? device_ops->name() : "cpu";
  // A diverged model is never saved: its weights may hold non-finite values.
  if (!result.diverged) save(step);
  write_summary(c.out + "/summary.json", c, result);
  return result;
}

EvalReport evaluate_run(const std::string& run_dir, int show, const std::string& valid_file) {
  const std::string path = run_dir + "/model.safetensors";
  const RunMeta meta = read_run_meta(path);
  TrainConfig c;
  try {
    read_json_text(meta.config_json, c);
  } catch (const std::invalid_argument& e) {
    throw std::invalid_argument(path + ": model_config: " + e.what());
  }
  const TaskShape shape = task_shape(c.task);
  Rng rng(c.seed);
  Model model(resolve_model(c.model, shape), rng);
  ParameterList<float> params = model.parameters();
  load_run_checkpoint(path, params, nullptr);
  const std::string valid = !valid_file.empty() ? valid_file : c.valid_file;
  const Batch eval = valid.empty() ? eval_batch(c.task, static_cast<std::size_t>(c.eval_size))
                                   : read_data_file(valid, &shape);
  const Tensor3<float> logits = model.forward(eval);
  const LossResult loss = masked_cross_entropy(logits, eval.targets, false);
  const TokenIds pred = predictions(logits);
  EvalReport r;
  r.loss = loss.loss;
  r.accuracy = loss.accuracy;
  r.examples = static_cast<int>(eval.size());
  std::ostringstream os;
  os << "run " << run_dir << ": task " << to_string(c.task.kind) << ", step " << meta.step
     << ", scaling " << to_string(c.model.block.attention.sdpa.scaling) << ", d_k "
     << c.model.block.attention.head_dim_k() << "\n";
  os << "eval set (" << (valid.empty() ? "the task's fixed eval set" : valid)
     << "): " << eval.size() << " examples, " << loss.labelled << " labelled positions\n";
  char buf[160];
  std::snprintf(buf, sizeof buf, "loss %.4f  accuracy %.4f\n", r.loss, r.accuracy);
  os << buf;
  const std::size_t T = eval.length();
  const auto p = model.attention_weights(0);
  for (std::size_t b = 0;
       b < std::min<std::size_t>(static_cast<std::size_t>(std::max(show, 0)), eval.size()); ++b) {
    os << "\nexample " << b << ":\n";
    if (c.task.kind == TaskKind::recall) {
      os << "  pairs (key:value):";
      for (std::size_t t = 0; t + 1 < T; ++t)
        os << ' ' << eval.fields[0](b, t) << ':' << eval.fields[1](b, t);
      const int target = eval.targets(b, T - 1), guess = pred(b, T - 1);
      os << "\n  query key " << eval.fields[0](b, T - 1) << " -> predicted value " << guess
         << ", target " << target << (guess == target ? "  (right)" : "  (wrong)") << '\n';
      for (std::size_t h = 0; h < model.heads(); ++h) {
        std::vector<std::pair<float, std::size_t>> w;
        for (std::size_t j = 0; j < T; ++j) w.emplace_back(p(b, h, T - 1, j), j);
        std::sort(w.begin(), w.end(), [](auto& x, auto& y) { return x.first > y.first; });
        os << "  query attention (layer 0, head " << h << "), top keys:";
        for (std::size_t i = 0; i < std::min<std::size_t>(5, w.size()); ++i) {
          const std::size_t j = w[i].second;
          std::snprintf(buf, sizeof buf, " pos %zu (key %d%s) %.3f", j, eval.fields[0](b, j),
                        j + 1 == T ? ", the query itself" : "", static_cast<double>(w[i].first));
          os << buf << (i + 1 < std::min<std::size_t>(5, w.size()) ? "," : "");
        }
        os << '\n';
      }
    } else {
      os << "  input:    ";
      for (std::size_t t = 0; t < T; ++t) {
        for (std::size_t f = 0; f < eval.fields.size(); ++f)
          os << (f ? ":" : (t ? " " : "")) << eval.fields[f](b, t);
      }
      os << "\n  target:   ";
      for (std::size_t t = 0; t < T; ++t)
        os << (t ? " " : "")
           << (eval.targets(b, t) < 0 ? std::string("_") : std::to_string(eval.targets(b, t)));
      os << "\n  predicted:";
      for (std::size_t t = 0; t < T; ++t)
        os << ' ' << (eval.targets(b, t) < 0 ? std::string("_") : std::to_string(pred(b, t)));
      os << '\n';
    }
  }
  r.text = os.str();
  return r;
}

}  // namespace attnlab::app
