// libFuzzer target: Tokenizer::from_bytes (a SentencePiece model file) of arbitrary bytes. It must
// either load a model that encodes and decodes a fixed text within its vocabulary, or throw
// DataFileError naming the source. Anything else is a bug.
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include "attnlab/app/data_file.hpp"
#include "attnlab/app/tokenizer.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  using namespace attnlab::app;
  const std::string_view bytes(reinterpret_cast<const char*>(data), size);
  try {
    const Tokenizer t = Tokenizer::from_bytes(bytes, "tok.model");
    for (const int id : t.encode("To be, or not to be: \xC3\xA9\xF0\x9F\x98\x80\n")) {
      if (id < 0 || static_cast<std::size_t>(id) >= t.size()) __builtin_trap();
      (void)t.token_bytes(id);
    }
  } catch (const DataFileError& e) {
    if (std::string(e.what()).rfind("tok.model: ", 0) != 0) __builtin_trap();
  }
  return 0;
}
