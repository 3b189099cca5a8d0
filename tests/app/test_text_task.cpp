// The `text` task (attnlab/app/text.hpp): UTF-8 decoding and the character vocabulary, the byte
// vocabulary, the 90/10 split, random training blocks with next-token targets, the fixed eval
// blocks, the bad inputs (empty file, a text shorter than a block, invalid UTF-8, a character
// outside the vocabulary), and a short training run on the committed Hamlet excerpt whose
// vocabulary travels in the checkpoint to generation.
#include <doctest/doctest.h>

#include <algorithm>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <functional>
#include <string>
#include <vector>

#include "attnlab/app/data_file.hpp"
#include "attnlab/app/run_config.hpp"
#include "attnlab/app/text.hpp"
#include "attnlab/app/trainer.hpp"
#include "temp_dir.hpp"

using namespace attnlab;
using namespace attnlab::app;

namespace {

const std::string kExcerpt = std::string(ATTNLAB_TEST_DATA_DIR) + "/text/hamlet_excerpt.txt";

std::string message_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const std::exception& e) {
    return e.what();
  }
  return "(no exception)";
}

TaskConfig char_task(const std::string& chars, int block = 8) {
  TaskConfig t;
  t.kind = TaskKind::text;
  t.chars = chars;
  t.block = block;
  return t;
}

void write(const std::filesystem::path& p, const std::string& bytes) {
  std::ofstream(p, std::ios::binary) << bytes;
}

}  // namespace

TEST_CASE("text: UTF-8 round trip, the character vocabulary, and the byte vocabulary") {
  const std::string text = "héllo, wörld €𝄞!";  // 1-, 2-, 3- and 4-byte characters
  const std::string chars = char_vocabulary(text, "t");
  CHECK(decode_utf8(chars, "c").size() == 13);  // distinct: h é l o , space w ö r d € 𝄞 !
  const TextVocab vocab(char_task(chars));
  CHECK(vocab.size() == 13);
  const std::vector<int> ids = vocab.encode(text, "t");
  CHECK(ids.size() == decode_utf8(text, "t").size());
  std::string back;
  for (int id : ids) back += vocab.decode(id);
  CHECK(back == text);
  // Ids follow code point order: ' ' (U+0020) is the smallest here.
  CHECK(vocab.decode(0) == " ");
  // Byte level: 256 symbols, nothing stored, any bytes.
  TaskConfig bytes = char_task("");
  bytes.vocab = VocabKind::bytes;
  const TextVocab byte_vocab(bytes);
  CHECK(byte_vocab.size() == 256);
  const std::string binary("\xff\x00\xc3", 3);
  const std::vector<int> raw = byte_vocab.encode(binary, "b");
  CHECK(raw == std::vector<int>{255, 0, 195});
  CHECK(task_shape(bytes).output_vocab == 256);
  CHECK(task_shape(char_task(chars, 5)).seq_len == 5);
}

TEST_CASE("text: invalid UTF-8 names the file, the byte offset and the byte vocabulary") {
  for (const auto& [bytes, offset] :
       std::vector<std::pair<std::string, int>>{{"ab\xff", 2},               // not a lead byte
                                                {"abc\xc3", 3},              // truncated sequence
                                                {"a\xc0\xaf", 1},            // overlong '/'
                                                {"xy\xed\xa0\x80", 2},       // a UTF-16 surrogate
                                                {"\xf4\x90\x80\x80", 0}}) {  // past U+10FFFF
    CAPTURE(bytes);
    const std::string m = message_of([&] { decode_utf8(bytes, "notes.txt"); });
    CHECK(m.find("notes.txt") != std::string::npos);
    CHECK(m.find("invalid UTF-8 at byte offset " + std::to_string(offset)) != std::string::npos);
    CHECK(m.find("--vocab byte") != std::string::npos);
  }
  const TextVocab vocab(char_task("abc"));
  const std::string m = message_of([&] { vocab.encode("abz", "--prompt"); });
  CHECK(m.find("--prompt") != std::string::npos);
  CHECK(m.find("'z' (U+007A) at character 2") != std::string::npos);
  CHECK(m.find("vocabulary of 3 characters") != std::string::npos);
  // A vocabulary that is not sorted and distinct is refused, naming task.chars.
  CHECK(message_of([] { TextVocab v(char_task("ba")); }).find("chars") != std::string::npos);
  CHECK(message_of([] { TextVocab v(char_task("")); }).find("chars") != std::string::npos);
}

TEST_CASE("text: the split, the training blocks and the fixed eval blocks") {
  std::vector<int> tokens(1000);
  for (std::size_t i = 0; i < tokens.size(); ++i) tokens[i] = static_cast<int>(i % 97);
  const TextData d = split_text(tokens, 16, "t");
  CHECK(d.train.size() == 900);
  CHECK(d.valid.size() == 100);
  CHECK(d.valid.front() == tokens[900]);
  Rng rng(3);
  const Batch b = text_batch(d.train, 16, 32, rng);
  REQUIRE(b.fields.size() == 1);
  CHECK(b.size() == 32);
  CHECK(b.length() == 16);
  for (std::size_t r = 0; r < b.size(); ++r) {
    for (std::size_t t = 0; t + 1 < 16; ++t) CHECK(b.targets(r, t) == b.fields[0](r, t + 1));
    // contiguous: consecutive tokens of the text (i % 97 steps by one)
    CHECK((b.fields[0](r, 1) - b.fields[0](r, 0) + 97) % 97 == 1);
  }
  // The eval set is fixed (no Rng) and spans the validation part end to end.
  const Batch e1 = text_eval_batch(d.valid, 16, 10), e2 = text_eval_batch(d.valid, 16, 10);
  CHECK(e1.fields[0] == e2.fields[0]);
  CHECK(e1.fields[0](0, 0) == d.valid[0]);
  CHECK(e1.targets(9, 15) == d.valid.back());
  CHECK(text_eval_batch(d.valid, 16, 1000).size() == 100 - 16);  // capped at the offsets there are
}

TEST_CASE("text: an empty file and a text shorter than a block are refused in one line") {
  test::TempDir dir;
  write(dir.path() / "empty.txt", "");
  write(dir.path() / "short.txt", std::string(100, 'a'));
  TrainConfig c;
  c.task.kind = TaskKind::text;
  c.model.block.attention.sdpa.causal = true;
  c.data_file = (dir.path() / "empty.txt").string();
  std::string m = message_of([&] { prepare_task(c); });
  CHECK(m.find("empty.txt") != std::string::npos);
  CHECK(m.find("is empty") != std::string::npos);
  c.data_file = (dir.path() / "short.txt").string();
  c.task.block = 16;
  c.steps = 1;
  c.out = (dir.path() / "run").string();
  c.progress = false;
  m = message_of([&] { train_model(c, Context{}); });
  CHECK(m.find("short.txt") != std::string::npos);
  CHECK(m.find("100 tokens is too short for blocks of 16") != std::string::npos);
  CHECK(!std::filesystem::exists(dir.path() / "run" / "model.safetensors"));  // nothing written
  // Not causal, or no --data: validate names the field.
  TrainConfig n = c;
  n.task.block = 4;
  prepare_task(n);
  n.model.block.attention.sdpa.causal = false;
  CHECK(message_of([&] { validate(n); }).find("sdpa.causal") != std::string::npos);
}

TEST_CASE(
    "text: a run on the Hamlet excerpt learns, and its vocabulary travels in the checkpoint") {
  test::TempDir dir;
  TrainConfig c;
  c.task.kind = TaskKind::text;
  c.task.block = 32;
  c.data_file = kExcerpt;
  c.model.layers = 2;
  c.model.block.attn_only = false;
  c.model.block.attention.d_model = 32;
  c.model.block.attention.heads = 2;
  c.model.block.attention.sdpa.causal = true;
  c.lr = 3e-3;
  c.steps = 120;
  c.batch = 16;
  c.eval_every = 60;
  c.eval_size = 32;
  c.out = (dir.path() / "run").string();
  c.progress = false;
  prepare_task(c);
  validate(c);
  const std::string chars = c.task.chars;
  CHECK(chars.find('H') != std::string::npos);
  CHECK(chars.find('\n') != std::string::npos);
  const TrainResult r = train_model(c, Context{});
  CHECK(r.final_eval_loss < r.init_eval_loss - 0.8);  // from ln(V) ~ 4 towards bigram statistics
  // The checkpoint's config holds the vocabulary: generation needs no data file.
  TrainConfig saved;
  read_run_config(c.out, saved);
  CHECK(saved.task.chars == chars);
  GenerateRequest g;
  g.run_dir = c.out;
  g.prompt = "Ham.\n";
  g.tokens = 40;
  g.sampler.seed = 5;
  std::string streamed;
  const GenerateReport a =
      generate_from_run(g, Context{}, [&](const std::string& s) { streamed += s; });
  CHECK(a.tokens == 40);
  CHECK(streamed == a.text);
  CHECK(generate_from_run(g, Context{}).text == a.text);  // a fixed seed reproduces the sample
  for (char ch : a.text) CHECK(chars.find(ch) != std::string::npos);
  g.sampler.greedy = true;
  const std::string greedy = generate_from_run(g, Context{}).text;
  g.sampler.seed = 99;
  CHECK(generate_from_run(g, Context{}).text == greedy);  // greedy: the seed plays no part
  g.use_cache = false;
  CHECK(generate_from_run(g, Context{}).text == greedy);  // the cache changes nothing
  // A prompt character outside the vocabulary: one clear error naming --prompt.
  g.prompt = "Ham\x01";
  const std::string m = message_of([&] { generate_from_run(g, Context{}); });
  CHECK(m.find("--prompt") != std::string::npos);
  CHECK(m.find("U+0001") != std::string::npos);
}

TEST_CASE(
    "text: bytes per token for bits per byte, and a big model's memory without its eval set") {
  // Character vocabulary: a character's UTF-8 length; byte vocabulary: 1; other tasks: no table.
  const TaskConfig chars = char_task("a\xc3\xa9\xe2\x82\xac\xf0\x9f\x98\x80");  // a é € 😀
  CHECK(token_byte_table(chars) == std::vector<std::uint32_t>{1, 2, 3, 4});
  CHECK(TextVocab(chars).token_bytes(3) == 4);
  TaskConfig bytes = chars;
  bytes.vocab = VocabKind::bytes;
  const auto table = token_byte_table(bytes);
  CHECK(table.size() == 256);
  CHECK(std::all_of(table.begin(), table.end(), [](std::uint32_t b) { return b == 1; }));
  TaskConfig recall;
  CHECK(token_byte_table(recall).empty());

  // The eval set runs in chunks of eval_rows rows: eval_size no longer sets the memory estimate.
  // The model that used to ask for 48.8 GiB (C 512, T 256, 4 layers, batch 8, 512 eval examples):
  TrainConfig c;
  c.task = bytes;
  c.task.block = 256;
  c.data_file = kExcerpt;
  c.model.block.attention.sdpa.causal = true;
  c.model.block.attention.d_model = 512;
  c.model.block.attention.heads = 8;
  c.model.block.attn_only = false;
  c.model.layers = 4;
  c.batch = 8;
  CHECK(eval_rows(c) == 8);
  const double small = estimate_memory(c).total();
  const double small_activations = estimate_memory(c).activations;  // 2 · batch rows
  CHECK(small < 4.0 * (1ull << 30));
  c.eval_size = 100000;
  CHECK(estimate_memory(c).total() == small);
  c.eval_batch = 64;  // larger eval chunks cost their activations
  CHECK(eval_rows(c) == 64);
  CHECK(estimate_memory(c).activations == doctest::Approx(small_activations * 64 / 16));
  CHECK(estimate_memory(c).total() > small);
  c.eval_size = 16;  // never more rows than the set has
  CHECK(eval_rows(c) == 16);
  // bf16 keeps each layer's rounded GEMM inputs for the backward, (3 C + F) / 2 floats a token, and
  // its rounded weights, half a float a parameter.
  c.eval_batch = 0;
  c.eval_size = 512;
  const MemoryEstimate fp32 = estimate_memory(c);
  c.precision = GemmPrecision::bf16;
  const double per_token = (3.0 * 512 + 2048) / 2 * 4;  // bytes
  CHECK(estimate_memory(c).activations - fp32.activations ==
        doctest::Approx(2.0 * 8 * 256 * 4 * per_token));
  CHECK(estimate_memory(c).parameters == doctest::Approx(fp32.parameters * 1.25));
  CHECK(estimate_memory(c).total() < 4.0 * (1ull << 30));
}
