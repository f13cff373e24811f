// Tokenizers (train/text.cpp). The input is text: bytes round-trip through ByteTokenizer, and through a
// CharTokenizer fitted to it; the first byte's worth of the input is also taken as an alphabet to
// encode the rest with (unknown characters and duplicate alphabet entries are kiln::Errors), and the
// bytes as token ids to decode; read_text_file returns the file's bytes.
#include <kiln/train/text.hpp>

#include "fuzz.hpp"

using namespace kiln;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string text(reinterpret_cast<const char*>(data), size);
  KILN_FUZZ_ASSERT(ByteTokenizer::decode(ByteTokenizer::encode(text)) == text, "byte round trip");
  try {
    const CharTokenizer t = CharTokenizer::fit(text);
    const std::vector<int64_t> ids = t.encode(text);
    for (const int64_t i : ids) KILN_FUZZ_ASSERT(i >= 0 && i < t.vocab_size(), "id {} outside [0, {})", i, t.vocab_size());
    KILN_FUZZ_ASSERT(t.decode(ids) == text, "char round trip");
  } catch (const Error&) {
  }
  if (size > 0) {
    const size_t k = std::min<size_t>(data[0], size - 1);
    try {
      const CharTokenizer t(text.substr(1, k));
      const std::string rest = text.substr(1 + k);
      KILN_FUZZ_ASSERT(t.decode(t.encode(rest)) == rest, "alphabet round trip");
    } catch (const Error&) {
    }
    try {
      const CharTokenizer t(text.substr(1, k));
      std::vector<int64_t> ids(text.begin(), text.end());
      (void)t.decode(ids);
    } catch (const Error&) {
    }
  }
  try {
    KILN_FUZZ_ASSERT(read_text_file(fuzz::file(data, size)) == text, "read_text_file returns the bytes");
  } catch (const Error&) {
  }
  return 0;
}
