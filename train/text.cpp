#include "kiln/train/text.hpp"

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string_view>

#include "kiln/core/error.hpp"

namespace kiln {

std::vector<int64_t> ByteTokenizer::encode(const std::string& s) {
  std::vector<int64_t> out(s.size());
  for (size_t i = 0; i < s.size(); ++i) out[i] = static_cast<unsigned char>(s[i]);
  return out;
}

std::string ByteTokenizer::decode(const std::vector<int64_t>& ids) {
  std::string s;
  s.reserve(ids.size());
  for (int64_t t : ids) {
    KILN_CHECK(t >= 0 && t < 256, "ByteTokenizer::decode: token {} is not a byte", t);
    s.push_back(static_cast<char>(t));
  }
  return s;
}

CharTokenizer CharTokenizer::fit(const std::string& corpus) {
  bool seen[256] = {};
  for (unsigned char c : corpus) seen[c] = true;
  std::string a;
  for (int c = 0; c < 256; ++c)
    if (seen[c]) a.push_back(static_cast<char>(c));
  return CharTokenizer(a);
}

CharTokenizer::CharTokenizer(std::string alphabet) : alphabet_(std::move(alphabet)) {
  KILN_CHECK(!alphabet_.empty(), "CharTokenizer: empty alphabet");
  std::fill(std::begin(index_), std::end(index_), static_cast<int16_t>(-1));
  for (size_t i = 0; i < alphabet_.size(); ++i) {
    const auto c = static_cast<unsigned char>(alphabet_[i]);
    KILN_CHECK(index_[c] < 0, "CharTokenizer: byte {} appears twice in the alphabet", static_cast<int>(c));
    index_[c] = static_cast<int16_t>(i);
  }
}

std::vector<int64_t> CharTokenizer::encode(const std::string& s) const {
  std::vector<int64_t> out(s.size());
  for (size_t i = 0; i < s.size(); ++i) {
    const auto c = static_cast<unsigned char>(s[i]);
    KILN_CHECK(index_[c] >= 0, "CharTokenizer::encode: byte {} at position {} is not in the alphabet", static_cast<int>(c), i);
    out[i] = index_[c];
  }
  return out;
}

std::string CharTokenizer::decode(const std::vector<int64_t>& ids) const {
  std::string s;
  for (int64_t t : ids) {
    KILN_CHECK(t >= 0 && t < vocab_size(), "CharTokenizer::decode: token {} outside the vocabulary [0, {})", t, vocab_size());
    s.push_back(alphabet_[static_cast<size_t>(t)]);
  }
  return s;
}

std::string read_text_file(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  KILN_CHECK(f.good(), "cannot read '{}': no such file or not readable", path);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

std::string fortunes_corpus(const std::string& dir) {
  namespace fs = std::filesystem;
  KILN_CHECK(fs::is_directory(dir), "fortunes_corpus: no directory '{}' (install the Debian package: apt-get install fortunes)", dir);
  std::vector<std::string> files;
  for (const auto& e : fs::directory_iterator(dir)) {
    const std::string name = e.path().filename().string();
    const bool index = name.ends_with(".dat") || name.ends_with(".u8");
    if (e.is_regular_file() && !index) files.push_back(e.path().string());
  }
  std::sort(files.begin(), files.end());
  std::string out;
  for (const auto& f : files) {
    const std::string text = read_text_file(f);
    size_t start = 0;
    while (start < text.size()) {
      size_t end = text.find('\n', start);
      const bool has_nl = end != std::string::npos;
      if (!has_nl) end = text.size();
      const std::string_view line(text.data() + start, end - start);
      if (line != "%")
        for (char c : line)
          if (c == '\t' || (c >= 32 && c <= 126)) out += c;
      if (has_nl) out += '\n';
      start = end + 1;
    }
  }
  KILN_CHECK(!out.empty(), "fortunes_corpus: no text found in '{}'", dir);
  return out;
}

}  // namespace kiln
