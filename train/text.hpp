#pragma once
// Text to tokens. ByteTokenizer: UTF-8 bytes, vocab 256, lossless for any text. CharTokenizer: the
// distinct bytes of a corpus (sorted), a smaller vocabulary for character-level models; its alphabet
// is stored with the data so sampling can decode.
#include <cstdint>
#include <string>
#include <vector>

#pragma GCC visibility push(default)  // exported from libkiln (CMakeLists.txt: hidden by default)
namespace kiln {

struct ByteTokenizer {
  static constexpr int64_t vocab_size = 256;
  static std::vector<int64_t> encode(const std::string& s);
  static std::string decode(const std::vector<int64_t>& ids);
};

class CharTokenizer {
 public:
  static CharTokenizer fit(const std::string& corpus);
  explicit CharTokenizer(std::string alphabet);
  int64_t vocab_size() const { return static_cast<int64_t>(alphabet_.size()); }
  const std::string& alphabet() const { return alphabet_; }
  std::vector<int64_t> encode(const std::string& s) const;  // throws on a character outside the alphabet
  std::string decode(const std::vector<int64_t>& ids) const;

 private:
  std::string alphabet_;
  int16_t index_[256];
};

// Reads a whole file; throws naming the file.
std::string read_text_file(const std::string& path);

// The text of Debian's `fortunes` package as scripts/train_demo.sh assembles it: the plain fortune
// files of `dir` in name order (not the .dat/.u8 indexes), '%' separator lines blank, only tab,
// newline and printable ASCII kept. Throws naming the directory when it is missing or empty.
std::string fortunes_corpus(const std::string& dir = "/usr/share/games/fortunes");

}  // namespace kiln
#pragma GCC visibility pop
