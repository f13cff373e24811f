#include "kiln/formats/printable.hpp"

#include <algorithm>

#include <fmt/format.h>

namespace kiln {

size_t utf8_sequence(std::string_view s, size_t i) {
  const auto at = [&](size_t k) { return static_cast<unsigned char>(s[i + k]); };
  const size_t left = s.size() - i;
  const unsigned c = at(0);
  if (c < 0x80) return 1;
  // The lead byte sets the length and the range of the second byte (RFC 3629, section 4).
  size_t n = 0;
  unsigned lo = 0x80, hi = 0xBF;
  if (c >= 0xC2 && c <= 0xDF)
    n = 2;
  else if (c == 0xE0)
    n = 3, lo = 0xA0;  // no overlong 3-byte forms
  else if (c == 0xED)
    n = 3, hi = 0x9F;  // no surrogates U+D800..U+DFFF
  else if (c >= 0xE1 && c <= 0xEF)
    n = 3;
  else if (c == 0xF0)
    n = 4, lo = 0x90;  // no overlong 4-byte forms
  else if (c == 0xF4)
    n = 4, hi = 0x8F;  // at most U+10FFFF
  else if (c >= 0xF1 && c <= 0xF3)
    n = 4;
  else
    return 0;  // 80..C1 (continuation, overlong 2-byte), F5..FF
  if (left < n || at(1) < lo || at(1) > hi) return 0;
  for (size_t k = 2; k < n; ++k)
    if (at(k) < 0x80 || at(k) > 0xBF) return 0;
  return n;
}

bool valid_utf8(std::string_view s) {
  for (size_t i = 0; i < s.size();) {
    const size_t n = utf8_sequence(s, i);
    if (n == 0) return false;
    i += n;
  }
  return true;
}

std::string printable(std::string_view s, size_t max) {
  std::string out;
  out.reserve(std::min(s.size(), max) + 8);
  for (size_t i = 0; i < s.size();) {
    const auto c = static_cast<unsigned char>(s[i]);
    const size_t n = utf8_sequence(s, i);
    if (i + std::max<size_t>(n, 1) > max) {
      out += "...";
      break;
    }
    const bool control =
        (n == 1 && (c < 0x20 || c == 0x7F)) || (n == 2 && c == 0xC2 && static_cast<unsigned char>(s[i + 1]) < 0xA0);  // C1: U+0080..U+009F
    if (n == 0 || control) {
      for (size_t k = 0; k < std::max<size_t>(n, 1); ++k) out += fmt::format("\\x{:02X}", static_cast<unsigned char>(s[i + k]));
      i += std::max<size_t>(n, 1);
    } else {
      out.append(s.substr(i, n));
      i += n;
    }
  }
  return out;
}

}  // namespace kiln
