// Encode speed of kiln::text::Tokenizer on one thread: bench_text TOKENIZER TEXT_FILE [REPEATS [lines]]
// ("lines": each line, its newline included, encoded apart without special tokens) prints one JSON line: bytes, tokens, the best and median
// seconds over REPEATS encodes of the whole text (the same tokenizer object: its word cache warm after the first), and an FNV-1a hash of
// the ids (bench/text/run.py checks it against `tokenizers`).
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include <kiln/text/tokenizer.hpp>

int main(int argc, char** argv) {
  if (argc < 3) {
    std::fprintf(stderr, "usage: bench_text TOKENIZER TEXT_FILE [REPEATS]\n");
    return 2;
  }
  const int repeats = argc > 3 ? std::atoi(argv[3]) : 5;
  const bool lines = argc > 4 && std::string(argv[4]) == "lines";
  std::ifstream in(argv[2], std::ios::binary);
  std::ostringstream ss;
  ss << in.rdbuf();
  const std::string text = ss.str();
  const auto load0 = std::chrono::steady_clock::now();
  const auto tok = kiln::text::Tokenizer::load(argv[1]);
  const double load_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - load0).count();
  std::vector<double> times;
  std::vector<int32_t> ids;
  for (int r = 0; r < repeats; ++r) {
    const auto t0 = std::chrono::steady_clock::now();
    if (lines) {
      ids.clear();
      for (size_t pos = 0; pos < text.size();) {
        const size_t nl = text.find('\n', pos);
        const size_t end = nl == std::string::npos ? text.size() : nl + 1;
        const auto v = tok.encode(std::string_view(text).substr(pos, end - pos), false);
        ids.insert(ids.end(), v.begin(), v.end());
        pos = end;
      }
    } else {
      ids = tok.encode(text);
    }
    times.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  }
  uint64_t h = 1469598103934665603ull;
  for (const int32_t id : ids) {
    h ^= static_cast<uint32_t>(id);
    h *= 1099511628211ull;
  }
  const double first = times.front();
  std::sort(times.begin(), times.end());
  std::printf(
      "{\"bytes\": %zu, \"tokens\": %zu, \"load_s\": %.4f, \"first_s\": %.4f, \"best_s\": %.4f, \"median_s\": %.4f, \"hash\": "
      "\"%016llx\"}\n",
      text.size(), ids.size(), load_s, first, times.front(), times[times.size() / 2], static_cast<unsigned long long>(h));
  return 0;
}
