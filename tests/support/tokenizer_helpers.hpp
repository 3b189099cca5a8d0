// The BPE tests' shared parts: the skip when attnlab is built without SentencePiece, and a tiny
// tokenizer and token directory made from the committed Hamlet excerpt.
//
// A test that needs SentencePiece starts with `if (!test::sentencepiece_or_skip()) return;`.
// Without it, it prints kSentencePieceSkipMarker, which tests/CMakeLists.txt registers as a ctest
// SKIP_REGULAR_EXPRESSION: ctest reports the test as skipped, not passed.
#pragma once

#include <filesystem>
#include <iostream>
#include <string>

#include "attnlab/app/token_file.hpp"
#include "attnlab/app/tokenizer.hpp"

namespace attnlab::test {

inline constexpr const char* kSentencePieceSkipMarker = "ATTNLAB_TEST_SKIPPED_NO_SENTENCEPIECE";

inline bool sentencepiece_or_skip() {
  if (app::sentencepiece_built()) return true;
  std::cout << kSentencePieceSkipMarker << ": attnlab was built without SentencePiece" << std::endl;
  return false;
}

inline const std::string kHamletExcerpt =
    std::string(ATTNLAB_TEST_DATA_DIR) + "/text/hamlet_excerpt.txt";

// The excerpt has 60-odd distinct characters: with the 256 byte pieces and <unk>, 384 pieces
// leave about 60 merges.
inline constexpr int kTinyVocab = 384;

// A BPE model of the excerpt, written to DIR/tok.model; returns its path.
inline std::string tiny_tokenizer(const std::filesystem::path& dir, int vocab = kTinyVocab) {
  const std::string out = (dir / "tok.model").string();
  app::train_tokenizer({{kHamletExcerpt}, vocab, out});
  return out;
}

}  // namespace attnlab::test
