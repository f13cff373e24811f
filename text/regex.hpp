#pragma once
// A compiled PCRE2 regex (kiln::text internals, not installed): UTF-8 with Unicode properties for \s \w
// \d and case folding, JIT-compiled where available. PCRE2's syntax is Perl's, the closest C library to
// Python's `re` (lookbehind, named groups `(?P<name>...)`, `\Z`) and to the patterns tokenizer.json
// files carry; used by the tokenizers and by LoRA's target_regex (PEFT's re.fullmatch).
#include <cstddef>
#include <string>
#include <string_view>

struct pcre2_real_code_8;  // pcre2.h's pcre2_code (8-bit code units)

namespace kiln::text {

class Regex {
 public:
  // A kiln::Error "<what>: the regex '<pattern>' does not compile (PCRE2, at offset N): <reason>" when
  // it does not compile; `what` names where the pattern came from (a file and field, an option).
  Regex(std::string pattern, std::string what);
  Regex(const Regex&) = delete;
  Regex& operator=(const Regex&) = delete;
  ~Regex();

  // The first match in s (valid UTF-8, not checked) at or after byte `start`: [begin, end).
  bool find(std::string_view s, size_t start, size_t& begin, size_t& end) const;
  // Whether the whole of s matches, as Python's re.fullmatch; s is checked to be valid UTF-8.
  bool full_match(std::string_view s) const;

 private:
  std::string pattern_, what_;
  pcre2_real_code_8* code_ = nullptr;
};

}  // namespace kiln::text
