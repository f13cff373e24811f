#include "kiln/text/regex.hpp"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#include <fmt/format.h>

#include "kiln/core/error.hpp"

namespace kiln::text {
namespace {

std::string pcre2_message(int code) {
  PCRE2_UCHAR msg[256];
  pcre2_get_error_message(code, msg, sizeof msg);
  return reinterpret_cast<const char*>(msg);
}

// pcre2_match on s with `options`, one match data per thread: true on a match (ovector in *ov).
bool match(const pcre2_code* code, std::string_view s, size_t start, uint32_t options, const std::string& what, const std::string& pattern,
           size_t* ov) {
  thread_local struct Data {
    pcre2_match_data* md = pcre2_match_data_create(1, nullptr);
    ~Data() { pcre2_match_data_free(md); }
  } data;
  const int rc = pcre2_match(code, reinterpret_cast<PCRE2_SPTR>(s.data()), s.size(), start, options, data.md, nullptr);
  if (rc == PCRE2_ERROR_NOMATCH) return false;
  if (rc < 0) throw Error(fmt::format("{}: the regex '{}' failed on a text of {} bytes: {}", what, pattern, s.size(), pcre2_message(rc)));
  const PCRE2_SIZE* o = pcre2_get_ovector_pointer(data.md);
  ov[0] = o[0];
  ov[1] = o[1];
  return true;
}

}  // namespace

Regex::Regex(std::string pattern, std::string what) : pattern_(std::move(pattern)), what_(std::move(what)) {
  int err = 0;
  PCRE2_SIZE off = 0;
  code_ = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(pattern_.data()), pattern_.size(), PCRE2_UTF | PCRE2_UCP, &err, &off, nullptr);
  if (!code_)
    throw Error(fmt::format("{}: the regex '{}' does not compile (PCRE2, at offset {}): {}", what_, pattern_, off, pcre2_message(err)));
  pcre2_jit_compile(code_, PCRE2_JIT_COMPLETE);  // falls back to the interpreter where JIT is unavailable
}

Regex::~Regex() { pcre2_code_free(code_); }

bool Regex::find(std::string_view s, size_t start, size_t& begin, size_t& end) const {
  size_t ov[2];
  if (!match(code_, s, start, PCRE2_NO_UTF_CHECK, what_, pattern_, ov)) return false;
  begin = ov[0];
  end = ov[1];
  return true;
}

bool Regex::full_match(std::string_view s) const {
  size_t ov[2];
  return match(code_, s, 0, PCRE2_ANCHORED | PCRE2_ENDANCHORED, what_, pattern_, ov);
}

}  // namespace kiln::text
