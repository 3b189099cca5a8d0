#include "attnlab/app/trainer.hpp"

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <limits>
#include <memory>
#include <optional>
#include <span>
#include <sstream>

#include <nlohmann/json.hpp>

#include "attnlab/app/data_file.hpp"
#include "attnlab/app/loss.hpp"
#include "attnlab/app/model.hpp"
#include "attnlab/app/param_groups.hpp"
#include "attnlab/app/progress.hpp"
#include "attnlab/app/run_checkpoint.hpp"
#include "attnlab/app/text.hpp"
#include "attnlab/app/token_file.hpp"
#include "attnlab/backends/cpu.hpp"
#include "attnlab/blas.hpp"
#include "attnlab/cuda.hpp"
#include "attnlab/distributed.hpp"
#include "attnlab/io/safetensors.hpp"
#include "attnlab/optim/schedule.hpp"
#include "attnlab/threads.hpp"
#include "train_backend.hpp"
#include "train_loop.hpp"
#include "train_metrics.hpp"
#include "train_saver.hpp"
#include "train_setup.hpp"

namespace attnlab::app {

namespace {

using json = nlohmann::json;
using Clock = TrainClock;

TrainResult train_impl(const TrainConfig& config_in, const Context& context, Communicator& comm,
                       const std::function<void()>& setup_done) {
  const int world = comm.size(), rank = comm.rank();
  const bool lead = rank == 0;
  TrainConfig c = config_in;
  prepare_token_task(c);
  prepare_task(c);
  const bool resuming = !c.resume.empty();
  const RunMeta resumed = resuming ? check_resume(config_in, c) : RunMeta{};
  validate(c);
  validate(context, "train");
  check_memory(estimate_memory(c), "train");
  const ThreadScope threads(context.threads);  // this thread's count, for this run only
  const TaskShape shape = task_shape(c.task);
  c.model = resolve_model(c.model, shape);  // the effective config records what the task decided
  const TrainData data(c, shape);
  const Shard shard = shard_rows(static_cast<std::size_t>(c.batch), rank, world, "train: batch");
  const Shard eval_shard = shard_rows(data.eval.size(), rank, world, "train: eval_size");
  const Batch eval = shard_of(data.eval, eval_shard);

  std::unique_ptr<DeviceOps<float>> own_ops;  // a CUDA backend made for this run
  DeviceOps<float>* ops = choose_ops(context, own_ops);
  const bool on_cpu = ops == &cpu_ops<float>();
  check_arg(!on_cpu || c.precision != GemmPrecision::tf32, "train", "precision",
            "fp32 or bf16 on the CPU backend (tf32 runs on a CUDA device)", "'tf32'");
  // The run's precision (lib/README.md, "Mixed precision"), for this run only: on the CPU the
  // float gemms', on a device its backend's (which refuses what it cannot run).
  const blas::GemmPrecisionScope precision(on_cpu ? c.precision : GemmPrecision::fp32);
  const PrecisionScope<float> device_precision(*ops, on_cpu ? GemmPrecision::fp32 : c.precision);
  Rng init_rng(c.seed);
  Rng data_rng(data_seed(c.seed));
  Model model(c.model, init_rng);
  ParameterList<float> params = model.parameters();
  const auto opt = std::make_unique<OptimizerGroups<float>>(make_optimizer_groups(c, params));
  const auto steps = static_cast<std::size_t>(c.steps);
  const LrSchedule schedule = make_schedule(c, steps);
  const std::size_t start = resuming ? resumed.step : 0;
  if (resuming) restore_training_state(c, resumed, params, *opt, data_rng);
  model.to(*ops);  // after the resume load (into the host copy); the optimizer follows
  TrainBackend backend(model, *opt, c.z_loss);
  backend.use_batch_threads(c.model, batch_threads(c, context, *ops, shard));

  std::optional<OutlierSkip> outliers = outlier_skip(c, resumed, resuming);
  std::optional<MetricsLog> log = open_outputs(c, model, lead, resuming, start);
  const RunSaver saver(
      c.out + "/model.safetensors", to_json_text(c), c.write_checkpoint && lead, c.weights_only,
      run_context_json(
          {.threads = context.threads, .thread_split = c.thread_split, .device = context.backend}));
  const ProgressFn progress = c.progress && lead ? terminal_progress() : ProgressFn();
  const std::vector<std::uint32_t> token_bytes = token_byte_table(c.task);
  const RunParts p{.c = c,
                   .context = context,
                   .comm = comm,
                   .data = data,
                   .shard = shard,
                   .eval = eval,
                   .model = model,
                   .params = params,
                   .opt = *opt,
                   .backend = backend,
                   .schedule = schedule,
                   .log = log,
                   .saver = saver,
                   .progress = progress,
                   .data_rng = data_rng,
                   .start = start,
                   .steps = steps,
                   .d_k = c.model.block.attention.head_dim_k(),
                   .token_bytes = token_bytes,
                   .lead = lead};
  setup_done();  // from here on every rank is in the run: an error is a RankFailure

  LoopState s(model.layers());
  s.outliers = std::move(outliers);
  s.t0 = Clock::now();
  first_eval(p, s, resuming);
  for (s.step = start; s.step < steps; ++s.step) {
    if (stop_before(p, s.step)) {
      s.result.interrupted = true;
      break;
    }
    if (!train_step(p, s)) break;
  }
  fill_result(p, s, shape);
  finish_outputs(p, s);
  return s.result;
}

}  // namespace

TrainResult train_model(const TrainConfig& config, const Context& context) {
  Communicator& comm = context.comm ? *context.comm : single_process();
  if (comm.size() == 1) return train_impl(config, context, comm, [] {});
  bool started = false;
  try {
    return train_impl(config, context, comm, [&] {
      agree_on_setup(comm, false, false);
      started = true;
    });
  } catch (const PeerFailure&) {
    throw;
  } catch (const ReplicaMismatch&) {
    throw;  // every rank throws it
  } catch (const std::exception& e) {
    if (started)
      throw RankFailure("rank " + std::to_string(comm.rank()) + " of " +
                        std::to_string(comm.size()) + ": " + e.what());
    agree_on_setup(comm, true, is_bad_input(e));
    throw;
  }
}

namespace {
// A saved run's config and trained model (on the CPU).
struct LoadedRun {
  RunMeta meta;
  TrainConfig config;
  std::unique_ptr<Model> model;
};
LoadedRun load_run(const std::string& run_dir) {
  const std::string path = run_dir + "/model.safetensors";
  LoadedRun r;
  r.meta = read_run_meta(path);
  // A BPE run reads its own copy of the tokenizer (the config keeps only its hash).
  r.config.task.tokenizer = run_dir + "/" + kTokenizerModel;
  read_saved_config(r.meta, path, r.config);
  check_memory(estimate_memory(r.config), "load " + path);
  Rng rng(r.config.seed);
  r.model = std::make_unique<Model>(resolve_model(r.config.model, task_shape(r.config.task)), rng);
  ParameterList<float> params = r.model->parameters();
  load_run_checkpoint(path, params, nullptr);
  return r;
}
}  // namespace

GenerateReport generate_from_run(const GenerateRequest& request, const Context& context,
                                 const std::function<void(const std::string&)>& on_text) {
  validate(context, "generate");
  check_arg(request.tokens >= 1, "generate", "tokens", ">= 1", std::to_string(request.tokens));
  const ThreadScope threads(context.threads);
  std::unique_ptr<DeviceOps<float>> own_ops;  // outlives the model on it
  DeviceOps<float>* ops = choose_ops(context, own_ops, "generate");
  LoadedRun run = load_run(request.run_dir);
  const TrainConfig& c = run.config;
  check_arg(c.task.kind == TaskKind::text, "generate", "checkpoint",
            "a run of task text (a language model)",
            "a run of task " + std::string(to_string(c.task.kind)) + " (" + request.run_dir + ")");
  const TextVocab vocab(c.task);
  check_arg(!request.prompt.empty(), "generate", "--prompt", "at least one character", "''");
  const std::vector<int> prompt = vocab.encode(request.prompt, "--prompt");
  if (ops != &cpu_ops<float>()) run.model->to(*ops);
  Sampler sampler(request.sampler);
  GenerateReport report;
  const auto t0 = Clock::now();
  const std::vector<int> ids =
      generate(run.model->transformer(), prompt, static_cast<std::size_t>(request.tokens), sampler,
               [&](int id) {
                 const std::string piece = vocab.decode(id);
                 report.text += piece;
                 if (on_text) on_text(piece);
                 return true;
               },
               {.use_cache = request.use_cache});
  report.seconds = std::chrono::duration<double>(Clock::now() - t0).count();
  report.tokens = static_cast<int>(ids.size());
  return report;
}

EvalReport evaluate_run(const std::string& run_dir, int show, const std::string& valid_file,
                        const std::string& logits_file) {
  LoadedRun run = load_run(run_dir);
  const RunMeta& meta = run.meta;
  const TrainConfig& c = run.config;
  const TaskShape shape = task_shape(c.task);
  Model& model = *run.model;
  const std::string valid = !valid_file.empty() ? valid_file : c.valid_file;
  const bool text = c.task.kind == TaskKind::text;
  const Batch eval = text            ? text_eval_set(c, valid, nullptr, "eval")
                     : valid.empty() ? eval_batch(c.task, static_cast<std::size_t>(c.eval_size))
                                     : read_data_file(valid, &shape);
  // In chunks of eval_rows, as the trainer evaluates; the first chunk also holds the shown
  // examples, whose attention weights are read after it.
  const std::size_t B = eval.size(), T = eval.length();
  const std::size_t first =
      std::min(B, std::max<std::size_t>(eval_rows(c), static_cast<std::size_t>(std::max(show, 0))));
  TokenIds pred({B, T});
  Tensor3<float> all_logits;  // (B, T, V) when logits_file asks for them
  LossSums sums;
  std::optional<TextVocab> vocab;  // loaded once (a BPE model is a file)
  if (text) vocab.emplace(c.task);
  const std::vector<std::uint32_t> token_bytes =
      text ? token_byte_table(*vocab) : std::vector<std::uint32_t>();
  Tensor4<float> shown_weights;
  for (std::size_t begin = 0; begin < B;) {
    const std::size_t end = begin == 0 ? first : std::min(B, begin + eval_rows(c));
    const Batch part = end - begin == B ? eval : slice_batch(eval, begin, end);
    const Tensor3<float> logits = model.forward(part);
    sums.add(masked_cross_entropy(logits, part.targets, false), part.targets, token_bytes);
    const TokenIds p = predictions(logits);
    std::copy(p.begin(), p.end(), pred.begin() + std::ptrdiff_t(begin * T));
    if (!logits_file.empty() && begin == 0)
      all_logits = Tensor3<float>::from_shape({B, T, logits.shape()[2]});
    if (!logits_file.empty())
      std::copy(logits.begin(), logits.end(),
                all_logits.begin() + std::ptrdiff_t(begin * T * logits.shape()[2]));
    if (begin == 0) shown_weights = model.attention_weights(0);
    begin = end;
  }
  if (!logits_file.empty())
    save_safetensors(logits_file, {make_stored_tensor<float>("logits", all_logits)},
                     {{"format", "pt"}});
  EvalReport r;
  r.loss = sums.mean_loss();
  r.accuracy = sums.accuracy();
  r.bits_per_byte = sums.bits_per_byte();
  const auto labelled = static_cast<std::size_t>(sums.labelled);
  r.examples = static_cast<int>(eval.size());
  std::ostringstream os;
  os << "run " << run_dir << ": task " << to_string(c.task.kind) << ", step " << meta.step
     << ", scaling " << to_string(c.model.block.attention.sdpa.scaling) << ", d_k "
     << c.model.block.attention.head_dim_k() << "\n";
  os << "eval set ("
     << (!valid.empty() ? valid
         : text         ? "the last 10% of " + c.data_file
                        : std::string("the task's fixed eval set"))
     << "): " << eval.size() << " examples, " << labelled << " labelled positions\n";
  char buf[160];
  std::snprintf(buf, sizeof buf, "loss %.4f  accuracy %.4f", r.loss, r.accuracy);
  os << buf;
  if (std::isfinite(r.bits_per_byte)) {
    std::snprintf(buf, sizeof buf, "  bits per byte %.4f", r.bits_per_byte);
    os << buf;
  }
  os << '\n';
  const auto& p = shown_weights;
  const bool bpe = text && c.task.vocab == VocabKind::bpe;
  for (std::size_t b = 0;
       b < std::min<std::size_t>(static_cast<std::size_t>(std::max(show, 0)), eval.size()); ++b) {
    os << "\nexample " << b << ":\n";
    if (text) {
      std::string input, predicted;
      for (std::size_t t = 0; t < T; ++t) {
        input += vocab->decode(eval.fields[0](b, t));
        predicted += vocab->decode(pred(b, t));
      }
      os << "  text:       "
         << nlohmann::json(input).dump(-1, ' ', false, nlohmann::json::error_handler_t::replace)
         << (bpe ? "\n  next tokens: " : "\n  next chars: ")
         << nlohmann::json(predicted).dump(-1, ' ', false, nlohmann::json::error_handler_t::replace)
         << (bpe ? "  (the model's most likely next token at each position, decoded)\n"
                 : "  (the model's most likely next character at each position)\n");
    } else if (c.task.kind == TaskKind::recall) {
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
