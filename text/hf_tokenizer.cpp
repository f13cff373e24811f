// tokenizer.json (Hugging Face `tokenizers`): a BPE, Unigram or WordPiece model with its normalizer,
// pre-tokenizer, added tokens, post-processor and decoder, and the rules of tokenizer_config.json that transformers applies
// on top. The pipeline, as `tokenizers` runs it (tokenizer/mod.rs, added_vocabulary.rs):
//   1. split the text on the added tokens that match the raw text (normalized: false), leftmost-longest,
//      with their lstrip / rstrip / single_word rules;
//   2. normalize each remaining piece, then split it on the added tokens that match normalized text;
//   3. pre-tokenize each remaining piece (regex splits through PCRE2, ByteLevel's byte-to-character map,
//      Metaspace's ▁, BERT's white space and punctuation) and run the model on every word;
//   4. the post-processor adds BOS/EOS (TemplateProcessing, or transformers' Llama rule).
// ByteLevel works on bytes here: instead of spelling each byte as its stand-in character and looking
// the characters up, the model maps bytes to ids directly (the same ids; the vocabulary is re-keyed by
// the bytes a byte-level token stands for).
#include <utf8proc.h>

#include <algorithm>
#include <array>
#include <cstring>
#include <map>
#include <mutex>
#include <unordered_map>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "kiln/core/error.hpp"
#include "kiln/text/detail.hpp"
#include "kiln/text/regex.hpp"

namespace kiln::text::detail {
namespace {

using json = nlohmann::json;

// ---------------------------------------------------------------------------------------- helpers
struct StringHash {
  using is_transparent = void;
  size_t operator()(std::string_view s) const noexcept { return std::hash<std::string_view>{}(s); }
};
template <class V> using StringMap = std::unordered_map<std::string, V, StringHash, std::equal_to<>>;

// Where a field lives, for messages: "tokenizer.json: pre_tokenizer.pretokenizers[0].behavior".
struct Ctx {
  std::string file;
  [[noreturn]] void fail(const std::string& field, const std::string& what) const {
    throw Error(fmt::format("tokenizer: {}: {}: {}", file, field, what));
  }
  const json& get(const json& j, const std::string& field, const char* key) const {
    if (!j.is_object() || !j.contains(key)) fail(field, fmt::format("the key '{}' is missing", key));
    return j.at(key);
  }
  std::string str(const json& j, const std::string& field, const char* key) const {
    const json& v = get(j, field, key);
    if (!v.is_string()) fail(field + "." + key, "must be a string");
    return v.get<std::string>();
  }
  bool boolean(const json& j, const std::string& field, const char* key, bool def) const {
    if (!j.contains(key) || j.at(key).is_null()) return def;
    if (!j.at(key).is_boolean()) fail(field + "." + key, "must be true or false");
    return j.at(key).get<bool>();
  }
};

// GPT-2's map from bytes to printable characters (the alphabet of byte-level vocabularies).
struct ByteMap {
  std::array<uint32_t, 256> to_char{};
  std::unordered_map<uint32_t, uint8_t> to_byte;
  ByteMap() {
    int n = 0;
    for (int b = 0; b < 256; ++b) {
      const bool printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
      to_char[b] = printable ? static_cast<uint32_t>(b) : static_cast<uint32_t>(256 + n++);
    }
    for (int b = 0; b < 256; ++b) to_byte[to_char[b]] = static_cast<uint8_t>(b);
  }
};
const ByteMap& byte_map() {
  static const ByteMap m;
  return m;
}

// The PCRE2 regex of a tokenizer.json field; compile errors name the file and the field.
std::unique_ptr<Regex> regex(const std::string& pattern, const Ctx& ctx, const std::string& field) {
  return std::make_unique<Regex>(pattern, fmt::format("tokenizer: {}: {}", ctx.file, field));
}

// Rust's char::is_whitespace / regex \s: the White_Space property.
bool is_white_space(uint32_t c) {
  return (c >= 0x09 && c <= 0x0D) || c == 0x20 || c == 0x85 || c == 0xA0 || c == 0x1680 || (c >= 0x2000 && c <= 0x200A) || c == 0x2028 ||
         c == 0x2029 || c == 0x202F || c == 0x205F || c == 0x3000;
}
// The code point that ends at s[end) (valid UTF-8), and where it starts.
uint32_t prev_code_point(std::string_view s, size_t end, size_t& begin) {
  begin = end - 1;
  while (begin > 0 && (static_cast<unsigned char>(s[begin]) & 0xC0) == 0x80) --begin;
  size_t i = begin;
  return next_code_point(s, i);
}
// s with every occurrence of `from` (not empty) replaced by `to`, left to right.
std::string replace_all(std::string_view s, std::string_view from, std::string_view to) {
  std::string out;
  size_t pos = 0, b = 0;
  while ((b = s.find(from, pos)) != std::string_view::npos) {
    out.append(s.substr(pos, b - pos));
    out.append(to);
    pos = b + from.size();
  }
  out.append(s.substr(pos));
  return out;
}
// Rust regex's \w: Alphabetic, marks, decimal digits, connector punctuation, joiners.
bool is_word_char(uint32_t c) {
  if (c == 0x200C || c == 0x200D) return true;
  const utf8proc_category_t cat = utf8proc_category(static_cast<utf8proc_int32_t>(c));
  switch (cat) {
    case UTF8PROC_CATEGORY_LU:
    case UTF8PROC_CATEGORY_LL:
    case UTF8PROC_CATEGORY_LT:
    case UTF8PROC_CATEGORY_LM:
    case UTF8PROC_CATEGORY_LO:
    case UTF8PROC_CATEGORY_NL:
    case UTF8PROC_CATEGORY_MN:
    case UTF8PROC_CATEGORY_MC:
    case UTF8PROC_CATEGORY_ME:
    case UTF8PROC_CATEGORY_ND:
    case UTF8PROC_CATEGORY_PC:
      return true;
    default:
      return false;
  }
}

// ---------------------------------------------------------------------------------------- normalizers
class Normalizer {
 public:
  virtual ~Normalizer() = default;
  virtual void apply(std::string& s) const = 0;
};

class UnicodeNormalizer : public Normalizer {
 public:
  explicit UnicodeNormalizer(int options) : options_(options) {}
  void apply(std::string& s) const override {
    if (std::all_of(s.begin(), s.end(), [](char c) { return static_cast<unsigned char>(c) < 0x80; })) return;
    utf8proc_uint8_t* out = nullptr;
    const utf8proc_ssize_t n = utf8proc_map(reinterpret_cast<const utf8proc_uint8_t*>(s.data()), static_cast<utf8proc_ssize_t>(s.size()),
                                            &out, static_cast<utf8proc_option_t>(options_));
    if (n < 0) throw Error(fmt::format("tokenizer: Unicode normalization failed: {}", utf8proc_errmsg(n)));
    s.assign(reinterpret_cast<char*>(out), static_cast<size_t>(n));
    std::free(out);
  }

 private:
  int options_;
};

class Prepend : public Normalizer {
 public:
  explicit Prepend(std::string p) : p_(std::move(p)) {}
  void apply(std::string& s) const override {
    if (!s.empty()) s.insert(0, p_);
  }

 private:
  std::string p_;
};

class Replace : public Normalizer {
 public:
  Replace(std::string pattern, std::unique_ptr<Regex> re, std::string content)
      : pattern_(std::move(pattern)), re_(std::move(re)), content_(std::move(content)) {}
  void apply(std::string& s) const override {
    std::string out;
    size_t pos = 0, b = 0, e = 0;
    if (re_) {
      while (pos <= s.size() && re_->find(s, pos, b, e)) {
        out.append(s, pos, b - pos);
        out += content_;
        if (e == b) {  // an empty match: keep one character and go on after it
          if (b == s.size()) {
            pos = b + 1;
            break;
          }
          size_t i = b;
          next_code_point(s, i);
          out.append(s, b, i - b);
          e = i;
        }
        pos = e;
      }
    } else {
      if (!pattern_.empty()) s = replace_all(s, pattern_, content_);
      return;
    }
    if (pos < s.size()) out.append(s, pos);
    s = std::move(out);
  }

 private:
  std::string pattern_;
  std::unique_ptr<Regex> re_;
  std::string content_;
};

class Strip : public Normalizer {
 public:
  Strip(bool left, bool right) : left_(left), right_(right) {}
  void apply(std::string& s) const override {
    size_t b = 0, e = s.size();
    if (left_) {
      while (b < e) {
        size_t i = b;
        if (!is_white_space(next_code_point(s, i))) break;
        b = i;
      }
    }
    if (right_) {
      while (e > b) {
        size_t start = 0;
        if (!is_white_space(prev_code_point(s, e, start))) break;
        e = start;
      }
    }
    s = s.substr(b, e - b);
  }

 private:
  bool left_, right_;
};

class NormalizerSequence : public Normalizer {
 public:
  explicit NormalizerSequence(std::vector<std::unique_ptr<Normalizer>> v) : v_(std::move(v)) {}
  void apply(std::string& s) const override {
    for (const auto& n : v_) n->apply(s);
  }

 private:
  std::vector<std::unique_ptr<Normalizer>> v_;
};

// Maps every code point of s through f, which appends its replacement (none: the code point is dropped).
template <class F> void map_code_points(std::string& s, F f) {
  std::string out;
  out.reserve(s.size() + s.size() / 4);
  for (size_t i = 0; i < s.size();) f(next_code_point(s, i), out);
  s = std::move(out);
}

// Rust's char::to_lowercase, one character at a time as tokenizers' NormalizedString::lowercase (no
// final-sigma rule): utf8proc's simple mapping, and U+0130 (the one character whose full lower case
// is two) as "i\u0307".
void append_lowercase(uint32_t c, std::string& out) {
  if (c < 0x80) {
    out += static_cast<char>(c >= 'A' && c <= 'Z' ? c + 32 : c);
  } else if (c == 0x130) {
    out += "i\xCC\x87";
  } else {
    append_utf8(out, static_cast<uint32_t>(utf8proc_tolower(static_cast<utf8proc_int32_t>(c))));
  }
}

bool is_nonspacing_mark(uint32_t c) { return utf8proc_category(static_cast<utf8proc_int32_t>(c)) == UTF8PROC_CATEGORY_MN; }

class Lowercase : public Normalizer {
 public:
  void apply(std::string& s) const override { map_code_points(s, append_lowercase); }
};

// tokenizers' StripAccents: drops the non-spacing marks (Mn); it does not decompose first.
class StripAccents : public Normalizer {
 public:
  void apply(std::string& s) const override {
    map_code_points(s, [](uint32_t c, std::string& out) {
      if (!is_nonspacing_mark(c)) append_utf8(out, c);
    });
  }
};

// tokenizers' Nmt (SentencePiece's nmt_nfkc without the NFKC): drops ASCII control characters and
// maps a few others to a space.
class Nmt : public Normalizer {
 public:
  void apply(std::string& s) const override {
    map_code_points(s, [](uint32_t c, std::string& out) {
      if ((c >= 0x01 && c <= 0x08) || c == 0x0B || (c >= 0x0E && c <= 0x1F) || c == 0x7F || c == 0x8F || c == 0x9F) return;
      const bool space = c == 0x09 || c == 0x0A || c == 0x0C || c == 0x0D || c == 0x1680 || (c >= 0x200B && c <= 0x200F) || c == 0x2028 ||
                         c == 0x2029 || c == 0x2581 || c == 0xFEFF || c == 0xFFFD;
      append_utf8(out, space ? ' ' : c);
    });
  }
};

// BERT's CJK ideographs (tokenizers' normalizers/bert.rs is_chinese_char): the blocks BERT's original
// code lists.
bool is_chinese_char(uint32_t c) {
  return (c >= 0x4E00 && c <= 0x9FFF) || (c >= 0x3400 && c <= 0x4DBF) || (c >= 0x20000 && c <= 0x2A6DF) || (c >= 0x2A700 && c <= 0x2B73F) ||
         (c >= 0x2B740 && c <= 0x2B81F) || (c >= 0x2B920 && c <= 0x2CEAF) || (c >= 0xF900 && c <= 0xFAFF) || (c >= 0x2F800 && c <= 0x2FA1F);
}

// tokenizers' BertNormalizer: clean_text (drop NUL, U+FFFD and the Cc / Cf / Co characters but tab, LF
// and CR, checked against tokenizers over every code point; every white space to ' '), spaces around CJK ideographs, strip_accents (NFD,
// then drop the non-spacing marks; default: as lowercase), lowercase, in that order.
class BertNormalizer : public Normalizer {
 public:
  BertNormalizer(bool clean_text, bool chinese, bool strip_accents, bool lowercase)
      : clean_(clean_text), chinese_(chinese), strip_(strip_accents), lower_(lowercase) {}
  void apply(std::string& s) const override {
    if (clean_)
      map_code_points(s, [](uint32_t c, std::string& out) {
        if (c == 0 || c == 0xFFFD) return;
        if (c != '\t' && c != '\n' && c != '\r') {
          const auto cat = utf8proc_category(static_cast<utf8proc_int32_t>(c));
          if (cat == UTF8PROC_CATEGORY_CC || cat == UTF8PROC_CATEGORY_CO) return;
          // the format characters of Unicode 11's tables (tokenizers' unicode_categories crate): those
          // that became Cf later stay
          if (cat == UTF8PROC_CATEGORY_CF && !(c == 0x890 || c == 0x891 || c == 0x8E2 || c == 0x110CD || (c >= 0x13430 && c <= 0x1343F)))
            return;
        }
        append_utf8(out, is_white_space(c) ? ' ' : c);
      });
    if (chinese_)
      map_code_points(s, [](uint32_t c, std::string& out) {
        if (is_chinese_char(c)) out += ' ';
        append_utf8(out, c);
        if (is_chinese_char(c)) out += ' ';
      });
    if (strip_) {
      nfd_.apply(s);
      map_code_points(s, [](uint32_t c, std::string& out) {
        if (!is_nonspacing_mark(c)) append_utf8(out, c);
      });
    }
    if (lower_) map_code_points(s, append_lowercase);
  }

 private:
  bool clean_, chinese_, strip_, lower_;
  UnicodeNormalizer nfd_{UTF8PROC_STABLE | UTF8PROC_DECOMPOSE};
};

// tokenizers' Precompiled (spm_precompiled): SentencePiece's compiled normalization rules, as T5, ALBERT
// and XLNet conversions carry them: a darts-clone double-array trie over the UTF-8 of the sources whose
// values index NUL-terminated replacements. Each extended grapheme cluster shorter than 6 bytes is
// replaced by the replacement of its shortest prefix that has one (tokenizers does it so, against
// XNLI); otherwise each of its characters by its own replacement, if any.
class Precompiled : public Normalizer {
 public:
  Precompiled(const std::string& blob, const Ctx& ctx, const std::string& field) {
    auto bad = [&](const std::string& what) { ctx.fail(field + ".precompiled_charsmap", what); };
    if (blob.size() < 4) bad("is shorter than its 4-byte header");
    uint32_t trie_bytes = 0;
    std::memcpy(&trie_bytes, blob.data(), 4);
    if (trie_bytes % 4 != 0 || blob.size() - 4 < trie_bytes)
      bad(fmt::format("names a trie of {} bytes in {} bytes", trie_bytes, blob.size()));
    units_.resize(trie_bytes / 4);
    std::memcpy(units_.data(), blob.data() + 4, trie_bytes);
    normalized_ = blob.substr(4 + trie_bytes);
    if (units_.empty()) bad("has an empty trie");
  }
  void apply(std::string& s) const override {
    if (s.empty()) return;
    std::string out;
    out.reserve(s.size());
    utf8proc_int32_t state = 0;
    size_t g = 0;  // start of the current grapheme
    for (size_t i = 0; i < s.size();) {
      const auto c = static_cast<utf8proc_int32_t>(next_code_point(s, i));
      if (i < s.size()) {
        size_t j = i;
        const auto next = static_cast<utf8proc_int32_t>(next_code_point(s, j));
        if (!utf8proc_grapheme_break_stateful(c, next, &state)) continue;
      }
      grapheme(std::string_view(s).substr(g, i - g), out);
      g = i;
    }
    s = std::move(out);
  }

 private:
  // The replacement of the shortest prefix of `key` that has one.
  std::optional<std::string_view> transform(std::string_view key) const {
    size_t pos = 0;
    uint32_t unit = units_[0];
    pos ^= offset(unit);
    for (const char ch : key) {
      const auto c = static_cast<uint8_t>(ch);
      if (c == 0) break;
      pos ^= c;
      if (pos >= units_.size()) return std::nullopt;
      unit = units_[pos];
      if ((unit & ((1u << 31) | 0xFFu)) != c) return std::nullopt;
      pos ^= offset(unit);
      if (pos >= units_.size()) return std::nullopt;
      if ((unit >> 8) & 1u) {
        const size_t v = units_[pos] & ((1u << 31) - 1);
        if (v >= normalized_.size()) return std::nullopt;
        const size_t e = normalized_.find('\0', v);
        return std::string_view(normalized_).substr(v, (e == std::string::npos ? normalized_.size() : e) - v);
      }
    }
    return std::nullopt;
  }
  static size_t offset(uint32_t unit) { return (unit >> 10) << ((unit & (1u << 9)) >> 6); }
  void grapheme(std::string_view g, std::string& out) const {
    if (g.size() < 6) {
      if (const auto n = transform(g)) {
        out.append(*n);
        return;
      }
    }
    for (size_t i = 0; i < g.size();) {
      const size_t b = i;
      next_code_point(g, i);
      const std::string_view part = g.substr(b, i - b);
      const auto n = transform(part);
      out.append(n ? *n : part);
    }
  }

  std::vector<uint32_t> units_;
  std::string normalized_;
};

// Standard base64 (the precompiled_charsmap of tokenizer.json).
std::string base64_decode(const std::string& in, const Ctx& ctx, const std::string& field) {
  std::string out;
  uint32_t acc = 0;
  int bits = 0;
  for (const char ch : in) {
    int v = -1;
    if (ch >= 'A' && ch <= 'Z')
      v = ch - 'A';
    else if (ch >= 'a' && ch <= 'z')
      v = ch - 'a' + 26;
    else if (ch >= '0' && ch <= '9')
      v = ch - '0' + 52;
    else if (ch == '+')
      v = 62;
    else if (ch == '/')
      v = 63;
    else if (ch == '=')
      break;
    else
      ctx.fail(field, "is not base64");
    acc = (acc << 6) | static_cast<uint32_t>(v);
    bits += 6;
    if (bits >= 8) {
      bits -= 8;
      out += static_cast<char>((acc >> bits) & 0xFF);
    }
  }
  return out;
}

// The "pattern" of Split / Replace: {"String": "..."} or {"Regex": "..."}.
std::pair<std::string, std::unique_ptr<Regex>> parse_pattern(const json& j, const Ctx& ctx, const std::string& field) {
  const json& p = ctx.get(j, field, "pattern");
  if (p.is_object() && p.contains("Regex") && p.at("Regex").is_string())
    return {p.at("Regex").get<std::string>(), regex(p.at("Regex").get<std::string>(), ctx, field + ".pattern.Regex")};
  if (p.is_object() && p.contains("String") && p.at("String").is_string()) return {p.at("String").get<std::string>(), nullptr};
  ctx.fail(field + ".pattern", "must be {\"String\": ...} or {\"Regex\": ...}");
}

std::unique_ptr<Normalizer> parse_normalizer(const json& j, const Ctx& ctx, const std::string& field) {
  if (j.is_null()) return nullptr;
  const std::string type = ctx.str(j, field, "type");
  if (type == "NFC") return std::make_unique<UnicodeNormalizer>(UTF8PROC_STABLE | UTF8PROC_COMPOSE);
  if (type == "NFD") return std::make_unique<UnicodeNormalizer>(UTF8PROC_STABLE | UTF8PROC_DECOMPOSE);
  if (type == "NFKC") return std::make_unique<UnicodeNormalizer>(UTF8PROC_STABLE | UTF8PROC_COMPOSE | UTF8PROC_COMPAT);
  if (type == "NFKD") return std::make_unique<UnicodeNormalizer>(UTF8PROC_STABLE | UTF8PROC_DECOMPOSE | UTF8PROC_COMPAT);
  if (type == "Prepend") return std::make_unique<Prepend>(ctx.str(j, field, "prepend"));
  if (type == "Replace") {
    auto [pattern, re] = parse_pattern(j, ctx, field);
    return std::make_unique<Replace>(pattern, std::move(re), ctx.str(j, field, "content"));
  }
  if (type == "Strip")
    return std::make_unique<Strip>(ctx.boolean(j, field, "strip_left", false), ctx.boolean(j, field, "strip_right", false));
  if (type == "Lowercase") return std::make_unique<Lowercase>();
  if (type == "Precompiled") {
    const json& m = ctx.get(j, field, "precompiled_charsmap");
    if (m.is_null()) return nullptr;  // tokenizers: no charsmap, no normalization
    if (!m.is_string()) ctx.fail(field + ".precompiled_charsmap", "must be a base64 string");
    const std::string blob = base64_decode(m.get<std::string>(), ctx, field + ".precompiled_charsmap");
    if (blob.empty()) return nullptr;
    return std::make_unique<Precompiled>(blob, ctx, field);
  }
  if (type == "StripAccents") return std::make_unique<StripAccents>();
  if (type == "Nmt") return std::make_unique<Nmt>();
  if (type == "BertNormalizer") {
    const bool lowercase = ctx.boolean(j, field, "lowercase", true);
    return std::make_unique<BertNormalizer>(ctx.boolean(j, field, "clean_text", true), ctx.boolean(j, field, "handle_chinese_chars", true),
                                            ctx.boolean(j, field, "strip_accents", lowercase), lowercase);
  }
  if (type == "Sequence") {
    const json& list = ctx.get(j, field, "normalizers");
    if (!list.is_array()) ctx.fail(field + ".normalizers", "must be a list");
    std::vector<std::unique_ptr<Normalizer>> v;
    for (size_t i = 0; i < list.size(); ++i)
      if (auto n = parse_normalizer(list[i], ctx, fmt::format("{}.normalizers[{}]", field, i))) v.push_back(std::move(n));
    return std::make_unique<NormalizerSequence>(std::move(v));
  }
  ctx.fail(field + ".type",
           fmt::format("the normalizer '{}' is not supported (kiln: NFC, NFD, NFKC, NFKD, Prepend, Replace, Strip, Lowercase, "
                       "StripAccents, Nmt, BertNormalizer, Sequence)",
                       type));
}

// ---------------------------------------------------------------------------------------- pre-tokenizers
// Pieces are byte ranges of one buffer; a stage may append new text to the buffer and point at it.
struct Piece {
  uint32_t begin, end;
  bool first;  // starts at offset 0 of the original text (Metaspace's prepend_scheme "first")
};

class PreTokenizer {
 public:
  virtual ~PreTokenizer() = default;
  virtual void apply(std::string& buf, std::vector<Piece>& pieces) const = 0;
  virtual bool byte_level() const { return false; }  // ByteLevel: the model reads the pieces as bytes
};

enum class Behavior { Isolated, Removed, MergedWithPrevious, MergedWithNext, Contiguous };

using CharClass = bool (*)(uint32_t);

// Splits every piece on the matches of a pattern (a regex, a literal, or each character of a class),
// as tokenizers' NormalizedString::split.
void split_pieces(const std::string& buf, std::vector<Piece>& pieces, const Regex* re, const std::string& literal, Behavior behavior,
                  CharClass char_class = nullptr) {
  std::vector<Piece> out;
  out.reserve(pieces.size() * 4);
  for (const Piece& p : pieces) {
    const std::string_view s(buf.data() + p.begin, p.end - p.begin);
    // (begin, end, is_match) spans covering s
    std::vector<std::tuple<size_t, size_t, bool>> spans;
    size_t pos = 0, b = 0, e = 0;
    if (char_class) {  // every character of the class is a match of its own
      for (size_t i = 0; i < s.size();) {
        const size_t cb = i;
        if (!char_class(next_code_point(s, i))) continue;
        if (cb > pos) spans.emplace_back(pos, cb, false);
        spans.emplace_back(cb, i, true);
        pos = i;
      }
    }
    while (!char_class && pos < s.size()) {
      bool found = false;
      if (re) {
        found = re->find(s, pos, b, e);
      } else if (!literal.empty()) {
        b = s.find(literal, pos);
        found = b != std::string_view::npos;
        e = b + literal.size();
      }
      if (!found) break;
      if (e == b) {  // empty match: no split here
        size_t i = b;
        if (i >= s.size()) break;
        next_code_point(s, i);
        pos = i;
        continue;
      }
      if (b > pos) spans.emplace_back(pos, b, false);
      spans.emplace_back(b, e, true);
      pos = e;
    }
    if (pos < s.size()) spans.emplace_back(pos, s.size(), false);
    // merge according to the behavior
    std::vector<std::pair<size_t, size_t>> parts;
    switch (behavior) {
      case Behavior::Isolated:
        for (auto& [sb, se, m] : spans) parts.emplace_back(sb, se);
        break;
      case Behavior::Removed:
        for (auto& [sb, se, m] : spans)
          if (!m) parts.emplace_back(sb, se);
        break;
      case Behavior::MergedWithPrevious: {
        bool prev_gap = false;
        for (auto& [sb, se, m] : spans) {
          if (m && prev_gap)
            parts.back().second = se;
          else
            parts.emplace_back(sb, se);
          prev_gap = !m;
        }
        break;
      }
      case Behavior::MergedWithNext: {
        bool prev_match = false;
        for (auto& [sb, se, m] : spans) {
          if (!m && prev_match)
            parts.back().second = se;
          else
            parts.emplace_back(sb, se);
          prev_match = m;
        }
        break;
      }
      case Behavior::Contiguous: {
        bool prev_match = false;
        for (auto& [sb, se, m] : spans) {
          if (m && prev_match)
            parts.back().second = se;
          else
            parts.emplace_back(sb, se);
          prev_match = m;
        }
        break;
      }
    }
    for (auto& [sb, se] : parts)
      if (se > sb) out.push_back({static_cast<uint32_t>(p.begin + sb), static_cast<uint32_t>(p.begin + se), p.first && sb == 0});
  }
  pieces = std::move(out);
}

class SplitPre : public PreTokenizer {
 public:
  SplitPre(std::string literal, std::unique_ptr<Regex> re, Behavior b) : literal_(std::move(literal)), re_(std::move(re)), behavior_(b) {}
  void apply(std::string& buf, std::vector<Piece>& pieces) const override { split_pieces(buf, pieces, re_.get(), literal_, behavior_); }

 private:
  std::string literal_;
  std::unique_ptr<Regex> re_;
  Behavior behavior_;
};

const char* kGpt2Pattern = R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";

}  // namespace

void byte_level_pieces(std::string_view text, const std::function<void(std::string_view)>& piece) {
  static const Regex re(kGpt2Pattern, "tokenizer: (GPT-2 pre-tokenizer): pattern");
  // as split_pieces with Behavior::Isolated: the matches and the text between them (the GPT-2 regex
  // leaves none, but a gap would be a piece of its own there too)
  size_t pos = 0, at = 0, begin = 0, end = 0;
  while (at < text.size() && re.find(text, at, begin, end)) {
    if (end == begin) {  // empty match: no split here
      at = begin;
      if (at >= text.size()) break;
      next_code_point(text, at);
      continue;
    }
    if (begin > pos) piece(text.substr(pos, begin - pos));
    piece(text.substr(begin, end - begin));
    pos = at = end;
  }
  if (pos < text.size()) piece(text.substr(pos));
}
uint32_t byte_level_char(uint8_t b) { return byte_map().to_char[b]; }

namespace {

class ByteLevelPre : public PreTokenizer {
 public:
  ByteLevelPre(bool add_prefix_space, bool use_regex, const Ctx& ctx, const std::string& field) : add_prefix_space_(add_prefix_space) {
    if (use_regex) re_ = regex(kGpt2Pattern, ctx, field);
  }
  void apply(std::string& buf, std::vector<Piece>& pieces) const override {
    if (add_prefix_space_) {
      for (Piece& p : pieces) {
        if (p.end > p.begin && buf[p.begin] == ' ') continue;
        const std::string moved = " " + buf.substr(p.begin, p.end - p.begin);
        p.begin = static_cast<uint32_t>(buf.size());
        buf += moved;
        p.end = static_cast<uint32_t>(buf.size());
      }
    }
    if (re_) split_pieces(buf, pieces, re_.get(), {}, Behavior::Isolated);
  }
  bool byte_level() const override { return true; }

 private:
  bool add_prefix_space_;
  std::unique_ptr<Regex> re_;
};

enum class PrependScheme { Always, First, Never };

class MetaspacePre : public PreTokenizer {
 public:
  MetaspacePre(std::string replacement, PrependScheme scheme, bool split) : rep_(std::move(replacement)), scheme_(scheme), split_(split) {}
  void apply(std::string& buf, std::vector<Piece>& pieces) const override {
    for (Piece& p : pieces) {
      std::string s;
      const bool prepend = (scheme_ == PrependScheme::Always || (scheme_ == PrependScheme::First && p.first));
      for (uint32_t i = p.begin; i < p.end; ++i) {
        if (buf[i] == ' ')
          s += rep_;
        else
          s += buf[i];
      }
      if (prepend && s.rfind(rep_, 0) != 0) s.insert(0, rep_);
      p.begin = static_cast<uint32_t>(buf.size());
      buf += s;
      p.end = static_cast<uint32_t>(buf.size());
    }
    if (split_) split_pieces(buf, pieces, nullptr, rep_, Behavior::MergedWithNext);
  }

 private:
  std::string rep_;
  PrependScheme scheme_;
  bool split_;
};

// Rust's char::is_ascii_punctuation || unicode_categories' is_punctuation (Pc Pd Ps Pe Pi Pf Po).
bool is_bert_punctuation(uint32_t c) {
  if (c < 0x80) return (c >= 0x21 && c <= 0x2F) || (c >= 0x3A && c <= 0x40) || (c >= 0x5B && c <= 0x60) || (c >= 0x7B && c <= 0x7E);
  switch (utf8proc_category(static_cast<utf8proc_int32_t>(c))) {
    case UTF8PROC_CATEGORY_PC:
    case UTF8PROC_CATEGORY_PD:
    case UTF8PROC_CATEGORY_PS:
    case UTF8PROC_CATEGORY_PE:
    case UTF8PROC_CATEGORY_PI:
    case UTF8PROC_CATEGORY_PF:
    case UTF8PROC_CATEGORY_PO:
      return true;
    default:
      return false;
  }
}

// Splits on a character class: BertPreTokenizer (white space removed, then each punctuation character
// apart), WhitespaceSplit, Punctuation.
class CharSplitPre : public PreTokenizer {
 public:
  CharSplitPre(CharClass cls, Behavior b) : cls_(cls), behavior_(b) {}
  void apply(std::string& buf, std::vector<Piece>& pieces) const override { split_pieces(buf, pieces, nullptr, {}, behavior_, cls_); }

 private:
  CharClass cls_;
  Behavior behavior_;
};

// tokenizers' Whitespace: the runs of \w+ and of [^\w\s]+ (Rust regex classes); white space is dropped.
class WhitespacePre : public PreTokenizer {
 public:
  void apply(std::string& buf, std::vector<Piece>& pieces) const override {
    std::vector<Piece> out;
    for (const Piece& p : pieces) {
      const std::string_view s(buf.data() + p.begin, p.end - p.begin);
      size_t run = 0;
      int kind = 0;  // of the open run: 0 none, 1 word, 2 other
      for (size_t i = 0; i < s.size();) {
        const size_t cb = i;
        const uint32_t c = next_code_point(s, i);
        const int k = is_word_char(c) ? 1 : is_white_space(c) ? 0 : 2;
        if (k != kind) {
          if (kind) out.push_back({static_cast<uint32_t>(p.begin + run), static_cast<uint32_t>(p.begin + cb), p.first && run == 0});
          run = cb;
          kind = k;
        }
      }
      if (kind) out.push_back({static_cast<uint32_t>(p.begin + run), p.end, p.first && run == 0});
    }
    pieces = std::move(out);
  }
};

class PreSequence : public PreTokenizer {
 public:
  explicit PreSequence(std::vector<std::unique_ptr<PreTokenizer>> v) : v_(std::move(v)) {}
  void apply(std::string& buf, std::vector<Piece>& pieces) const override {
    for (const auto& p : v_) p->apply(buf, pieces);
  }
  bool byte_level() const override { return !v_.empty() && v_.back()->byte_level(); }
  const std::vector<std::unique_ptr<PreTokenizer>>& steps() const { return v_; }

 private:
  std::vector<std::unique_ptr<PreTokenizer>> v_;
};

Behavior parse_behavior(const std::string& b, const Ctx& ctx, const std::string& field) {
  static const std::map<std::string, Behavior> kBehaviors{{"Isolated", Behavior::Isolated},
                                                          {"Removed", Behavior::Removed},
                                                          {"MergedWithPrevious", Behavior::MergedWithPrevious},
                                                          {"MergedWithNext", Behavior::MergedWithNext},
                                                          {"Contiguous", Behavior::Contiguous}};
  const auto it = kBehaviors.find(b);
  if (it == kBehaviors.end())
    ctx.fail(field + ".behavior",
             fmt::format("'{}' is not a split behavior (Isolated, Removed, MergedWithPrevious, MergedWithNext, Contiguous)", b));
  return it->second;
}

std::unique_ptr<PreTokenizer> parse_pre_tokenizer(const json& j, const Ctx& ctx, const std::string& field) {
  if (j.is_null()) return nullptr;
  const std::string type = ctx.str(j, field, "type");
  if (type == "ByteLevel")
    return std::make_unique<ByteLevelPre>(ctx.boolean(j, field, "add_prefix_space", true), ctx.boolean(j, field, "use_regex", true), ctx,
                                          field);
  if (type == "Split") {
    auto [pattern, re] = parse_pattern(j, ctx, field);
    const Behavior behavior = parse_behavior(ctx.str(j, field, "behavior"), ctx, field);
    if (ctx.boolean(j, field, "invert", false)) ctx.fail(field + ".invert", "an inverted split is not supported by kiln");
    return std::make_unique<SplitPre>(pattern, std::move(re), behavior);
  }
  if (type == "Metaspace") {
    std::string rep = ctx.str(j, field, "replacement");
    PrependScheme scheme = PrependScheme::Always;
    if (j.contains("prepend_scheme")) {
      const std::string s = ctx.str(j, field, "prepend_scheme");
      if (s == "always")
        scheme = PrependScheme::Always;
      else if (s == "first")
        scheme = PrependScheme::First;
      else if (s == "never")
        scheme = PrependScheme::Never;
      else
        ctx.fail(field + ".prepend_scheme", fmt::format("'{}' is not always, first or never", s));
    } else if (!ctx.boolean(j, field, "add_prefix_space", true)) {
      scheme = PrependScheme::Never;
    }
    return std::make_unique<MetaspacePre>(rep, scheme, ctx.boolean(j, field, "split", true));
  }
  if (type == "BertPreTokenizer") {
    auto seq = std::vector<std::unique_ptr<PreTokenizer>>{};
    seq.push_back(std::make_unique<CharSplitPre>(is_white_space, Behavior::Removed));
    seq.push_back(std::make_unique<CharSplitPre>(is_bert_punctuation, Behavior::Isolated));
    return std::make_unique<PreSequence>(std::move(seq));
  }
  if (type == "WhitespaceSplit") return std::make_unique<CharSplitPre>(is_white_space, Behavior::Removed);
  if (type == "Whitespace") return std::make_unique<WhitespacePre>();
  if (type == "Punctuation") {
    const std::string b = j.contains("behavior") ? ctx.str(j, field, "behavior") : "Isolated";
    return std::make_unique<CharSplitPre>(is_bert_punctuation, parse_behavior(b, ctx, field));
  }
  if (type == "Digits") {
    const bool individual = ctx.boolean(j, field, "individual_digits", false);
    return std::make_unique<SplitPre>("", regex(individual ? "\\p{N}" : "\\p{N}+", ctx, field), Behavior::Isolated);
  }
  if (type == "Sequence") {
    const json& list = ctx.get(j, field, "pretokenizers");
    if (!list.is_array()) ctx.fail(field + ".pretokenizers", "must be a list");
    std::vector<std::unique_ptr<PreTokenizer>> v;
    for (size_t i = 0; i < list.size(); ++i) {
      const std::string f = fmt::format("{}.pretokenizers[{}]", field, i);
      if (!v.empty() && v.back()->byte_level()) ctx.fail(f, "kiln supports ByteLevel only as the last pre-tokenizer");
      if (auto p = parse_pre_tokenizer(list[i], ctx, f)) v.push_back(std::move(p));
    }
    return std::make_unique<PreSequence>(std::move(v));
  }
  ctx.fail(field + ".type",
           fmt::format("the pre-tokenizer '{}' is not supported (kiln: ByteLevel, Split, Metaspace, Digits, BertPreTokenizer, "
                       "Whitespace, WhitespaceSplit, Punctuation, Sequence)",
                       type));
}

// ---------------------------------------------------------------------------------------- decoders
class Decoder {
 public:
  virtual ~Decoder() = default;
  virtual void apply(std::vector<std::string>& tokens) const = 0;
};

class ByteLevelDecoder : public Decoder {
 public:
  void apply(std::vector<std::string>& tokens) const override {
    const ByteMap& m = byte_map();
    std::string bytes;
    for (const std::string& t : tokens) {
      const size_t start = bytes.size();
      bool all = true;
      for (size_t i = 0; i < t.size();) {
        const uint32_t c = next_code_point(t, i);
        const auto it = m.to_byte.find(c);
        if (it == m.to_byte.end()) {
          all = false;
          break;
        }
        bytes += static_cast<char>(it->second);
      }
      if (!all) {
        bytes.resize(start);
        bytes += t;
      }
    }
    tokens.assign(1, utf8_lossy(bytes));
  }
};

class ReplaceDecoder : public Decoder {
 public:
  ReplaceDecoder(std::string pattern, std::string content) : pattern_(std::move(pattern)), content_(std::move(content)) {}
  void apply(std::vector<std::string>& tokens) const override {
    if (pattern_.empty()) return;
    for (std::string& t : tokens) t = replace_all(t, pattern_, content_);
  }

 private:
  std::string pattern_, content_;
};

// "<0x0A>" -> 0x0A
bool byte_token(const std::string& t, uint8_t& b) {
  if (t.size() != 6 || t[0] != '<' || t[1] != '0' || t[2] != 'x' || t[5] != '>') return false;
  auto hex = [](char c) -> int {
    return c >= '0' && c <= '9' ? c - '0' : c >= 'A' && c <= 'F' ? c - 'A' + 10 : c >= 'a' && c <= 'f' ? c - 'a' + 10 : -1;
  };
  const int h = hex(t[3]), l = hex(t[4]);
  if (h < 0 || l < 0) return false;
  b = static_cast<uint8_t>(h * 16 + l);
  return true;
}

class ByteFallbackDecoder : public Decoder {
 public:
  void apply(std::vector<std::string>& tokens) const override {
    std::vector<std::string> out;
    std::string pending;
    auto flush = [&] {
      if (pending.empty()) return;
      if (utf8_valid_prefix(pending) == pending.size())
        out.push_back(pending);
      else
        for (size_t i = 0; i < pending.size(); ++i) out.emplace_back("\xEF\xBF\xBD");
      pending.clear();
    };
    for (std::string& t : tokens) {
      uint8_t b = 0;
      if (byte_token(t, b)) {
        pending += static_cast<char>(b);
      } else {
        flush();
        out.push_back(std::move(t));
      }
    }
    flush();
    tokens = std::move(out);
  }
};

class FuseDecoder : public Decoder {
 public:
  void apply(std::vector<std::string>& tokens) const override {
    std::string all;
    for (const auto& t : tokens) all += t;
    tokens.assign(1, all);
  }
};

class StripDecoder : public Decoder {
 public:
  StripDecoder(uint32_t content, size_t start, size_t stop) : content_(content), start_(start), stop_(stop) {}
  void apply(std::vector<std::string>& tokens) const override {
    for (std::string& t : tokens) {
      std::vector<uint32_t> cps;
      for (size_t i = 0; i < t.size();) cps.push_back(next_code_point(t, i));
      size_t b = 0, e = cps.size();
      for (size_t i = 0; i < start_ && i < cps.size() && cps[i] == content_; ++i) b = i + 1;
      for (size_t i = 0; i < stop_ && i < cps.size(); ++i) {
        const size_t idx = cps.size() - i - 1;
        if (cps[idx] != content_) break;
        e = idx;
      }
      std::string s;
      for (size_t i = b; i < e; ++i) append_utf8(s, cps[i]);
      t = std::move(s);
    }
  }

 private:
  uint32_t content_;
  size_t start_, stop_;
};

class MetaspaceDecoder : public Decoder {
 public:
  MetaspaceDecoder(std::string rep, PrependScheme scheme) : rep_(std::move(rep)), scheme_(scheme) {}
  void apply(std::vector<std::string>& tokens) const override {
    for (size_t i = 0; i < tokens.size(); ++i) {
      std::string& t = tokens[i];
      std::string out;
      size_t pos = 0, b = 0;
      while ((b = t.find(rep_, pos)) != std::string::npos) {
        out.append(t, pos, b - pos);
        if (!(i == 0 && b == 0 && scheme_ != PrependScheme::Never)) out += ' ';
        pos = b + rep_.size();
      }
      out.append(t, pos);
      t = std::move(out);
    }
  }

 private:
  std::string rep_;
  PrependScheme scheme_;
};

// tokenizers' WordPiece decoder: a later token loses its prefix ("##") or gains a space; with cleanup,
// each token as its cleanup() (" ." -> ".", " n't" -> "n't", " do not" -> " don't", ...).
class WordPieceDecoder : public Decoder {
 public:
  WordPieceDecoder(std::string prefix, bool cleanup) : prefix_(std::move(prefix)), cleanup_(cleanup) {}
  void apply(std::vector<std::string>& tokens) const override {
    static const std::pair<std::string_view, std::string_view> kRules[] = {
        {" .", "."},   {" ?", "?"},           {" !", "!"},   {" ,", ","},     {" ' ", "'"},   {" n't", "n't"},
        {" 'm", "'m"}, {" do not", " don't"}, {" 's", "'s"}, {" 've", "'ve"}, {" 're", "'re"}};
    for (size_t i = 0; i < tokens.size(); ++i) {
      std::string& t = tokens[i];
      if (i > 0) {
        if (!prefix_.empty() && t.compare(0, prefix_.size(), prefix_) == 0)
          t.erase(0, prefix_.size());
        else
          t.insert(0, " ");
      }
      if (cleanup_)
        for (const auto& [from, to] : kRules) t = replace_all(t, from, to);
    }
  }

 private:
  std::string prefix_;
  bool cleanup_;
};

class DecoderSequence : public Decoder {
 public:
  explicit DecoderSequence(std::vector<std::unique_ptr<Decoder>> v) : v_(std::move(v)) {}
  void apply(std::vector<std::string>& tokens) const override {
    for (const auto& d : v_) d->apply(tokens);
  }

 private:
  std::vector<std::unique_ptr<Decoder>> v_;
};

std::unique_ptr<Decoder> parse_decoder(const json& j, const Ctx& ctx, const std::string& field) {
  if (j.is_null()) return nullptr;
  const std::string type = ctx.str(j, field, "type");
  if (type == "ByteLevel") return std::make_unique<ByteLevelDecoder>();
  if (type == "Replace") {
    auto [pattern, re] = parse_pattern(j, ctx, field);
    if (re) ctx.fail(field + ".pattern", "a regex in the Replace decoder is not supported by kiln");
    return std::make_unique<ReplaceDecoder>(pattern, ctx.str(j, field, "content"));
  }
  if (type == "ByteFallback") return std::make_unique<ByteFallbackDecoder>();
  if (type == "WordPiece")
    return std::make_unique<WordPieceDecoder>(j.contains("prefix") ? ctx.str(j, field, "prefix") : "##",
                                              ctx.boolean(j, field, "cleanup", true));
  if (type == "Fuse") return std::make_unique<FuseDecoder>();
  if (type == "Strip") {
    const std::string c = ctx.str(j, field, "content");
    size_t i = 0;
    if (c.empty() || (next_code_point(c, i), i != c.size())) ctx.fail(field + ".content", "must be one character");
    i = 0;
    const uint32_t cp = next_code_point(c, i);
    const json& start = ctx.get(j, field, "start");
    const json& stop = ctx.get(j, field, "stop");
    if (!start.is_number_unsigned() || !stop.is_number_unsigned()) ctx.fail(field, "start and stop must be counts");
    return std::make_unique<StripDecoder>(cp, start.get<size_t>(), stop.get<size_t>());
  }
  if (type == "Metaspace") {
    PrependScheme scheme = PrependScheme::Always;
    if (j.contains("prepend_scheme")) {
      const std::string s = ctx.str(j, field, "prepend_scheme");
      scheme = s == "never" ? PrependScheme::Never : s == "first" ? PrependScheme::First : PrependScheme::Always;
    } else if (!ctx.boolean(j, field, "add_prefix_space", true)) {
      scheme = PrependScheme::Never;
    }
    return std::make_unique<MetaspaceDecoder>(ctx.str(j, field, "replacement"), scheme);
  }
  if (type == "Sequence") {
    const json& list = ctx.get(j, field, "decoders");
    if (!list.is_array()) ctx.fail(field + ".decoders", "must be a list");
    std::vector<std::unique_ptr<Decoder>> v;
    for (size_t i = 0; i < list.size(); ++i)
      if (auto d = parse_decoder(list[i], ctx, fmt::format("{}.decoders[{}]", field, i))) v.push_back(std::move(d));
    return std::make_unique<DecoderSequence>(std::move(v));
  }
  ctx.fail(field + ".type",
           fmt::format("the decoder '{}' is not supported (kiln: ByteLevel, Replace, ByteFallback, Fuse, Strip, Metaspace, WordPiece, "
                       "Sequence)",
                       type));
}

// ---------------------------------------------------------------------------------------- the tokenizer
struct AddedToken {
  int32_t id;
  std::string content;
  bool single_word, lstrip, rstrip, normalized, special;
};

// Leftmost-longest matching of the added tokens (what `tokenizers` does with Aho-Corasick), on a trie.
class TokenMatcher {
 public:
  void add(const std::string& s, int index) {
    if (s.empty()) return;
    int node = 0;
    for (unsigned char c : s) {
      auto it = nodes_[node].next.find(c);
      if (it == nodes_[node].next.end()) {
        nodes_.push_back({});
        it = nodes_[node].next.emplace(c, static_cast<int>(nodes_.size() - 1)).first;
      }
      node = it->second;
    }
    if (nodes_[node].token < 0) nodes_[node].token = index;
    first_[static_cast<unsigned char>(s[0])] = true;
    empty_ = false;
  }
  bool empty() const { return empty_; }
  // The leftmost-longest match at or after `from`: token index, [begin, end).
  bool find(std::string_view s, size_t from, int& token, size_t& begin, size_t& end) const {
    for (size_t i = from; i < s.size(); ++i) {
      if (!first_[static_cast<unsigned char>(s[i])]) continue;
      int node = 0, best = -1;
      size_t best_end = 0;
      for (size_t k = i; k < s.size(); ++k) {
        const auto it = nodes_[node].next.find(static_cast<unsigned char>(s[k]));
        if (it == nodes_[node].next.end()) break;
        node = it->second;
        if (nodes_[node].token >= 0) best = nodes_[node].token, best_end = k + 1;
      }
      if (best >= 0) {
        token = best;
        begin = i;
        end = best_end;
        return true;
      }
    }
    return false;
  }

 private:
  struct Node {
    std::map<unsigned char, int> next;
    int token = -1;
  };
  std::vector<Node> nodes_{1};
  std::array<bool, 256> first_{};
  bool empty_ = true;
};

class HfTokenizer : public Tokenizer::Impl {
 public:
  HfTokenizer(const std::string& json_path, const std::string& config_path);

  std::vector<int32_t> encode(std::string_view text, bool add_special_tokens) const override;
  std::string decode(std::span<const int32_t> ids, bool skip_special_tokens) const override;
  std::string token(int32_t id) const override {
    if (const auto it = added_by_id_.find(id); it != added_by_id_.end()) return added_[it->second].content;
    if (id < static_cast<int32_t>(id_to_token_.size()) && has_token_[id]) return id_to_token_[id];
    fail("tokenizer: id {} has no token in '{}' (a hole in the vocabulary)", id, path);
  }
  std::optional<int32_t> id(std::string_view piece) const override {
    if (const auto it = added_by_content_.find(piece); it != added_by_content_.end()) return added_[it->second].id;
    if (const auto it = vocab_.find(piece); it != vocab_.end()) return it->second;
    return std::nullopt;
  }
  bool is_special(int32_t id) const override {
    const auto it = added_by_id_.find(id);
    return it != added_by_id_.end() && added_[it->second].special;
  }

 private:
  void parse_model(const json& m, const Ctx& ctx);
  void parse_bpe(const json& m, const Ctx& ctx);
  void parse_unigram(const json& m, const Ctx& ctx);
  void parse_wordpiece(const json& m, const Ctx& ctx);
  // The vocabulary of a model: id -> piece, piece -> id.
  void set_vocab(std::vector<std::string> pieces, const Ctx& ctx);
  void parse_vocab_object(const json& vocab, const Ctx& ctx);
  void parse_merges(const json& merges, const Ctx& ctx);
  void parse_added(const json& list, const Ctx& ctx);
  void parse_post_processor(const json& j, const Ctx& ctx, const std::string& field);
  void read_config(const std::string& config_path);
  // Splits `s` on the added tokens of `m`; calls on_text(text, begin offset) and on_token(id) in order.
  template <class OnText, class OnToken>
  void split_added(std::string_view s, const TokenMatcher& m, OnText on_text, OnToken on_token) const;
  void encode_piece(std::string_view text, bool first, std::vector<int32_t>& ids) const;
  // The model's ids of one pre-tokenized word (cached), by the model's kind.
  void tokenize_word(std::string_view word, std::vector<int32_t>& out) const;
  void bpe_uncached(std::string_view word, std::vector<int32_t>& out) const;
  void unigram(std::string_view word, std::vector<int32_t>& out) const;
  void wordpiece(std::string_view word, std::vector<int32_t>& out) const;
  int32_t require_unk(const char* why) const;
  // The initial symbols of a word (characters or bytes) with byte fallback / unk as tokenizers does.
  void initial_symbols(std::string_view word, std::vector<int32_t>& syms) const;

  // model
  enum class Kind { BPE, Unigram, WordPiece } kind_ = Kind::BPE;
  StringMap<int32_t> vocab_;       // piece -> id, as in the file
  StringMap<int32_t> byte_vocab_;  // byte-level: the bytes a piece stands for -> id
  std::vector<std::string> id_to_token_;
  std::vector<char> has_token_;
  std::unordered_map<uint64_t, std::pair<int32_t, int32_t>> merges_;  // (left id, right id) -> (rank, merged id)
  std::array<int32_t, 256> byte_ids_{};                               // byte-level: the id of each byte's character (-1: none)
  std::vector<int32_t> char_ids_;                                     // chars mode: id of code points below 0x10000 (-1: none)
  std::optional<int32_t> unk_id_;
  bool fuse_unk_ = false, byte_fallback_ = false, ignore_merges_ = false;
  bool byte_level_ = false;
  // Unigram: each piece's score, a trie of the pieces' bytes, the score of an unknown character
  std::vector<double> scores_;
  struct TrieNode {
    std::vector<std::pair<uint8_t, int32_t>> next;  // byte -> node, sorted
    int32_t id = -1;                                // the piece that ends here
  };
  std::vector<TrieNode> trie_{1};
  double unk_score_ = 0;
  // WordPiece: the prefix of a word's later pieces, the longest piece (bytes), the longest word (chars)
  std::string continuing_prefix_;
  size_t max_piece_bytes_ = 0, max_input_chars_ = 100;
  std::string unk_name_;  // for messages
  // pipeline
  std::unique_ptr<Normalizer> normalizer_;
  std::unique_ptr<PreTokenizer> pre_;
  std::unique_ptr<Decoder> decoder_;
  std::vector<AddedToken> added_;
  StringMap<size_t> added_by_content_;
  std::unordered_map<int32_t, size_t> added_by_id_;
  TokenMatcher raw_matcher_, normalized_matcher_;
  // post-processing: the ids before and after the text
  std::vector<int32_t> prefix_ids_, suffix_ids_;
  bool clean_up_spaces_ = false;

  mutable std::mutex cache_mu_;
  mutable std::unordered_map<std::string, std::vector<int32_t>> cache_;
};

HfTokenizer::HfTokenizer(const std::string& json_path, const std::string& config_path) {
  path = json_path;
  const Ctx ctx{json_path};
  const std::string bytes = read_file(json_path);
  json j;
  try {
    j = json::parse(bytes);
  } catch (const json::parse_error& e) {
    fail("tokenizer: {}: not valid JSON (truncated or corrupt?) at byte {}: {}", json_path, e.byte, e.what());
  }
  if (!j.is_object()) ctx.fail("(top level)", "must be a JSON object");
  for (const auto& [k, v] : j.items()) {
    static const std::vector<std::string> kKnown{"version",       "truncation",     "padding", "added_tokens", "normalizer",
                                                 "pre_tokenizer", "post_processor", "decoder", "model"};
    if (std::find(kKnown.begin(), kKnown.end(), k) == kKnown.end()) ctx.fail(k, "unknown top-level key");
  }
  parse_model(ctx.get(j, "(top level)", "model"), ctx);
  normalizer_ = parse_normalizer(j.value("normalizer", json()), ctx, "normalizer");
  pre_ = parse_pre_tokenizer(j.value("pre_tokenizer", json()), ctx, "pre_tokenizer");
  byte_level_ = pre_ && pre_->byte_level();
  decoder_ = parse_decoder(j.value("decoder", json()), ctx, "decoder");
  parse_added(j.value("added_tokens", json::array()), ctx);
  parse_post_processor(j.value("post_processor", json()), ctx, "post_processor");

  // lookup tables of the model's first symbols
  byte_ids_.fill(-1);
  char_ids_.assign(0x10000, -1);
  const ByteMap& bm = byte_map();
  for (const auto& [piece, id] : vocab_) {
    size_t i = 0;
    if (piece.empty()) continue;
    const uint32_t cp = next_code_point(piece, i);
    if (i == piece.size() && cp < 0x10000) char_ids_[cp] = id;
  }
  if (byte_level_) {
    for (int b = 0; b < 256; ++b) {
      const uint32_t c = bm.to_char[b];
      byte_ids_[b] = c < 0x10000 ? char_ids_[c] : -1;
    }
    for (const auto& [piece, id] : vocab_) {
      std::string raw;
      bool ok = true;
      for (size_t i = 0; i < piece.size() && ok;) {
        const auto it = bm.to_byte.find(next_code_point(piece, i));
        if (it == bm.to_byte.end())
          ok = false;
        else
          raw += static_cast<char>(it->second);
      }
      if (ok) byte_vocab_.emplace(raw, id);
    }
  }
  vocab_size = static_cast<int32_t>(id_to_token_.size());
  for (const AddedToken& t : added_) vocab_size = std::max(vocab_size, t.id + 1);
  read_config(config_path);
  if (byte_level_ && kind_ != Kind::BPE)
    ctx.fail("pre_tokenizer", "kiln supports the ByteLevel pre-tokenizer with a BPE model only (this model is Unigram or WordPiece)");
  static constexpr const char* kKindNames[] = {"BPE", "Unigram", "WordPiece"};
  description = fmt::format("tokenizer.json ({}{}{}, {} tokens)", kKindNames[static_cast<int>(kind_)], byte_level_ ? ", byte-level" : "",
                            byte_fallback_ ? ", byte fallback" : "", vocab_size);
}

void HfTokenizer::parse_model(const json& m, const Ctx& ctx) {
  if (!m.is_object()) ctx.fail("model", "must be an object");
  // as tokenizers' ModelWrapper: without "type", the keys tell (merges: BPE, a list vocab: Unigram)
  const std::string type = m.contains("type")                                               ? ctx.str(m, "model", "type")
                           : m.contains("merges")                                           ? "BPE"
                           : m.contains("vocab") && m.at("vocab").is_array()                ? "Unigram"
                           : m.contains("continuing_subword_prefix") && m.contains("vocab") ? "WordPiece"
                                                                                            : "(none)";
  if (type == "BPE") return parse_bpe(m, ctx);
  if (type == "Unigram") return parse_unigram(m, ctx);
  if (type == "WordPiece") return parse_wordpiece(m, ctx);
  ctx.fail("model.type", fmt::format("the model type '{}' is not supported (kiln: BPE, Unigram, WordPiece; a SentencePiece "
                                     "tokenizer.model through libsentencepiece)",
                                     type));
}

void HfTokenizer::set_vocab(std::vector<std::string> pieces, const Ctx& ctx) {
  id_to_token_ = std::move(pieces);
  has_token_.assign(id_to_token_.size(), 1);
  vocab_.reserve(id_to_token_.size());
  for (size_t i = 0; i < id_to_token_.size(); ++i) vocab_[id_to_token_[i]] = static_cast<int32_t>(i);  // a piece twice: the last id
  (void)ctx;
}

// tokenizers' Unigram (models/unigram): {"type": "Unigram", "unk_id": n | null, "vocab": [[piece, score], ...],
// "byte_fallback": bool}.
void HfTokenizer::parse_unigram(const json& m, const Ctx& ctx) {
  kind_ = Kind::Unigram;
  for (const auto& [k, v] : m.items()) {
    static const std::vector<std::string> kKnown{"type", "unk_id", "vocab", "byte_fallback"};
    if (std::find(kKnown.begin(), kKnown.end(), k) == kKnown.end()) ctx.fail("model." + k, "unknown key of a Unigram model");
  }
  const json& vocab = ctx.get(m, "model", "vocab");
  if (!vocab.is_array()) ctx.fail("model.vocab", "must be a list of [piece, score]");
  KILN_CHECK(vocab.size() < size_t{1} << 26, "tokenizer: {}: model.vocab: {} pieces is implausibly many", ctx.file, vocab.size());
  std::vector<std::string> pieces;
  pieces.reserve(vocab.size());
  scores_.reserve(vocab.size());
  for (size_t i = 0; i < vocab.size(); ++i) {
    const json& e = vocab[i];
    if (!e.is_array() || e.size() != 2 || !e[0].is_string() || !e[1].is_number())
      ctx.fail(fmt::format("model.vocab[{}]", i), "must be [piece, score]");
    pieces.push_back(e[0].get<std::string>());
    scores_.push_back(e[1].get<double>());
  }
  if (pieces.empty()) ctx.fail("model.vocab", "is empty");
  if (m.contains("unk_id") && !m.at("unk_id").is_null()) {
    const json& u = m.at("unk_id");
    if (!u.is_number_integer() || u.get<int64_t>() < 0 || u.get<int64_t>() >= static_cast<int64_t>(pieces.size()))
      ctx.fail("model.unk_id", fmt::format("must be an id in [0, {})", pieces.size()));
    unk_id_ = u.get<int32_t>();
  }
  byte_fallback_ = ctx.boolean(m, "model", "byte_fallback", false);
  fuse_unk_ = true;  // Unigram always fuses unknown characters
  // tokenizers: the unknown character's score is the lowest score less 10 (kUnkPenalty)
  unk_score_ = *std::min_element(scores_.begin(), scores_.end()) - 10.0;
  for (size_t id = 0; id < pieces.size(); ++id) {
    const std::string& p = pieces[id];
    int32_t node = 0;
    for (const unsigned char b : p) {
      auto& next = trie_[node].next;
      auto it = std::lower_bound(next.begin(), next.end(), b, [](const auto& e, uint8_t x) { return e.first < x; });
      if (it == next.end() || it->first != b) {
        const auto child = static_cast<int32_t>(trie_.size());
        it = next.insert(it, {b, child});
        trie_.emplace_back();
        node = child;
      } else {
        node = it->second;
      }
    }
    if (node != 0) trie_[node].id = static_cast<int32_t>(id);  // a piece twice: the last id, as token_to_ids
  }
  set_vocab(std::move(pieces), ctx);
}

// tokenizers' WordPiece: {"type": "WordPiece", "unk_token": "[UNK]", "continuing_subword_prefix": "##",
// "max_input_chars_per_word": 100, "vocab": {piece: id}}.
void HfTokenizer::parse_wordpiece(const json& m, const Ctx& ctx) {
  kind_ = Kind::WordPiece;
  for (const auto& [k, v] : m.items()) {
    static const std::vector<std::string> kKnown{"type", "unk_token", "continuing_subword_prefix", "max_input_chars_per_word", "vocab"};
    if (std::find(kKnown.begin(), kKnown.end(), k) == kKnown.end()) ctx.fail("model." + k, "unknown key of a WordPiece model");
  }
  unk_name_ = m.contains("unk_token") ? ctx.str(m, "model", "unk_token") : "[UNK]";
  continuing_prefix_ = m.contains("continuing_subword_prefix") ? ctx.str(m, "model", "continuing_subword_prefix") : "##";
  if (m.contains("max_input_chars_per_word")) {
    const json& n = m.at("max_input_chars_per_word");
    if (!n.is_number_unsigned()) ctx.fail("model.max_input_chars_per_word", "must be a count");
    max_input_chars_ = n.get<size_t>();
  }
  parse_vocab_object(ctx.get(m, "model", "vocab"), ctx);
  for (const auto& [piece, id] : vocab_) max_piece_bytes_ = std::max(max_piece_bytes_, piece.size());
  if (const auto it = vocab_.find(unk_name_); it != vocab_.end()) unk_id_ = it->second;
}

void HfTokenizer::parse_bpe(const json& m, const Ctx& ctx) {
  for (const auto& [k, v] : m.items()) {
    static const std::vector<std::string> kKnown{
        "type",          "dropout", "unk_token", "continuing_subword_prefix", "end_of_word_suffix", "fuse_unk", "byte_fallback",
        "ignore_merges", "vocab",   "merges"};
    if (std::find(kKnown.begin(), kKnown.end(), k) == kKnown.end()) ctx.fail("model." + k, "unknown key of a BPE model");
  }
  if (m.contains("dropout") && !m.at("dropout").is_null() && !(m.at("dropout").is_number() && m.at("dropout").get<double>() == 0.0))
    ctx.fail("model.dropout", "BPE dropout (random merges) is not supported by kiln: encoding would not be deterministic");
  for (const char* k : {"continuing_subword_prefix", "end_of_word_suffix"})
    if (m.contains(k) && !m.at(k).is_null() && !(m.at(k).is_string() && m.at(k).get<std::string>().empty()))
      ctx.fail(fmt::format("model.{}", k), "a subword prefix or word suffix is not supported by kiln");
  fuse_unk_ = ctx.boolean(m, "model", "fuse_unk", false);
  byte_fallback_ = ctx.boolean(m, "model", "byte_fallback", false);
  ignore_merges_ = ctx.boolean(m, "model", "ignore_merges", false);
  parse_vocab_object(ctx.get(m, "model", "vocab"), ctx);
  if (m.contains("unk_token") && !m.at("unk_token").is_null()) {
    const std::string unk_name = ctx.str(m, "model", "unk_token");
    const auto it = vocab_.find(unk_name);
    if (it == vocab_.end()) ctx.fail("model.unk_token", fmt::format("'{}' is not in the vocabulary", unk_name));
    unk_id_ = it->second;
  }
  parse_merges(ctx.get(m, "model", "merges"), ctx);
}

// {piece: id} (BPE, WordPiece)
void HfTokenizer::parse_vocab_object(const json& vocab, const Ctx& ctx) {
  if (!vocab.is_object()) ctx.fail("model.vocab", "must be an object mapping tokens to ids");
  int64_t max_id = -1;
  for (const auto& [piece, idj] : vocab.items()) {
    if (!idj.is_number_integer() || idj.get<int64_t>() < 0 || idj.get<int64_t>() >= (int64_t{1} << 31) - 1)
      ctx.fail("model.vocab", fmt::format("the id of '{}' must be an integer in [0, 2^31-1)", piece));
    max_id = std::max(max_id, idj.get<int64_t>());
  }
  KILN_CHECK(max_id < int64_t{1} << 26, "tokenizer: {}: model.vocab: id {} is implausibly large", ctx.file, max_id);
  id_to_token_.assign(static_cast<size_t>(max_id + 1), {});
  has_token_.assign(static_cast<size_t>(max_id + 1), 0);
  for (const auto& [piece, idj] : vocab.items()) {
    const auto id = idj.get<int32_t>();
    if (has_token_[id]) ctx.fail("model.vocab", fmt::format("the id {} is given to both '{}' and '{}'", id, id_to_token_[id], piece));
    id_to_token_[id] = piece;
    has_token_[id] = 1;
    vocab_.emplace(piece, id);
  }
}

void HfTokenizer::parse_merges(const json& merges, const Ctx& ctx) {
  if (!merges.is_array()) ctx.fail("model.merges", "must be a list");
  merges_.reserve(merges.size() * 2);
  for (size_t r = 0; r < merges.size(); ++r) {
    const json& e = merges[r];
    std::string a, b;
    if (e.is_string()) {  // "a b"
      const std::string s = e.get<std::string>();
      const size_t sp = s.find(' ');
      if (sp == std::string::npos || s.find(' ', sp + 1) != std::string::npos)
        ctx.fail(fmt::format("model.merges[{}]", r), fmt::format("'{}' is not two tokens separated by one space", s));
      a = s.substr(0, sp);
      b = s.substr(sp + 1);
    } else if (e.is_array() && e.size() == 2 && e[0].is_string() && e[1].is_string()) {  // ["a", "b"]
      a = e[0].get<std::string>();
      b = e[1].get<std::string>();
    } else {
      ctx.fail(fmt::format("model.merges[{}]", r), "must be \"a b\" or [\"a\", \"b\"]");
    }
    const auto ia = vocab_.find(a), ib = vocab_.find(b), iab = vocab_.find(a + b);
    for (const auto& [it, name] : {std::pair{ia, a}, std::pair{ib, b}, std::pair{iab, a + b}})
      if (it == vocab_.end())
        ctx.fail(fmt::format("model.merges[{}]", r), fmt::format("'{}' ('{}' + '{}') is not in the vocabulary", name, a, b));
    const uint64_t key = (static_cast<uint64_t>(ia->second) << 32) | static_cast<uint32_t>(ib->second);
    merges_[key] = {static_cast<int32_t>(r), iab->second};  // a pair listed twice: the last one counts, as in tokenizers
  }
}

void HfTokenizer::parse_added(const json& list, const Ctx& ctx) {
  if (!list.is_array()) ctx.fail("added_tokens", "must be a list");
  for (size_t i = 0; i < list.size(); ++i) {
    const json& t = list[i];
    const std::string f = fmt::format("added_tokens[{}]", i);
    const json& idj = ctx.get(t, f, "id");
    if (!idj.is_number_integer() || idj.get<int64_t>() < 0 || idj.get<int64_t>() >= int64_t{1} << 26)
      ctx.fail(f + ".id", "must be an id >= 0");
    AddedToken a{idj.get<int32_t>(),
                 ctx.str(t, f, "content"),
                 ctx.boolean(t, f, "single_word", false),
                 ctx.boolean(t, f, "lstrip", false),
                 ctx.boolean(t, f, "rstrip", false),
                 ctx.boolean(t, f, "normalized", true),
                 ctx.boolean(t, f, "special", false)};
    if (a.content.empty()) ctx.fail(f + ".content", "is empty");
    if (added_by_id_.count(a.id)) ctx.fail(f + ".id", fmt::format("the id {} is given to two added tokens", a.id));
    added_by_id_[a.id] = added_.size();
    added_by_content_[a.content] = added_.size();
    added_.push_back(a);
  }
  // tokenizers' order: the special tokens first, then the others; within each, file order (the first
  // of two equal patterns wins)
  for (int pass = 0; pass < 2; ++pass)
    for (size_t i = 0; i < added_.size(); ++i) {
      const AddedToken& a = added_[i];
      if (a.special != (pass == 0)) continue;
      if (a.normalized) {
        std::string n = a.content;
        if (normalizer_) normalizer_->apply(n);
        normalized_matcher_.add(n, static_cast<int>(i));
      } else {
        raw_matcher_.add(a.content, static_cast<int>(i));
      }
    }
}

void HfTokenizer::parse_post_processor(const json& j, const Ctx& ctx, const std::string& field) {
  if (j.is_null()) return;
  const std::string type = ctx.str(j, field, "type");
  if (type == "ByteLevel") return;  // offsets only
  if (type == "Sequence") {
    const json& list = ctx.get(j, field, "processors");
    if (!list.is_array()) ctx.fail(field + ".processors", "must be a list");
    for (size_t i = 0; i < list.size(); ++i) parse_post_processor(list[i], ctx, fmt::format("{}.processors[{}]", field, i));
    return;
  }
  if (type == "BertProcessing" || type == "RobertaProcessing") {  // single: CLS $A SEP
    auto special = [&](const char* key) {
      const json& t = ctx.get(j, field, key);
      if (!t.is_array() || t.size() != 2 || !t[0].is_string() || !t[1].is_number_integer() || t[1].get<int64_t>() < 0)
        ctx.fail(field + "." + key, "must be [token, id]");
      return t[1].get<int32_t>();
    };
    prefix_ids_.push_back(special("cls"));
    suffix_ids_.push_back(special("sep"));
    return;
  }
  if (type == "TemplateProcessing") {
    const json& single = ctx.get(j, field, "single");
    const json& specials = ctx.get(j, field, "special_tokens");
    if (!single.is_array()) ctx.fail(field + ".single", "must be a list");
    bool seen_a = false;
    for (size_t i = 0; i < single.size(); ++i) {
      const json& item = single[i];
      const std::string f = fmt::format("{}.single[{}]", field, i);
      if (item.is_object() && item.contains("Sequence")) {
        if (ctx.str(item.at("Sequence"), f + ".Sequence", "id") != "A") ctx.fail(f, "a single-sequence template can only name $A");
        seen_a = true;
      } else if (item.is_object() && item.contains("SpecialToken")) {
        const std::string name = ctx.str(item.at("SpecialToken"), f + ".SpecialToken", "id");
        if (!specials.is_object() || !specials.contains(name)) ctx.fail(field + ".special_tokens", fmt::format("'{}' is missing", name));
        const json& ids = ctx.get(specials.at(name), field + ".special_tokens." + name, "ids");
        if (!ids.is_array()) ctx.fail(field + ".special_tokens." + name + ".ids", "must be a list");
        for (const json& id : ids) {
          if (!id.is_number_integer() || id.get<int64_t>() < 0) ctx.fail(field + ".special_tokens." + name + ".ids", "must hold ids");
          (seen_a ? suffix_ids_ : prefix_ids_).push_back(id.get<int32_t>());
        }
      } else {
        ctx.fail(f, "must be {\"Sequence\": ...} or {\"SpecialToken\": ...}");
      }
    }
    if (!seen_a) ctx.fail(field + ".single", "has no $A");
    return;
  }
  ctx.fail(field + ".type", fmt::format("the post-processor '{}' is not supported (kiln: ByteLevel, TemplateProcessing, BertProcessing, "
                                        "RobertaProcessing, Sequence)",
                                        type));
}

// tokenizer_config.json: the special tokens' names, transformers' Llama BOS/EOS rule, clean-up.
void HfTokenizer::read_config(const std::string& config_path) {
  if (config_path.empty()) {
    if (!prefix_ids_.empty()) bos = prefix_ids_.front();
    if (!suffix_ids_.empty()) eos = suffix_ids_.back();
    return;
  }
  const Ctx ctx{config_path};
  json c;
  try {
    c = json::parse(read_file(config_path));
  } catch (const json::parse_error& e) {
    fail("tokenizer: {}: not valid JSON (truncated or corrupt?) at byte {}: {}", config_path, e.byte, e.what());
  }
  if (!c.is_object()) ctx.fail("(top level)", "must be a JSON object");
  auto special = [&](const char* key) -> std::optional<int32_t> {
    if (!c.contains(key) || c.at(key).is_null()) return std::nullopt;
    const json& v = c.at(key);
    std::string name;
    if (v.is_string())
      name = v.get<std::string>();
    else if (v.is_object() && v.contains("content") && v.at("content").is_string())
      name = v.at("content").get<std::string>();
    else
      ctx.fail(key, "must be a token (a string or {\"content\": ...})");
    const auto id = this->id(name);
    if (!id) ctx.fail(key, fmt::format("'{}' is not a token of {}", name, path));
    return id;
  };
  bos = special("bos_token");
  eos = special("eos_token");
  if (const auto u = special("unk_token")) unk = u;
  clean_up_spaces_ = ctx.boolean(c, "(top level)", "clean_up_tokenization_spaces", false);
  const std::string cls =
      c.contains("tokenizer_class") && c.at("tokenizer_class").is_string() ? c.at("tokenizer_class").get<std::string>() : "";
  // transformers' LlamaTokenizerFast (and CodeLlama's) rebuilds the post-processor from add_bos_token
  // (default true) and add_eos_token (default false): update_post_processor().
  static const std::vector<std::string> kLlama{"LlamaTokenizer", "LlamaTokenizerFast", "CodeLlamaTokenizer", "CodeLlamaTokenizerFast"};
  if (std::find(kLlama.begin(), kLlama.end(), cls) != kLlama.end()) {
    const bool add_bos = ctx.boolean(c, "(top level)", "add_bos_token", true);
    const bool add_eos = ctx.boolean(c, "(top level)", "add_eos_token", false);
    if (add_bos && !bos) ctx.fail("add_bos_token", "is true but bos_token is not set");
    if (add_eos && !eos) ctx.fail("add_eos_token", "is true but eos_token is not set");
    prefix_ids_.clear();
    suffix_ids_.clear();
    if (add_bos) prefix_ids_.push_back(*bos);
    if (add_eos) suffix_ids_.push_back(*eos);
  }
  if (!unk && unk_id_) unk = unk_id_;
}

template <class OnText, class OnToken>
void HfTokenizer::split_added(std::string_view s, const TokenMatcher& m, OnText on_text, OnToken on_token) const {
  size_t start = 0, pos = 0, b = 0, e = 0;
  int t = 0;
  while (!m.empty() && m.find(s, pos, t, b, e)) {
    const AddedToken& a = added_[t];
    pos = e;
    if (a.single_word) {
      size_t cb = 0, ce = e;
      const bool start_ok = b == 0 || !is_word_char(prev_code_point(s, b, cb));
      const bool stop_ok = e == s.size() || !is_word_char(next_code_point(s, ce));
      if (!start_ok || !stop_ok) continue;
    }
    if (a.lstrip) {
      size_t nb = b;
      while (nb > start) {
        size_t cb = 0;
        if (!is_white_space(prev_code_point(s, nb, cb))) break;
        nb = cb;
      }
      b = std::max(nb, start);
    }
    if (a.rstrip) {
      while (e < s.size()) {
        size_t i = e;
        if (!is_white_space(next_code_point(s, i))) break;
        e = i;
      }
      pos = e;
    }
    if (start < b) on_text(s.substr(start, b - start), start);
    on_token(a.id);
    start = e;
  }
  if (start < s.size()) on_text(s.substr(start), start);
}

std::vector<int32_t> HfTokenizer::encode(std::string_view text, bool add_special_tokens) const {
  const size_t valid = utf8_valid_prefix(text);
  KILN_CHECK(valid == text.size(), "tokenizer encode: the text is not valid UTF-8 (byte {} of {})", valid, text.size());
  std::vector<int32_t> ids;
  ids.reserve(text.size() / 3 + 8);
  if (add_special_tokens) ids.insert(ids.end(), prefix_ids_.begin(), prefix_ids_.end());
  auto add_id = [&](int32_t id) { ids.push_back(id); };
  split_added(
      text, raw_matcher_,
      [&](std::string_view segment, size_t offset) {
        std::string normalized(segment);
        if (normalizer_) normalizer_->apply(normalized);
        split_added(
            normalized, normalized_matcher_, [&](std::string_view piece, size_t sub) { encode_piece(piece, offset == 0 && sub == 0, ids); },
            add_id);
      },
      add_id);
  if (add_special_tokens) ids.insert(ids.end(), suffix_ids_.begin(), suffix_ids_.end());
  return ids;
}

void HfTokenizer::encode_piece(std::string_view text, bool first, std::vector<int32_t>& ids) const {
  if (text.empty()) return;
  if (!pre_) {
    tokenize_word(text, ids);
    return;
  }
  std::string buf(text);
  std::vector<Piece> pieces{{0, static_cast<uint32_t>(buf.size()), first}};
  pre_->apply(buf, pieces);
  for (const Piece& p : pieces) tokenize_word(std::string_view(buf).substr(p.begin, p.end - p.begin), ids);
}

void HfTokenizer::initial_symbols(std::string_view word, std::vector<int32_t>& syms) const {
  bool prev_unk = false;
  auto missing = [&](std::string_view ch) {
    if (byte_fallback_) {
      std::vector<int32_t> bytes;
      for (unsigned char b : ch) {
        const auto it = vocab_.find(fmt::format("<0x{:02X}>", b));
        if (it == vocab_.end()) break;
        bytes.push_back(it->second);
      }
      if (bytes.size() == ch.size()) {
        syms.insert(syms.end(), bytes.begin(), bytes.end());
        prev_unk = false;
        return;
      }
    }
    if (unk_id_) {
      if (!(fuse_unk_ && prev_unk)) syms.push_back(*unk_id_);
      prev_unk = true;
    }
    // no unk token: the character is dropped, as tokenizers does
  };
  if (byte_level_) {
    const ByteMap& bm = byte_map();
    for (unsigned char b : word) {
      if (byte_ids_[b] >= 0) {
        syms.push_back(byte_ids_[b]);
        prev_unk = false;
      } else {
        std::string ch;
        append_utf8(ch, bm.to_char[b]);
        missing(ch);
      }
    }
    return;
  }
  for (size_t i = 0; i < word.size();) {
    const size_t b = i;
    const uint32_t cp = next_code_point(word, i);
    int32_t id = -1;
    if (cp < 0x10000)
      id = char_ids_[cp];
    else if (const auto it = vocab_.find(word.substr(b, i - b)); it != vocab_.end())
      id = it->second;
    if (id >= 0) {
      syms.push_back(id);
      prev_unk = false;
    } else {
      missing(word.substr(b, i - b));
    }
  }
}

void HfTokenizer::bpe_uncached(std::string_view word, std::vector<int32_t>& out) const {
  if (ignore_merges_) {
    const auto& v = byte_level_ ? byte_vocab_ : vocab_;
    if (const auto it = v.find(word); it != v.end()) {
      out.push_back(it->second);
      return;
    }
  }
  std::vector<int32_t> syms;
  syms.reserve(word.size());
  initial_symbols(word, syms);
  // Repeatedly merge the adjacent pair of lowest rank (the leftmost among equals): what tokenizers'
  // priority queue computes.
  constexpr int32_t kNone = INT32_MAX;
  std::vector<int32_t> rank(syms.size(), kNone), merged(syms.size(), -1);
  auto look = [&](size_t i) {
    if (i + 1 >= syms.size()) {
      rank[i] = kNone;
      return;
    }
    const auto it = merges_.find((static_cast<uint64_t>(syms[i]) << 32) | static_cast<uint32_t>(syms[i + 1]));
    rank[i] = it == merges_.end() ? kNone : it->second.first;
    merged[i] = it == merges_.end() ? -1 : it->second.second;
  };
  for (size_t i = 0; i < syms.size(); ++i) look(i);
  while (syms.size() > 1) {
    size_t best = 0;
    for (size_t i = 1; i + 1 < syms.size(); ++i)
      if (rank[i] < rank[best]) best = i;
    if (rank[best] == kNone) break;
    syms[best] = merged[best];
    syms.erase(syms.begin() + static_cast<std::ptrdiff_t>(best) + 1);
    rank.erase(rank.begin() + static_cast<std::ptrdiff_t>(best) + 1);
    merged.erase(merged.begin() + static_cast<std::ptrdiff_t>(best) + 1);
    look(best);
    if (best > 0) look(best - 1);
  }
  out.insert(out.end(), syms.begin(), syms.end());
}

int32_t HfTokenizer::require_unk(const char* why) const {
  if (unk_id_) return *unk_id_;
  if (kind_ == Kind::WordPiece) fail("tokenizer encode: {}: {}, but model.unk_token '{}' is not in the vocabulary", path, why, unk_name_);
  fail("tokenizer encode: {}: {}, but the model has no unk_id", path, why);
}

// tokenizers' Unigram::encode_optimized: the best-scoring segmentation (Viterbi over the pieces that
// start at each character; an uncovered character is unknown at the lowest score less 10); runs of
// unknown characters fuse into one unknown token; with byte_fallback a piece not in the vocabulary
// becomes its <0xXX> byte pieces.
void HfTokenizer::unigram(std::string_view word, std::vector<int32_t>& out) const {
  if (word.empty()) return;
  const size_t n = word.size();
  struct Node {
    int32_t id = -1;  // -1: not reached; kUnk: an unknown character
    double score = 0;
    size_t start = 0;
  };
  constexpr int32_t kUnk = -2;
  std::vector<Node> best(n + 1);
  best[0].id = 0;
  for (size_t start = 0; start < n;) {
    const double base = best[start].score;
    size_t next_char = start;
    next_code_point(word, next_char);
    const size_t char_len = next_char - start;
    bool single = false;
    int32_t node = 0;
    for (size_t k = start; k < n; ++k) {  // the pieces that start here, shortest first
      const auto& next = trie_[node].next;
      const auto b = static_cast<uint8_t>(word[k]);
      const auto it = std::lower_bound(next.begin(), next.end(), b, [](const auto& e, uint8_t x) { return e.first < x; });
      if (it == next.end() || it->first != b) break;
      node = it->second;
      const int32_t id = trie_[node].id;
      if (id < 0) continue;
      Node& t = best[k + 1];
      const double cand = base + scores_[id];
      if (t.id == -1 || cand > t.score) t = {id, cand, start};
      if (k + 1 - start == char_len) single = true;
    }
    if (!single) {
      if (!unk_id_) require_unk("a character is not in the vocabulary");
      Node& t = best[next_char];
      const double cand = base + unk_score_;
      if (t.id == -1 || cand > t.score) t = {kUnk, cand, start};
    }
    start = next_char;
  }
  // back from the end; consecutive unknown characters fuse
  std::vector<std::pair<size_t, size_t>> spans;  // [begin, end) of each token, last first
  std::vector<char> unknown;
  for (size_t end = n; end > 0;) {
    const Node& t = best[end];
    const bool is_unk = t.id == kUnk || (unk_id_ && t.id == *unk_id_);
    if (is_unk && !unknown.empty() && unknown.back())
      spans.back().first = t.start;
    else
      spans.emplace_back(t.start, end), unknown.push_back(is_unk);
    end = t.start;
  }
  for (size_t i = spans.size(); i-- > 0;) {
    const std::string_view piece = word.substr(spans[i].first, spans[i].second - spans[i].first);
    if (const auto it = vocab_.find(piece); it != vocab_.end()) {
      out.push_back(it->second);
      continue;
    }
    if (byte_fallback_) {
      const size_t mark = out.size();
      for (const unsigned char b : piece) {
        const auto it = vocab_.find(fmt::format("<0x{:02X}>", b));
        if (it == vocab_.end()) break;
        out.push_back(it->second);
      }
      if (out.size() - mark == piece.size()) continue;
      out.resize(mark);
    }
    out.push_back(require_unk("a character is not in the vocabulary"));
  }
}

// tokenizers' WordPiece::tokenize: greedy longest-match-first pieces, the later ones spelled with the
// continuing-subword prefix; a word longer than max_input_chars_per_word characters, or one that cannot
// be covered, is one unknown token.
void HfTokenizer::wordpiece(std::string_view word, std::vector<int32_t>& out) const {
  size_t chars = 0;
  for (size_t i = 0; i < word.size() && chars <= max_input_chars_; next_code_point(word, i)) ++chars;
  if (chars > max_input_chars_) {
    out.push_back(require_unk("a word is longer than max_input_chars_per_word"));
    return;
  }
  const size_t mark = out.size();
  std::string candidate;
  for (size_t start = 0; start < word.size();) {
    const std::string_view prefix = start > 0 ? std::string_view(continuing_prefix_) : std::string_view();
    size_t end = word.size();
    // a candidate longer than the longest piece cannot match: start at a character boundary below it
    if (prefix.size() + end - start > max_piece_bytes_) {
      end = start + (max_piece_bytes_ > prefix.size() ? max_piece_bytes_ - prefix.size() : 0);
      while (end > start && (static_cast<unsigned char>(word[end]) & 0xC0) == 0x80) --end;
    }
    int32_t found = -1;
    while (end > start) {
      candidate.assign(prefix);
      candidate.append(word.substr(start, end - start));
      if (const auto it = vocab_.find(candidate); it != vocab_.end()) {
        found = it->second;
        break;
      }
      --end;
      while (end > start && (static_cast<unsigned char>(word[end]) & 0xC0) == 0x80) --end;
    }
    if (found < 0) {
      out.resize(mark);
      out.push_back(require_unk("a word has no WordPiece segmentation"));
      return;
    }
    out.push_back(found);
    start = end;
  }
}

void HfTokenizer::tokenize_word(std::string_view word, std::vector<int32_t>& out) const {
  auto uncached = [&](std::string_view w) {
    switch (kind_) {
      case Kind::BPE:
        return bpe_uncached(w, out);
      case Kind::Unigram:
        return unigram(w, out);
      case Kind::WordPiece:
        return wordpiece(w, out);
    }
  };
  if (word.size() >= 256) {
    uncached(word);
    return;
  }
  {
    std::lock_guard<std::mutex> lock(cache_mu_);
    if (const auto it = cache_.find(std::string(word)); it != cache_.end()) {
      out.insert(out.end(), it->second.begin(), it->second.end());
      return;
    }
  }
  const size_t n = out.size();
  uncached(word);
  std::lock_guard<std::mutex> lock(cache_mu_);
  if (cache_.size() >= 100000) cache_.clear();
  cache_.emplace(std::string(word), std::vector<int32_t>(out.begin() + static_cast<std::ptrdiff_t>(n), out.end()));
}

// transformers' clean_up_tokenization (tokenization_utils_base.py).
std::string clean_up_tokenization(std::string s) {
  static const std::pair<const char*, const char*> kRules[] = {{" .", "."},     {" ?", "?"},     {" !", "!"},   {" ,", ","},
                                                               {" ' ", "'"},    {" n't", "n't"}, {" 'm", "'m"}, {" 's", "'s"},
                                                               {" 've", "'ve"}, {" 're", "'re"}};
  for (const auto& [from, to] : kRules) s = replace_all(s, from, to);
  return s;
}

std::string HfTokenizer::decode(std::span<const int32_t> ids, bool skip_special_tokens) const {
  std::vector<std::string> tokens;
  tokens.reserve(ids.size());
  for (const int32_t id : ids) {
    if (const auto it = added_by_id_.find(id); it != added_by_id_.end()) {
      if (!(skip_special_tokens && added_[it->second].special)) tokens.push_back(added_[it->second].content);
    } else if (id < static_cast<int32_t>(id_to_token_.size()) && has_token_[id]) {
      tokens.push_back(id_to_token_[id]);
    }
  }
  std::string text;
  if (decoder_) {
    decoder_->apply(tokens);
    for (const auto& t : tokens) text += t;
  } else {
    for (size_t i = 0; i < tokens.size(); ++i) text += (i ? " " : "") + tokens[i];
  }
  return clean_up_spaces_ ? clean_up_tokenization(std::move(text)) : text;
}

}  // namespace

std::shared_ptr<const Tokenizer::Impl> load_hf_json(const std::string& json_path, const std::string& config_path) {
  return std::make_shared<HfTokenizer>(json_path, config_path);
}

}  // namespace kiln::text::detail
