// attnlab tokenize: a BPE tokenizer (SentencePiece) trained on text files, and text files encoded
// into a token directory for `attnlab train --task text --data DIR`.
#include <algorithm>
#include <cstdio>

#include "attnlab/app/token_file.hpp"
#include "attnlab/app/tokenizer.hpp"
#include "commands.hpp"

namespace attnlab::cli {

using namespace attnlab::app;

void add_tokenize_command(CLI::App& cli, TokenizeCommand& t) {
  t.cmd = cli.add_subcommand(
      "tokenize", "train a BPE tokenizer (SentencePiece) and encode text into token files");
  t.cmd->require_subcommand(1);
  t.train = t.cmd->add_subcommand("train", "train a BPE model on the lines of text files");
  t.train->add_option("--data", t.train_options.files, "UTF-8 text files")->required();
  t.train
      ->add_option("--vocab-size", t.train_options.vocab_size,
                   "pieces, the 256 byte pieces and <unk> included")
      ->check(CLI::Range(1, 1 << 20))
      ->capture_default_str();
  t.train->add_option("--out", t.train_options.out, "the model file to write")->required();
  t.encode = t.cmd->add_subcommand(
      "encode",
      "write DIR/train.bin, val.bin (first 90% / last 10%), tokens.json, tokenizer.model");
  t.encode->add_option("--model", t.encode_options.model, "a model of attnlab tokenize train")
      ->required();
  t.encode->add_option("--data", t.encode_options.files, "UTF-8 text files, one document each")
      ->required();
  t.encode->add_option("--out", t.encode_options.out, "the token directory to write")->required();
  t.encode->add_option("--doc-delimiter", t.encode_options.doc_delimiter,
                       "also start a document after each occurrence of this string (which is not "
                       "encoded), e.g. '<|endoftext|>'");
}

int run_tokenize_command(const TokenizeCommand& t) {
  if (!sentencepiece_built()) throw BadInput(sentencepiece_missing("attnlab tokenize"));
  if (*t.train) {
    train_tokenizer(t.train_options);
    const Tokenizer model = Tokenizer::load(t.train_options.out);
    std::printf("wrote %s: a BPE model of %zu pieces (fnv1a64 %s)\n", t.train_options.out.c_str(),
                model.size(), model.hash().c_str());
    return 0;
  }
  const EncodeReport r = encode_token_files(t.encode_options);
  const TokenHeader& h = r.header;
  std::printf(
      "wrote %s: train.bin %llu tokens, val.bin %llu tokens (%s), %zu + %zu documents; %.1f MB of "
      "text in %.2f s (%.1f MB/s)\n",
      t.encode_options.out.c_str(), static_cast<unsigned long long>(h.train.tokens),
      static_cast<unsigned long long>(h.val.tokens), h.dtype_bytes == 2 ? "uint16" : "uint32",
      h.train.documents.size(), h.val.documents.size(), static_cast<double>(r.text_bytes) / 1e6,
      r.seconds, static_cast<double>(r.text_bytes) / 1e6 / std::max(r.seconds, 1e-9));
  return 0;
}

}  // namespace attnlab::cli
