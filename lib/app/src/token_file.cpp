#include "attnlab/app/token_file.hpp"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>

#include "attnlab/app/data_file.hpp"
#include "attnlab/app/text.hpp"
#include "attnlab/app/tokenizer.hpp"
#include "attnlab/io/safetensors.hpp"

namespace attnlab::app {

namespace {

[[noreturn]] void fail(const std::string& source, const std::string& what) {
  throw DataFileError(source + ": " + what);
}

std::string join(const std::string& dir, std::string_view name) {
  return (std::filesystem::path(dir) / name).string();
}

}  // namespace

TokenFile::TokenFile(const std::string& dir, const TokenHeader& h, std::string_view file)
    : path_(join(dir, file)), dtype_bytes_(h.dtype_bytes), documents_(h.part(file).documents) {
  const int fd = ::open(path_.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) fail(path_, std::string("cannot be opened (") + std::strerror(errno) + ")");
  struct Closer {
    int fd;
    ~Closer() { ::close(fd); }
  } closer{fd};
  struct stat st {};
  if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) fail(path_, "is not a regular file");
  const auto bytes = static_cast<std::uint64_t>(st.st_size);
  const char* dtype = dtype_bytes_ == 2 ? "uint16" : "uint32";
  if (bytes % static_cast<std::uint64_t>(dtype_bytes_) != 0)
    fail(path_, std::to_string(bytes) + " bytes is not a whole number of " + dtype +
                    " ids (truncated, or tokens.json's dtype is wrong)");
  tokens_ = bytes / static_cast<std::uint64_t>(dtype_bytes_);
  if (tokens_ != h.part(file).tokens)
    fail(path_, "holds " + std::to_string(tokens_) + " " + dtype + " ids but tokens.json says " +
                    std::to_string(h.part(file).tokens) + " (truncated, or the header is wrong)");
  // Every id below vocab_size, read in chunks: the map stays unresident until sampled.
  std::vector<char> chunk(std::size_t{1} << 20);
  std::uint64_t done = 0;
  while (done < bytes) {
    const auto want = static_cast<std::size_t>(std::min<std::uint64_t>(chunk.size(), bytes - done));
    const ssize_t got = ::pread(fd, chunk.data(), want, static_cast<off_t>(done));
    if (got <= 0) fail(path_, "cannot be read");
    const auto n = static_cast<std::size_t>(got) / static_cast<std::size_t>(dtype_bytes_);
    for (std::size_t i = 0; i < n; ++i) {
      std::uint32_t id = 0;
      if (dtype_bytes_ == 2) {
        std::uint16_t v;
        std::memcpy(&v, chunk.data() + 2 * i, 2);
        id = v;
      } else {
        std::memcpy(&id, chunk.data() + 4 * i, 4);
      }
      if (id >= h.vocab_size)
        fail(path_, "id " + std::to_string(id) + " at token " +
                        std::to_string(done / static_cast<std::uint64_t>(dtype_bytes_) + i) +
                        " is outside the vocabulary of " + std::to_string(h.vocab_size) +
                        " (tokens.json's vocab_size)");
    }
    done += n * static_cast<std::size_t>(dtype_bytes_);
    if (n == 0) fail(path_, "cannot be read");
  }
  if (bytes == 0) return;
  void* p = ::mmap(nullptr, bytes, PROT_READ, MAP_PRIVATE, fd, 0);
  if (p == MAP_FAILED)
    fail(path_, std::string("cannot be memory-mapped (") + std::strerror(errno) + ")");
  ::madvise(p, bytes, MADV_RANDOM);
  data_ = p;
  mapped_ = bytes;
}

void TokenFile::release(std::size_t first, std::size_t count) const {
  if (!data_ || count == 0) return;
  // The kernel maps the cached pages around a faulting one too (fault-around, 64 KB by default),
  // so the whole aligned span around the window goes.
  constexpr std::size_t kSpan = std::size_t{2} << 20;
  const std::size_t begin = first * static_cast<std::size_t>(dtype_bytes_) / kSpan * kSpan;
  const std::size_t end =
      std::min(mapped_, ((first + count) * static_cast<std::size_t>(dtype_bytes_) + kSpan - 1) /
                            kSpan * kSpan);
  ::madvise(static_cast<char*>(const_cast<void*>(data_)) + begin, end - begin, MADV_DONTNEED);
}

TokenFile::~TokenFile() {
  if (data_) ::munmap(const_cast<void*>(data_), mapped_);
}

namespace {
Batch blocks_at(const TokenFile& tokens, std::size_t block,
                const std::vector<std::size_t>& offsets) {
  Batch out;
  out.fields.push_back(TokenIds::from_shape({offsets.size(), block}));
  out.targets = TokenIds::from_shape({offsets.size(), block});
  for (std::size_t b = 0; b < offsets.size(); ++b) {
    for (std::size_t t = 0; t < block; ++t) {
      out.fields[0](b, t) = tokens[offsets[b] + t];
      out.targets(b, t) = tokens[offsets[b] + t + 1];
    }
    tokens.release(offsets[b], block + 1);
  }
  return out;
}
}  // namespace

DocumentBounds token_documents(const TokenFile& tokens, bool restart_positions) {
  DocumentBounds d;
  d.starts = tokens.documents();
  if (d.starts.empty()) d.starts.push_back(0);
  d.restart_positions = restart_positions;
  return d;
}

Batch token_batch(const TokenFile& tokens, std::size_t block, std::size_t batch, Rng& rng,
                  const DocumentBounds* docs) {
  const auto offsets = random_offsets(tokens.size(), block, batch, rng, "token_batch");
  Batch out = blocks_at(tokens, block, offsets);
  if (docs) pack_documents(out, *docs, offsets);
  return out;
}

Batch token_eval_batch(const TokenFile& tokens, std::size_t block, std::size_t n,
                       const DocumentBounds* docs) {
  const auto offsets = spread_offsets(tokens.size(), block, n, "token_eval_batch");
  Batch out = blocks_at(tokens, block, offsets);
  if (docs) pack_documents(out, *docs, offsets);
  return out;
}

void prepare_token_task(TrainConfig& c) {
  if (c.task.kind != TaskKind::text || c.data_file.empty()) return;
  const bool dir = std::filesystem::is_directory(c.data_file);
  if (!dir) {
    if (c.task.vocab == VocabKind::bpe)
      fail(c.data_file,
           "--vocab bpe trains on a token directory (tokens.json, train.bin, val.bin: "
           "attnlab tokenize encode --out DIR), not a file");
    return;
  }
  if (c.task.vocab == VocabKind::bytes ||
      (c.task.vocab == VocabKind::chars && !c.task.chars.empty()))
    fail(c.data_file, std::string("is a token directory of BPE ids; its vocabulary is bpe, not ") +
                          std::string(enum_name(c.task.vocab)));
  const TokenHeader h = read_token_header(c.data_file);
  const std::string model = join(c.data_file, h.tokenizer_model);
  if (!c.task.tokenizer_hash.empty() && c.task.tokenizer_hash != h.tokenizer_hash) {
    const std::string run_model = c.resume.empty() ? std::string("the run config's tokenizer")
                                                   : join(c.resume, kTokenizerModel);
    fail(join(c.data_file, kTokensJson), "its tokenizer " + model + " (hash " + h.tokenizer_hash +
                                             ") is not the run's, " + run_model + " (hash " +
                                             c.task.tokenizer_hash +
                                             "): encode the text with the run's tokenizer");
  }
  c.task.vocab = VocabKind::bpe;
  c.task.tokenizer = model;
  c.task.tokenizer_hash = h.tokenizer_hash;
}

TokenHeader check_token_dir(const TrainConfig& c) {
  const TokenHeader h = read_token_header(c.data_file);
  if (h.tokenizer_hash != c.task.tokenizer_hash) {
    fail(join(c.data_file, kTokensJson), "its tokenizer " + join(c.data_file, h.tokenizer_model) +
                                             " (hash " + h.tokenizer_hash + ") is not the run's, " +
                                             c.task.tokenizer + " (hash " + c.task.tokenizer_hash +
                                             "): encode the text with the run's tokenizer");
  }
  const std::size_t size = TextVocab(c.task).size();
  if (h.vocab_size != size)
    fail(join(c.data_file, kTokensJson), "vocab_size " + std::to_string(h.vocab_size) +
                                             " differs from its tokenizer's " +
                                             std::to_string(size) + " pieces");
  return h;
}

Batch token_eval_set(const TrainConfig& c) {
  const TokenHeader h = check_token_dir(c);
  const TokenFile val(c.data_file, h, kValBin);
  const DocumentBounds docs = token_documents(val, c.pack_rope_restart);
  return token_eval_batch(val, static_cast<std::size_t>(c.task.block),
                          static_cast<std::size_t>(c.eval_size),
                          c.pack_documents.empty() ? nullptr : &docs);
}

void copy_tokenizer(const TrainConfig& c, const std::string& run_dir) {
  const std::string to = join(run_dir, kTokenizerModel);
  if (std::filesystem::exists(to) && std::filesystem::equivalent(to, c.task.tokenizer)) return;
  write_file_atomic(to, Tokenizer::load(c.task.tokenizer).bytes());
}

}  // namespace attnlab::app
