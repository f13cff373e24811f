// Token files (train/data.cpp): TokenData::load of a safetensors file, the vocabulary check and a
// batch of SPECS §4 rows from it.
#include <kiln/backends/reference/reference.hpp>
#include <kiln/train/data.hpp>

#include "fuzz.hpp"

using namespace kiln;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string path = fuzz::file(data, size);
  try {
    const TokenData d = TokenData::load(path);
    for (const int64_t t : d.tokens()) KILN_FUZZ_ASSERT(t >= 0, "negative token {}", t);
    KILN_FUZZ_ASSERT(d.max_token() < 0 || d.size() > 0, "max_token");
    if (d.max_token() < 1000) d.check_vocab(1000);
    if (d.size() > 3) {
      const int64_t T = std::min<int64_t>(d.size() - 1, 5);
      const auto [x, y] = d.batch<Reference>(static_cast<int64_t>(size % 97), 2, T);
      const auto xs = to_vector<int64_t>(x), ys = to_vector<int64_t>(y);
      for (size_t i = 0; i + 1 < xs.size(); ++i)
        if ((i + 1) % static_cast<size_t>(T) != 0) KILN_FUZZ_ASSERT(ys[i] == xs[i + 1], "targets are the inputs shifted by one");
    }
  } catch (const Error&) {
  }
  return 0;
}
