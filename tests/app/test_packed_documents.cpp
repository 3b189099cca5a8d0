// Packed documents in the text task (TrainConfig::pack_documents, attnlab/app/text.hpp): the
// documents a delimiter cuts, the batches' document ids and ignored targets at the boundaries,
// and, through the CLI, a packed run that trains and resumes exactly, and the bad inputs.
#include <doctest/doctest.h>

#include <cstdint>
#include <string>
#include <vector>

#include "attnlab/app/run_config.hpp"
#include "attnlab/app/tasks.hpp"
#include "attnlab/app/text.hpp"

using namespace attnlab;
using namespace attnlab::app;

TEST_CASE("text: packed documents: ids per row and no target across a boundary") {
  // Tokens: documents "1 2 3", "4 5", "6 7 8 9" cut by the two-token delimiter "0 0".
  const std::vector<int> tokens = {1, 2, 3, 0, 0, 4, 5, 0, 0, 6, 7, 8, 9};
  const DocumentBounds docs = find_documents(tokens, {0, 0});
  CHECK(docs.starts == std::vector<std::uint64_t>{0, 5, 9});
  CHECK(docs.delimiters == std::vector<std::uint64_t>{3, 7});
  CHECK(docs.delimiter_length == 2);

  // Every window of 6 tokens (offsets 0 .. 7), packed.
  const Batch b = text_eval_batch(tokens, 6, 100, &docs);
  REQUIRE(b.size() == 7);
  REQUIRE(b.documents.shape() == b.targets.shape());
  for (std::size_t r = 0; r < b.size(); ++r) {
    const std::size_t o = r;  // the eval offsets are 0 .. 6 here
    CAPTURE(o);
    for (std::size_t t = 0; t < 6; ++t) {
      const std::size_t at = o + t;
      // The document of token `at` (the delimiter ends its document), counted from the row's.
      const auto doc_of = [](std::size_t i) { return i < 5 ? 0 : i < 9 ? 1 : 2; };
      CHECK(b.documents(r, t) == doc_of(at) - doc_of(o));
      const bool delimiter = at == 3 || at == 4 || at == 7 || at == 8;
      const bool last = at == 4 || at == 8;  // the next token starts a document
      if (delimiter || last) {
        CHECK(b.targets(r, t) == kIgnoreIndex);
      } else {
        CHECK(b.targets(r, t) == tokens[at + 1]);
      }
    }
  }
  // Row 0: "1 2 3 0 0 4": the first content targets stay, the delimiter's are ignored.
  CHECK(b.targets(0, 0) == 2);
  CHECK(b.targets(0, 2) == 0);  // predicting the delimiter's first token from the document's last
  CHECK(b.targets(0, 3) == kIgnoreIndex);
  CHECK(b.targets(0, 4) == kIgnoreIndex);  // no prediction of "4" across the boundary

  // Rows are copied with their documents; unpacked batches have none.
  const Batch half = slice_batch(b, 2, 4);
  CHECK(half.documents(0, 0) == b.documents(2, 0));
  CHECK(half.documents(1, 5) == b.documents(3, 5));
  CHECK(text_eval_batch(tokens, 6, 3).documents.size() == 0);

  // A token file's documents: the recorded starts, no delimiter in the stream; the target before
  // each start is ignored.
  DocumentBounds recorded;
  recorded.starts = {0, 4};
  const Batch c = text_eval_batch(tokens, 6, 1, &recorded);
  CHECK(c.targets(0, 2) == 0);
  CHECK(c.targets(0, 3) == kIgnoreIndex);
  CHECK(c.documents(0, 3) == 0);
  CHECK(c.documents(0, 4) == 1);

  CHECK_THROWS_WITH_AS(find_documents(tokens, {}),
                       doctest::Contains("find_documents: delimiter expected at least one token"),
                       std::invalid_argument);
}

TEST_CASE("train: pack_documents' rules name the field") {
  TrainConfig c;
  c.task.kind = TaskKind::recall;
  c.pack_documents = "\n\n";
  CHECK_THROWS_WITH_AS(validate(c), doctest::Contains("pack_documents (--pack-documents)"),
                       std::invalid_argument);
  TrainConfig r;
  r.task.kind = TaskKind::recall;
  r.pack_rope_restart = true;
  CHECK_THROWS_WITH_AS(validate(r), doctest::Contains("pack_rope_restart (--pack-rope-restart)"),
                       std::invalid_argument);
}

#ifdef ATTNLAB_CLI_PATH

#include <filesystem>
#include <fstream>

#include "cli_runner.hpp"

using namespace attnlab::test;

TEST_CASE("cli: a packed text run trains, resumes exactly, and refuses bad input in one line") {
  const auto dir = scratch("packed");
  const std::string text = std::string(ATTNLAB_TEST_DATA_DIR) + "/text/hamlet_excerpt.txt";
  const std::string common = "train --task text --data '" + text +
                             "' --causal --block 32 --d-model 16 --heads 2 --positions rope "
                             "--batch 8 --eval-every 20 --eval-size 32 --threads 1 --quiet "
                             "--lr 0.01 --seed 5 --pack-documents --pack-rope-restart ";
  REQUIRE(cli(common + "--steps 60 --out '" + (dir / "full").string() + "'", dir).status == 0);
  const auto rows = csv_rows(slurp(dir / "full" / "metrics.csv"));
  REQUIRE(rows.size() >= 2);
  const double first = std::stod(rows.front().at("eval_loss"));
  const double last = std::stod(rows.back().at("eval_loss"));
  CHECK(last < first - 0.3);
  const auto config = nlohmann::json::parse(slurp(dir / "full" / "config.json"));
  CHECK(config.at("pack_documents") == "\n\n");  // the default: a blank line
  CHECK(config.at("pack_rope_restart") == true);

  // Stopped at step 20 and resumed: the same metrics as the unbroken run.
  const Run stopped =
      cli(common + "--steps 60 --stop-after 20 --out '" + (dir / "split").string() + "'", dir);
  CHECK(stopped.status == 130);
  REQUIRE(
      cli("train --quiet --resume '" + (dir / "split").string() + "' --threads 1", dir).status ==
      0);
  CHECK(slurp(dir / "split" / "metrics.csv") == slurp(dir / "full" / "metrics.csv"));

  // A delimiter given with escapes, and one that never occurs.
  REQUIRE(cli("train --task text --data '" + text +
                  "' --causal --block 16 --d-model 16 --heads 2 --batch 4 --eval-size 8 "
                  "--threads 1 --quiet --steps 2 --pack-documents '\\n\\n\\n' --out '" +
                  (dir / "three").string() + "'",
              dir)
              .status == 0);
  const std::string base = "train --task text --data '" + text +
                           "' --causal --block 16 --d-model 16 --heads 2 --steps 2 --quiet ";
  check_bad_input(base + "--pack-documents ''", dir,
                  "--pack-documents expected a non-empty delimiter");
  check_bad_input(base + "--pack-documents '\\q'", dir, "an unknown escape");
  check_bad_input(base + "--pack-documents 'zzzzzz'", dir, "found 0 times");
  check_bad_input(base + "--pack-documents 'ü'", dir, "a delimiter made of the text's characters");
  check_bad_input(base + "--pack-rope-restart", dir, "pack_rope_restart (--pack-rope-restart)");
  check_bad_input(base + "--pack-documents --pack-rope-restart", dir, "positions rope");
}

#endif  // ATTNLAB_CLI_PATH
