#include "train_metrics.hpp"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <sstream>

#include <nlohmann/json.hpp>

#include "attnlab/app/loss.hpp"
#include "attnlab/io/safetensors.hpp"

namespace attnlab::app {

namespace {

constexpr double kTargetAccuracy = 0.95;

// The mechanism columns, in their order: per head, then per layer.
std::vector<std::string> mechanism_columns(std::size_t layers, std::size_t heads, bool qk_norm) {
  std::vector<std::string> out;
  for (std::size_t l = 0; l < layers; ++l)
    for (std::size_t h = 0; h < heads; ++h)
      for (const char* f : {"q_norm", "k_norm", "qk_cos", "wq_sigma1", "wk_sigma1"})
        out.push_back("l" + std::to_string(l) + "h" + std::to_string(h) + "_" + f);
  for (std::size_t l = 0; l < layers; ++l) {
    out.push_back("l" + std::to_string(l) + "_ln_gain_max");
    if (qk_norm)
      for (const char* f : {"qn_gamma_max", "qn_beta_norm", "kn_gamma_max", "kn_beta_norm"})
        out.push_back("l" + std::to_string(l) + "_" + f);
  }
  return out;
}

std::string csv_header(std::size_t layers, std::size_t heads, bool recall, bool z_loss,
                       bool skip_outliers, bool bits_per_byte, bool qk_norm) {
  std::ostringstream os;
  os << "step,loss,eval_loss,eval_acc,lr";
  for (std::size_t l = 0; l < layers; ++l)
    for (std::size_t h = 0; h < heads; ++h) {
      // Appended, not "l" + ...: GCC 12 at -O3 warns falsely (-Wrestrict) on literal + string.
      std::string p(1, 'l');
      p += std::to_string(l);
      p += 'h';
      p += std::to_string(h);
      p += '_';
      os << ',' << p << "entropy," << p << "max_logit," << p << "saturated," << p << "jacobian";
      if (recall) os << ',' << p << "recall_mass";
    }
  for (std::size_t l = 0; l < layers; ++l) {
    std::string p(1, 'l');
    p += std::to_string(l);
    p += '_';
    os << ',' << p << "wq_grad_norm," << p << "wk_grad_norm," << p << "wq_norm," << p << "wk_norm";
  }
  os << ",jacobian_mean";
  if (bits_per_byte) os << ",eval_bpb";
  if (z_loss) os << ",z_loss";
  if (skip_outliers) os << ",skipped";
  for (const auto& name : mechanism_columns(layers, heads, qk_norm)) os << ',' << name;
  return os.str();
}

std::string csv_number(double x) {
  if (!std::isfinite(x)) return std::isnan(x) ? "nan" : (x > 0 ? "inf" : "-inf");
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.7g", x);
  return buf;
}

}  // namespace

namespace {

// The running sums of a chunked evaluation (what reduce_eval sums across shards).
struct EvalSums {
  double rows = 0;
  LossSums loss;
  std::vector<double> head;  // per head: rows·(entropy, max weight, saturated, jacobian[, recall])
  std::vector<double> max_logit;
  std::vector<MaxLogitPair> pairs;          // per head: the set's max-logit pair so far
  double qk_n = 0, qk_mean = 0, qk_m2 = 0;  // Chan et al.'s pooled mean and squared deviations
};

// Adds one chunk's q·k values: its own two-pass mean and squared deviations, pooled exactly.
void add_dots(EvalSums& s, const Tensor4<float>& dots) {
  if (dots.size() == 0) return;
  double mean = 0, m2 = 0;
  for (float x : dots) mean += x;
  mean /= static_cast<double>(dots.size());
  for (float x : dots) m2 += (x - mean) * (x - mean);
  const double n = static_cast<double>(dots.size()), total = s.qk_n + n;
  const double delta = mean - s.qk_mean;
  s.qk_m2 += m2 + delta * delta * s.qk_n * n / total;
  s.qk_mean += delta * n / total;
  s.qk_n = total;
}

}  // namespace

void LossSums::add(const LossResult& chunk, const TokenIds& targets,
                   const std::vector<std::uint32_t>& token_bytes) {
  const auto lab = static_cast<double>(chunk.labelled);
  labelled += lab;
  loss += chunk.loss * lab;
  correct += std::round(chunk.accuracy * lab);  // a count: exact
  if (token_bytes.empty()) return;
  for (int t : targets) {
    if (t >= 0 && static_cast<std::size_t>(t) < token_bytes.size()) bytes += token_bytes[t];
  }
}

double LossSums::bits_per_byte() const {
  return bytes > 0 ? loss / (std::log(2.0) * bytes) : std::numeric_limits<double>::quiet_NaN();
}

EvalStats evaluate(TrainBackend& backend, std::size_t layers, const Batch& eval,
                   const TaskConfig& task, std::size_t d_k, std::size_t chunk,
                   const std::vector<std::uint32_t>& token_bytes) {
  check_arg(chunk > 0, "evaluate", "chunk", "at least 1 row", "0");
  EvalStats st;
  EvalSums sums;
  const bool recall = task.kind == TaskKind::recall;
  for (std::size_t begin = 0; begin < eval.size(); begin += chunk) {
    const std::size_t end = std::min(eval.size(), begin + chunk);
    const Batch part = chunk >= eval.size() ? eval : slice_batch(eval, begin, end);
    const auto rows = static_cast<double>(end - begin);
    const LossResult lr = masked_cross_entropy(backend.eval_logits(part), part.targets, false);
    sums.rows += rows;
    sums.loss.add(lr, part.targets, token_bytes);
    if (!std::isfinite(lr.loss) && st.nonfinite_row == static_cast<std::size_t>(-1))
      st.nonfinite_row = begin;
    const std::vector<int> key_pos = recall ? recall_key_positions(part) : std::vector<int>();
    std::size_t head_index = 0;
    for (std::size_t l = 0; l < layers; ++l) {
      LayerAttention a = backend.attention(l);
      const auto h = attention_health(a.weights, a.scores);
      const std::vector<double> mass =
          recall ? correct_key_mass(a.weights, part.length() - 1, key_pos) : std::vector<double>();
      const std::vector<MaxLogitPair> pairs =
          a.scores.size() > 0 && a.queries.size() > 0 && a.keys.size() > 0
              ? max_logit_pairs(a.scores, a.queries, a.keys)
              : std::vector<MaxLogitPair>(h.size());
      for (std::size_t i = 0; i < h.size(); ++i, ++head_index) {
        const std::size_t per_head = recall ? 5 : 4;
        if (sums.head.size() < (head_index + 1) * per_head) {
          sums.head.resize((head_index + 1) * per_head, 0.0);
          sums.max_logit.push_back(h[i].max_abs_logit);
          sums.pairs.emplace_back();
          sums.pairs.back().abs_logit = -1;  // no chunk yet
        }
        double* out = sums.head.data() + head_index * per_head;
        out[0] += rows * h[i].entropy;
        out[1] += rows * h[i].max_weight;
        out[2] += rows * h[i].saturated_fraction;
        out[3] += rows * h[i].jacobian_norm;
        if (recall) out[4] += rows * mass[i];
        // NaN (a diverged eval) stays NaN, as the whole set's maximum would
        double& m = sums.max_logit[head_index];
        if (std::isnan(h[i].max_abs_logit) || h[i].max_abs_logit > m) m = h[i].max_abs_logit;
        MaxLogitPair& pair = sums.pairs[head_index];  // NaN once a chunk's maximum is
        if (std::isnan(h[i].max_abs_logit)) {
          pair = MaxLogitPair{};
        } else if (!std::isnan(pair.abs_logit) && pairs[i].abs_logit > pair.abs_logit) {
          pair = pairs[i];
          pair.b += begin;
        }
      }
      if (l == 0) {
        add_dots(sums, a.dots);
        const std::size_t tq = a.weights.shape()[2], tk = a.weights.shape()[3];
        if (begin == 0 && a.weights.shape()[0] > 0 && a.weights.shape()[1] > 0) {
          st.example_tq = tq;
          st.example_tk = tk;
          st.example_attention.assign(a.weights.data(), a.weights.data() + tq * tk);
          st.example_key = key_pos.empty() ? -1 : key_pos[0];
        }
      }
    }
  }
  st.rows = static_cast<std::size_t>(sums.rows);
  st.labelled = static_cast<std::size_t>(sums.loss.labelled);
  st.loss = sums.loss.mean_loss();
  st.accuracy = sums.loss.accuracy();
  st.target_bytes = sums.loss.bytes;
  st.bits_per_byte = sums.loss.bits_per_byte();
  const std::size_t per_head = recall ? 5 : 4;
  for (std::size_t i = 0; i < sums.max_logit.size(); ++i) {
    const double* h = sums.head.data() + i * per_head;
    HeadHealth health;
    health.entropy = h[0] / sums.rows;
    health.max_weight = h[1] / sums.rows;
    health.saturated_fraction = h[2] / sums.rows;
    health.jacobian_norm = h[3] / sums.rows;
    health.max_abs_logit = sums.max_logit[i];
    st.health.push_back(health);
    st.pairs.push_back(sums.pairs[i].abs_logit < 0 ? MaxLogitPair{} : sums.pairs[i]);
    if (recall) st.recall_mass.push_back(h[4] / sums.rows);
  }
  st.qk_mean = sums.qk_mean;
  st.qk_count = static_cast<std::size_t>(sums.qk_n);
  st.qk_var_ratio = sums.qk_m2 / std::max(sums.qk_n - 1, 1.0) / static_cast<double>(d_k);
  return st;
}

void write_attention_file(const std::string& path, const EvalStats& init, std::size_t init_step,
                          const EvalStats& final_stats, std::size_t final_step) {
  const auto rows = [](const EvalStats& st) {
    nlohmann::json w = nlohmann::json::array();
    for (std::size_t i = 0; i < st.example_tq; ++i)
      w.push_back(std::vector<double>(
          st.example_attention.begin() + static_cast<std::ptrdiff_t>(i * st.example_tk),
          st.example_attention.begin() + static_cast<std::ptrdiff_t>((i + 1) * st.example_tk)));
    return w;
  };
  nlohmann::json j = {{"layer", 0},
                      {"head", 0},
                      {"example", 0},
                      {"query_position", static_cast<long>(final_stats.example_tq) - 1},
                      {"key_position", final_stats.example_key},
                      {"tq", final_stats.example_tq},
                      {"tk", final_stats.example_tk},
                      {"init", {{"step", init_step}, {"weights", rows(init)}}},
                      {"final", {{"step", final_step}, {"weights", rows(final_stats)}}}};
  write_file_atomic(path, std::string_view(j.dump() + "\n"));
}

void reduce_eval(Communicator& comm, EvalStats& st, std::size_t d_k) {
  if (comm.size() == 1) return;
  // Sums: [rows, labelled, loss·labelled, acc·labelled, qk count, qk sum, qk squares about 0,
  // then per head rows·(entropy, max weight, saturated, jacobian[, recall mass]), target bytes].
  const std::size_t heads = st.health.size();
  const bool recall = !st.recall_mass.empty();
  const std::size_t per_head = recall ? 5 : 4;
  std::vector<double> sums(8 + heads * per_head, 0.0);
  const auto rows = static_cast<double>(st.rows), lab = static_cast<double>(st.labelled);
  const auto n = static_cast<double>(st.qk_count);
  const double var = st.qk_var_ratio * static_cast<double>(d_k);
  sums[0] = rows;
  sums[1] = lab;
  sums[2] = st.loss * lab;
  sums[3] = st.accuracy * lab;
  sums[4] = n;
  sums[5] = st.qk_mean * n;
  sums[6] = var * std::max(n - 1, 1.0) + n * st.qk_mean * st.qk_mean;  // Σ x² = (n−1)s² + n·m²
  std::vector<double> maxima(heads);
  for (std::size_t i = 0; i < heads; ++i) {
    double* h = sums.data() + 7 + i * per_head;
    h[0] = rows * st.health[i].entropy;
    h[1] = rows * st.health[i].max_weight;
    h[2] = rows * st.health[i].saturated_fraction;
    h[3] = rows * st.health[i].jacobian_norm;
    if (recall) h[4] = rows * st.recall_mass[i];
    maxima[i] = st.health[i].max_abs_logit;
  }
  sums.back() = st.target_bytes;
  comm.allreduce_sum(sums.data(), sums.size());
  comm.allreduce_max(maxima.data(), maxima.size());
  st.rows = static_cast<std::size_t>(sums[0]);
  st.labelled = static_cast<std::size_t>(sums[1]);
  st.loss = sums[1] > 0 ? sums[2] / sums[1] : 0.0;
  st.accuracy = sums[1] > 0 ? sums[3] / sums[1] : 0.0;
  st.target_bytes = sums.back();
  if (st.target_bytes > 0) st.bits_per_byte = sums[2] / (std::log(2.0) * st.target_bytes);
  st.qk_count = static_cast<std::size_t>(sums[4]);
  st.qk_mean = sums[4] > 0 ? sums[5] / sums[4] : 0.0;
  const double ss = sums[6] - sums[4] * st.qk_mean * st.qk_mean;
  st.qk_var_ratio = ss / std::max(sums[4] - 1, 1.0) / static_cast<double>(d_k);
  for (std::size_t i = 0; i < heads; ++i) {
    const double* h = sums.data() + 7 + i * per_head;
    st.health[i].entropy = h[0] / sums[0];
    st.health[i].max_weight = h[1] / sums[0];
    st.health[i].saturated_fraction = h[2] / sums[0];
    st.health[i].jacobian_norm = h[3] / sums[0];
    if (recall) st.recall_mass[i] = h[4] / sums[0];
    st.health[i].max_abs_logit = maxima[i];
  }
  // The max-logit pairs: the figures of the rank(s) that hold the global maximum (their mean, if
  // two ranks tie), NaN when the maximum is.
  if (st.pairs.size() != heads) return;
  std::vector<double> at_max(4 * heads, 0.0);
  for (std::size_t i = 0; i < heads; ++i) {
    const MaxLogitPair& q = st.pairs[i];
    if (std::isnan(maxima[i]) || !(q.abs_logit == maxima[i])) continue;
    double* x = at_max.data() + 4 * i;
    x[0] = q.q_norm;
    x[1] = q.k_norm;
    x[2] = q.cos;
    x[3] = 1;
  }
  comm.allreduce_sum(at_max.data(), at_max.size());
  for (std::size_t i = 0; i < heads; ++i) {
    const double* x = at_max.data() + 4 * i;
    MaxLogitPair& q = st.pairs[i];
    if (x[3] > 0) {
      q.abs_logit = maxima[i];
      q.q_norm = x[0] / x[3];
      q.k_norm = x[1] / x[3];
      q.cos = x[2] / x[3];
    } else {
      q = MaxLogitPair{};
    }
  }
}

namespace {

// The .jsonl twin of a metrics.csv path.
std::string jsonl_path(const std::string& csv) {
  const std::string stem =
      csv.size() >= 4 && csv.ends_with(".csv") ? csv.substr(0, csv.size() - 4) : csv;
  return stem + ".jsonl";
}

// A JSON number, or null when not finite (JSON has no NaN or infinity).
nlohmann::json json_number(double x) {
  return std::isfinite(x) ? nlohmann::json(x) : nlohmann::json(nullptr);
}

}  // namespace

MetricsLog::MetricsLog(const std::string& path, std::size_t layers, std::size_t heads, bool recall,
                       const std::string& resume_csv, std::size_t resumed_step, bool z_loss,
                       bool skip_outliers, bool bits_per_byte, bool qk_norm)
    : path_(path),
      layers_(layers),
      heads_(heads),
      recall_(recall),
      z_loss_(z_loss),
      skip_outliers_(skip_outliers),
      bits_per_byte_(bits_per_byte),
      qk_norm_(qk_norm) {
  std::vector<std::string> kept_json;
  if (!resume_csv.empty()) {  // the JSON rows of the resumed run, up to the resumed step
    std::ifstream in(jsonl_path(resume_csv));
    std::string line;
    while (std::getline(in, line)) {
      const auto row = nlohmann::json::parse(line, nullptr, false);
      if (row.is_discarded() || !row.contains("step")) continue;
      if (row["step"].get<std::size_t>() <= resumed_step) kept_json.push_back(line);
    }
  }
  for (const auto& row : kept_json) jsonl_ += row + '\n';

  std::vector<std::string> kept;
  if (!resume_csv.empty()) {
    std::ifstream in(resume_csv);
    std::string line;
    std::getline(in, line);  // header
    // A text run written before the eval_bpb column: its kept rows get nan there, after the
    // jacobian_mean column.
    std::size_t pad_after = 0;  // commas before the insertion point; 0: no padding
    // A run written before the mechanism columns: its kept rows get nan in each, at the end.
    const std::vector<std::string> mechanism = mechanism_columns(layers, heads, qk_norm);
    const bool pad_mechanism =
        !mechanism.empty() && line.find("," + mechanism.front()) == std::string::npos;
    if (bits_per_byte && line.find(",eval_bpb") == std::string::npos) {
      const std::size_t at = line.find(",jacobian_mean");
      if (at != std::string::npos)
        pad_after = static_cast<std::size_t>(std::count(line.begin(), line.begin() + at, ',')) + 1;
    }
    while (std::getline(in, line)) {
      std::stringstream ss(line);
      std::string step_s, loss_s, eval_s, acc_s;
      std::getline(ss, step_s, ',');
      std::getline(ss, loss_s, ',');
      std::getline(ss, eval_s, ',');
      std::getline(ss, acc_s, ',');
      if (acc_s.empty()) continue;
      const auto step = std::stoul(step_s);
      if (step > resumed_step) continue;
      if (pad_after > 0) {  // before comma number pad_after (from 0), or at the end
        std::size_t pos = std::string::npos, from = 0;
        for (std::size_t k = 0; k <= pad_after; ++k) {
          pos = line.find(',', from);
          if (pos == std::string::npos) break;
          from = pos + 1;
        }
        line.insert(pos == std::string::npos ? line.size() : pos, ",nan");
      }
      if (pad_mechanism)
        for (std::size_t k = 0; k < mechanism.size(); ++k) line += ",nan";
      kept.push_back(line);
      if (step == 0) kept_init_eval_loss_ = std::stod(eval_s);
      if (std::stod(acc_s) >= kTargetAccuracy && steps_to_target_ < 0)
        steps_to_target_ = static_cast<int>(step);
    }
  }
  csv_ = csv_header(layers, heads, recall, z_loss, skip_outliers, bits_per_byte, qk_norm) + '\n';
  for (const auto& row : kept) csv_ += row + '\n';
  flush();
}

void MetricsLog::flush() {
  write_file_atomic(path_, std::string_view(csv_));
  write_file_atomic(jsonl_path(path_), std::string_view(jsonl_));
}

void MetricsLog::write(std::size_t step, double train_loss, double lr, const EvalStats& st,
                       const LayerNorms& norms, double train_z_term, bool skipped) {
  std::ostringstream row_csv;
  row_csv << step << ',' << csv_number(train_loss) << ',' << csv_number(st.loss) << ','
          << csv_number(st.accuracy) << ',' << csv_number(lr);
  double jac = 0;
  for (std::size_t i = 0; i < st.health.size(); ++i) {
    const auto& h = st.health[i];
    row_csv << ',' << csv_number(h.entropy) << ',' << csv_number(h.max_abs_logit) << ','
            << csv_number(h.saturated_fraction) << ',' << csv_number(h.jacobian_norm);
    if (recall_) row_csv << ',' << csv_number(st.recall_mass.at(i));
    jac += h.jacobian_norm;
  }
  for (std::size_t l = 0; l < norms.wq.size(); ++l)
    row_csv << ',' << csv_number(norms.wq_grad[l]) << ',' << csv_number(norms.wk_grad[l]) << ','
            << csv_number(norms.wq[l]) << ',' << csv_number(norms.wk[l]);
  const double jacobian_mean =
      st.health.empty() ? 0.0 : jac / static_cast<double>(st.health.size());
  row_csv << ',' << csv_number(jacobian_mean);
  if (bits_per_byte_) row_csv << ',' << csv_number(st.bits_per_byte);
  if (z_loss_) row_csv << ',' << csv_number(train_z_term);
  if (skip_outliers_) row_csv << ',' << (skipped ? 1 : 0);
  const auto at = [](const std::vector<double>& v, std::size_t i) {
    return i < v.size() ? v[i] : std::numeric_limits<double>::quiet_NaN();
  };
  const std::size_t cells = layers_ * heads_;
  for (std::size_t i = 0; i < cells; ++i) {
    const MaxLogitPair pair = i < st.pairs.size() ? st.pairs[i] : MaxLogitPair{};
    row_csv << ',' << csv_number(pair.q_norm) << ',' << csv_number(pair.k_norm) << ','
            << csv_number(pair.cos) << ',' << csv_number(at(norms.wq_sigma1, i)) << ','
            << csv_number(at(norms.wk_sigma1, i));
  }
  for (std::size_t l = 0; l < layers_; ++l) {
    row_csv << ',' << csv_number(at(norms.ln_gain_max, l));
    if (qk_norm_)
      row_csv << ',' << csv_number(at(norms.qn_gamma_max, l)) << ','
              << csv_number(at(norms.qn_beta_norm, l)) << ','
              << csv_number(at(norms.kn_gamma_max, l)) << ','
              << csv_number(at(norms.kn_beta_norm, l));
  }
  row_csv << '\n';
  csv_ += row_csv.str();

  nlohmann::json row = {{"step", step},
                        {"loss", json_number(train_loss)},
                        {"eval_loss", json_number(st.loss)},
                        {"eval_acc", json_number(st.accuracy)},
                        {"lr", json_number(lr)},
                        {"jacobian_mean", json_number(jacobian_mean)}};
  if (z_loss_) row["z_loss"] = json_number(train_z_term);
  if (skip_outliers_) row["skipped"] = skipped ? 1 : 0;
  if (bits_per_byte_) row["eval_bpb"] = json_number(st.bits_per_byte);
  nlohmann::json heads = nlohmann::json::array(), layers = nlohmann::json::array();
  for (std::size_t i = 0; i < st.health.size(); ++i) {
    const auto& h = st.health[i];
    nlohmann::json head = {{"layer", i / heads_},
                           {"head", i % heads_},
                           {"entropy", json_number(h.entropy)},
                           {"max_logit", json_number(h.max_abs_logit)},
                           {"saturated", json_number(h.saturated_fraction)},
                           {"jacobian", json_number(h.jacobian_norm)}};
    if (recall_) head["recall_mass"] = json_number(st.recall_mass.at(i));
    const MaxLogitPair pair = i < st.pairs.size() ? st.pairs[i] : MaxLogitPair{};
    head["q_norm"] = json_number(pair.q_norm);
    head["k_norm"] = json_number(pair.k_norm);
    head["qk_cos"] = json_number(pair.cos);
    head["wq_sigma1"] = json_number(at(norms.wq_sigma1, i));
    head["wk_sigma1"] = json_number(at(norms.wk_sigma1, i));
    heads.push_back(std::move(head));
  }
  for (std::size_t l = 0; l < norms.wq.size(); ++l) {
    nlohmann::json layer = {{"layer", l},
                            {"wq_grad_norm", json_number(norms.wq_grad[l])},
                            {"wk_grad_norm", json_number(norms.wk_grad[l])},
                            {"wq_norm", json_number(norms.wq[l])},
                            {"wk_norm", json_number(norms.wk[l])},
                            {"ln_gain_max", json_number(at(norms.ln_gain_max, l))}};
    if (qk_norm_) {
      layer["qn_gamma_max"] = json_number(at(norms.qn_gamma_max, l));
      layer["qn_beta_norm"] = json_number(at(norms.qn_beta_norm, l));
      layer["kn_gamma_max"] = json_number(at(norms.kn_gamma_max, l));
      layer["kn_beta_norm"] = json_number(at(norms.kn_beta_norm, l));
    }
    layers.push_back(std::move(layer));
  }
  row["heads"] = std::move(heads);
  row["layers"] = std::move(layers);
  jsonl_ += row.dump() + '\n';
  flush();
  if (st.accuracy >= kTargetAccuracy && steps_to_target_ < 0)
    steps_to_target_ = static_cast<int>(step);
}

}  // namespace attnlab::app
