#pragma once
// Bytes from a file, fit to quote in an error message. A corrupt file's bytes are often not valid
// UTF-8 or hold control characters (ESC sequences rewrite the terminal); printed raw they garble it.
//
//   fail("plot: '{}' line {}: not a JSON object: {}", path, no, printable(line, 80));
//
// printable(s, max) copies what is printable and valid UTF-8; every other byte becomes \xNN (two
// upper-case hex digits): bytes of invalid or overlong UTF-8, surrogates, ASCII controls (tab and
// newline included: a message is one line), DEL and the C1 controls U+0080..U+009F. A backslash stays
// a backslash, so printable(printable(s)) == printable(s) and a message can be escaped once more
// safely. At most the first `max` bytes of s are shown, never half a character; "..." marks a cut.
#include <cstddef>
#include <string>
#include <string_view>

#pragma GCC visibility push(default)  // exported from libkiln (CMakeLists.txt: hidden by default)
namespace kiln {

// The length (1-4) of the valid UTF-8 sequence at s[i] (RFC 3629: no overlong forms, no surrogates,
// at most U+10FFFF), or 0 when the bytes there are not one.
size_t utf8_sequence(std::string_view s, size_t i);

// Every byte of s belongs to a valid UTF-8 sequence (what a JSON writer accepts).
bool valid_utf8(std::string_view s);

std::string printable(std::string_view s, size_t max = 200);

}  // namespace kiln
#pragma GCC visibility pop
