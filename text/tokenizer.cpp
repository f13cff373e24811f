// kiln::text::Tokenizer: finding the files, the shared UTF-8 helpers, and TextStream.
#include "kiln/text/tokenizer.hpp"

#include <filesystem>
#include <fstream>
#include <sstream>

#include "kiln/core/error.hpp"
#include "kiln/text/detail.hpp"

namespace kiln::text {
namespace fs = std::filesystem;

Tokenizer Tokenizer::load(const std::string& path) {
  std::error_code ec;
  if (fs::is_directory(path, ec)) {
    const fs::path dir(path);
    const fs::path config = dir / "tokenizer_config.json";
    const std::string cfg = fs::exists(config, ec) ? config.string() : std::string();
    if (fs::exists(dir / "tokenizer.json", ec)) return Tokenizer(detail::load_hf_json((dir / "tokenizer.json").string(), cfg));
    if (fs::exists(dir / "tokenizer.model", ec)) return Tokenizer(detail::load_sentencepiece((dir / "tokenizer.model").string(), cfg));
    fail("tokenizer: the directory '{}' holds neither tokenizer.json nor tokenizer.model", path);
  }
  KILN_CHECK(fs::exists(path, ec), "tokenizer: '{}' does not exist (a model directory, tokenizer.json or tokenizer.model)", path);
  const fs::path file(path);
  const fs::path config = file.parent_path() / "tokenizer_config.json";
  const std::string cfg = fs::exists(config, ec) ? config.string() : std::string();
  bool json = file.extension() == ".json";
  if (file.extension() != ".json" && file.extension() != ".model") {  // sniff: JSON opens with '{'
    std::ifstream in(path, std::ios::binary);
    char c = 0;
    while (in.get(c) && std::isspace(static_cast<unsigned char>(c))) {
    }
    json = c == '{';
  }
  return Tokenizer(json ? detail::load_hf_json(path, cfg) : detail::load_sentencepiece(path, cfg));
}

std::vector<int32_t> Tokenizer::encode(std::string_view text, bool add_special_tokens) const {
  return impl_->encode(text, add_special_tokens);
}

std::string Tokenizer::decode(std::span<const int32_t> ids, bool skip_special_tokens) const {
  for (size_t i = 0; i < ids.size(); ++i)
    KILN_CHECK(ids[i] >= 0 && ids[i] < impl_->vocab_size, "tokenizer decode: id {} (position {}) is outside [0, {}) ({})", ids[i], i,
               impl_->vocab_size, impl_->path);
  return impl_->decode(ids, skip_special_tokens);
}

int32_t Tokenizer::vocab_size() const { return impl_->vocab_size; }
std::optional<int32_t> Tokenizer::bos_id() const { return impl_->bos; }
std::optional<int32_t> Tokenizer::eos_id() const { return impl_->eos; }
std::optional<int32_t> Tokenizer::unk_id() const { return impl_->unk; }
std::string Tokenizer::token(int32_t id) const {
  KILN_CHECK(id >= 0 && id < impl_->vocab_size, "tokenizer: id {} is outside [0, {}) ({})", id, impl_->vocab_size, impl_->path);
  return impl_->token(id);
}
std::optional<int32_t> Tokenizer::id(std::string_view piece) const { return impl_->id(piece); }
bool Tokenizer::is_special(int32_t id) const { return id >= 0 && id < impl_->vocab_size && impl_->is_special(id); }
std::string Tokenizer::description() const { return impl_->description; }
const std::string& Tokenizer::path() const { return impl_->path; }

// ---------------------------------------------------------------------------------------- TextStream
// As text-generation-inference's incremental detokenizer: decode a window of ids that starts a few
// tokens back (the context that decoders which strip or join across tokens need: SentencePiece drops
// the space of a window's first piece, and of the next one when the first is not a piece), and give
// out what the window adds beyond the text already given out, unless it ends in an unfinished
// character (decode shows those bytes as U+FFFD) or in a byte-fallback piece: a run of those decodes
// as a whole, to one U+FFFD per byte where its bytes are not valid UTF-8 together, so the next piece
// may still turn a character that the run's bytes make so far ("<0x2A>": "*") into U+FFFD.
constexpr size_t kContext = 4;  // ids of context before the new ones

namespace {
// A byte-fallback piece, "<0xE2>": a window must not start inside a run of them (the bytes of one
// character decode together).
bool byte_piece(const Tokenizer& tok, int32_t id) {
  if (id < 0 || id >= tok.vocab_size()) return false;
  std::string t;
  try {
    t = tok.token(id);
  } catch (const Error&) {  // a hole in the vocabulary
    return false;
  }
  return t.size() == 6 && t.compare(0, 3, "<0x") == 0 && t[5] == '>';
}
}  // namespace

TextStream::TextStream(Tokenizer tokenizer, bool skip_special_tokens) : tok_(std::move(tokenizer)), skip_special_(skip_special_tokens) {}

std::string TextStream::push(int32_t id) { return push(std::span<const int32_t>(&id, 1)); }

std::string TextStream::push(std::span<const int32_t> ids) {
  ids_.insert(ids_.end(), ids.begin(), ids.end());
  const std::span<const int32_t> all(ids_);
  const std::string before = tok_.decode(all.subspan(prefix_, read_ - prefix_), skip_special_);
  const std::string now = tok_.decode(all.subspan(prefix_), skip_special_);
  static constexpr std::string_view kReplacement = "\xEF\xBF\xBD";
  const bool unfinished =
      (now.size() >= 3 && std::string_view(now).substr(now.size() - 3) == kReplacement) || (!ids_.empty() && byte_piece(tok_, ids_.back()));
  if (now.size() <= before.size() || unfinished) return {};
  read_ = ids_.size();
  prefix_ = read_ > kContext ? read_ - kContext : 0;
  while (prefix_ > 0 && byte_piece(tok_, ids_[prefix_])) --prefix_;
  return now.substr(before.size());
}

std::string TextStream::finish() {
  const std::span<const int32_t> all(ids_);
  const std::string before = tok_.decode(all.subspan(prefix_, read_ - prefix_), skip_special_);
  const std::string now = tok_.decode(all.subspan(prefix_), skip_special_);
  read_ = ids_.size();
  prefix_ = read_ > kContext ? read_ - kContext : 0;
  return now.size() > before.size() ? now.substr(before.size()) : std::string();
}

// ---------------------------------------------------------------------------------------- UTF-8
namespace detail {

std::string read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  KILN_CHECK(in, "tokenizer: cannot open '{}'", path);
  std::ostringstream ss;
  ss << in.rdbuf();
  KILN_CHECK(!in.bad(), "tokenizer: cannot read '{}'", path);
  return ss.str();
}

void append_utf8(std::string& out, uint32_t cp) {
  if (cp < 0x80) {
    out += static_cast<char>(cp);
  } else if (cp < 0x800) {
    out += static_cast<char>(0xC0 | (cp >> 6));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  } else if (cp < 0x10000) {
    out += static_cast<char>(0xE0 | (cp >> 12));
    out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  } else {
    out += static_cast<char>(0xF0 | (cp >> 18));
    out += static_cast<char>(0x80 | ((cp >> 12) & 0x3F));
    out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  }
}

uint32_t next_code_point(std::string_view s, size_t& i) {
  const auto b = static_cast<unsigned char>(s[i]);
  if (b < 0x80) {
    ++i;
    return b;
  }
  const int n = b >= 0xF0 ? 4 : b >= 0xE0 ? 3 : 2;
  uint32_t cp = b & (0x7F >> n);
  for (int k = 1; k < n; ++k) cp = (cp << 6) | (static_cast<unsigned char>(s[i + k]) & 0x3F);
  i += n;
  return cp;
}

namespace {
// The length of the valid UTF-8 sequence at s[i], or 0 with `bad` = the length of the maximal invalid
// prefix (at least 1): Unicode's "maximal subpart" rule, which Rust's from_utf8_lossy follows.
size_t utf8_sequence(std::string_view s, size_t i, size_t& bad) {
  const auto b0 = static_cast<unsigned char>(s[i]);
  bad = 1;
  if (b0 < 0x80) return 1;
  int n = 0;
  unsigned char lo = 0x80, hi = 0xBF;
  if (b0 >= 0xC2 && b0 <= 0xDF)
    n = 2;
  else if (b0 == 0xE0)
    n = 3, lo = 0xA0;
  else if (b0 >= 0xE1 && b0 <= 0xEC)
    n = 3;
  else if (b0 == 0xED)
    n = 3, hi = 0x9F;
  else if (b0 >= 0xEE && b0 <= 0xEF)
    n = 3;
  else if (b0 == 0xF0)
    n = 4, lo = 0x90;
  else if (b0 >= 0xF1 && b0 <= 0xF3)
    n = 4;
  else if (b0 == 0xF4)
    n = 4, hi = 0x8F;
  else
    return 0;
  for (int k = 1; k < n; ++k) {
    if (i + k >= s.size()) return 0;
    const auto b = static_cast<unsigned char>(s[i + k]);
    if (b < (k == 1 ? lo : 0x80) || b > (k == 1 ? hi : 0xBF)) return 0;
    bad = static_cast<size_t>(k) + 1;
  }
  return static_cast<size_t>(n);
}
}  // namespace

size_t utf8_valid_prefix(std::string_view text) {
  size_t i = 0, bad = 0;
  while (i < text.size()) {
    if (static_cast<unsigned char>(text[i]) < 0x80) {
      ++i;
      continue;
    }
    const size_t n = utf8_sequence(text, i, bad);
    if (n == 0) return i;
    i += n;
  }
  return i;
}

std::string utf8_lossy(std::string_view bytes) {
  if (utf8_valid_prefix(bytes) == bytes.size()) return std::string(bytes);
  std::string out;
  size_t i = 0, bad = 0;
  while (i < bytes.size()) {
    const size_t n = utf8_sequence(bytes, i, bad);
    if (n) {
      out.append(bytes.substr(i, n));
      i += n;
    } else {
      out += "\xEF\xBF\xBD";
      i += bad;
    }
  }
  return out;
}

}  // namespace detail
}  // namespace kiln::text
