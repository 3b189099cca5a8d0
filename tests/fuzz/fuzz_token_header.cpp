// libFuzzer target: parse_token_header (tokens.json of a token directory) of arbitrary bytes. It
// must either return a consistent header or throw DataFileError naming the source; an accepted
// header must survive token_header_json and a second parse unchanged. Anything else is a bug.
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include "attnlab/app/data_file.hpp"
#include "attnlab/app/token_file.hpp"

namespace {

void check_consistent(const attnlab::app::TokenHeader& h) {
  if (h.dtype_bytes != 2 && h.dtype_bytes != 4) __builtin_trap();
  if (h.vocab_size == 0 || (h.dtype_bytes == 2 && h.vocab_size > 65536)) __builtin_trap();
  if (h.tokenizer_hash.size() != 16 || h.tokenizer_model.empty()) __builtin_trap();
  for (const auto* part : {&h.train, &h.val}) {
    for (std::size_t i = 0; i < part->documents.size(); ++i) {
      if (part->documents[i] >= part->tokens) __builtin_trap();
      if (i ? part->documents[i] <= part->documents[i - 1] : part->documents[i] != 0)
        __builtin_trap();
    }
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  using namespace attnlab::app;
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  TokenHeader h;
  try {
    h = parse_token_header(text, "tokens.json");
  } catch (const DataFileError& e) {
    if (std::string(e.what()).rfind("tokens.json: ", 0) != 0) __builtin_trap();
    return 0;
  }
  check_consistent(h);
  const std::string again = token_header_json(h);
  const TokenHeader back = parse_token_header(again, "again");
  if (token_header_json(back) != again) __builtin_trap();
  return 0;
}
