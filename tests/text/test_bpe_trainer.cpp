// kiln::text::train_bpe against Hugging Face `tokenizers`' BpeTrainer: the vocabulary and the merges,
// in order, that tokenizers 0.20.3 trained on fixtures/bpe_train/corpus.txt with the same settings
// (tests/text/make_bpe_fixtures.py made them), and the ids and decodes of the trained tokenizer; round
// trips on random text; bad input; `kiln tokenizer train`.
#include <catch2/catch.hpp>

#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <random>
#include <sstream>

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <nlohmann/json.hpp>

#include <kiln/core/error.hpp>
#include <kiln/text/bpe_trainer.hpp>
#include <kiln/text/tokenizer.hpp>

#include "common/kiln_test.hpp"
#include "common/run.hpp"
#include "text_test.hpp"

using kiln::text::BpeTrainOptions;
using kiln::text::Tokenizer;
using kt::error_of;
using kt::slurp;
using json = nlohmann::json;
namespace fs = std::filesystem;

namespace {

const std::string kDir = std::string(KILN_SOURCE_DIR) + "/tests/text/fixtures/bpe_train/";

// A fresh temporary directory, removed with everything in it at the end of the scope.
struct TempDir {
  fs::path path;
  explicit TempDir(const std::string& stem) : path(fs::temp_directory_path() / fmt::format("kiln_{}_{}", stem, ::getpid())) {
    fs::remove_all(path);
    fs::create_directories(path);
  }
  ~TempDir() {
    std::error_code ec;
    fs::remove_all(path, ec);
  }
  std::string operator/(const std::string& name) const { return (path / name).string(); }
};

BpeTrainOptions opts(int64_t vocab_size, int64_t min_frequency, std::vector<std::string> special_tokens) {
  BpeTrainOptions o;
  o.vocab_size = vocab_size;
  o.min_frequency = min_frequency;
  o.special_tokens = std::move(special_tokens);
  return o;
}

BpeTrainOptions settings_of(const json& e) {
  BpeTrainOptions o;
  o.vocab_size = e["settings"]["vocab_size"].get<int64_t>();
  o.min_frequency = e["settings"]["min_frequency"].get<int64_t>();
  o.special_tokens = e["settings"]["special_tokens"].get<std::vector<std::string>>();
  return o;
}

// The UTF-8 bytes of code point cp.
std::string utf8(uint32_t cp) {
  if (cp < 0x80) return std::string(1, static_cast<char>(cp));
  const int n = cp < 0x800 ? 2 : cp < 0x10000 ? 3 : 4;
  std::string s(static_cast<size_t>(n), '\0');
  for (int i = n - 1; i > 0; --i, cp >>= 6) s[static_cast<size_t>(i)] = static_cast<char>(0x80 | (cp & 0x3F));
  s[0] = static_cast<char>((0xF00 >> n) | cp);  // the lead byte: 110xxxxx, 1110xxxx, 11110xxx
  return s;
}

// A random valid UTF-8 string: ASCII, white space and newlines, control characters, Latin, CJK,
// emoji, combining marks, and code points from all of Unicode (1 to 4 bytes each).
std::string random_text(std::mt19937& rng) {
  std::string s;
  const int n = std::uniform_int_distribution<int>(0, 60)(rng);
  for (int i = 0; i < n; ++i) {
    const int kind = std::uniform_int_distribution<int>(0, 7)(rng);
    uint32_t cp = 0;
    switch (kind) {
      case 0:
        cp = std::uniform_int_distribution<uint32_t>(0x20, 0x7E)(rng);
        break;
      case 1:
        cp = std::array<uint32_t, 6>{' ', '\n', '\t', '\r', 0xA0, 0x3000}[rng() % 6];
        break;
      case 2:
        cp = std::uniform_int_distribution<uint32_t>(0xC0, 0x24F)(rng);
        break;
      case 3:
        cp = std::uniform_int_distribution<uint32_t>(0x4E00, 0x9FFF)(rng);
        break;
      case 4:
        cp = std::uniform_int_distribution<uint32_t>(0x1F300, 0x1FAFF)(rng);
        break;
      case 5:
        cp = std::uniform_int_distribution<uint32_t>(0x300, 0x36F)(rng);
        break;
      case 6:
        cp = std::uniform_int_distribution<uint32_t>(0, 0x1F)(rng);
        break;
      default:  // anywhere in Unicode but the surrogates
        cp = std::uniform_int_distribution<uint32_t>(0, 0x10FFFF - 0x800)(rng);
        if (cp >= 0xD800) cp += 0x800;
    }
    s += utf8(cp);
  }
  return s;
}

}  // namespace

TEST_CASE("bpe trainer: the vocabulary and merges of tokenizers' BpeTrainer, merge for merge, and its ids", "[text][bpe]") {
  const std::vector<std::string> corpus{kDir + "corpus.txt"};
  for (const char* name : {"v1000", "v600_min3", "v4000_min2"}) {
    INFO(name);
    const json e = json::parse(slurp(kDir + name + "/expected.json"));
    const json hf = json::parse(slurp(kDir + name + "/tokenizer.json"));
    TempDir tmp(std::string("bpe_") + name);
    const Tokenizer tok = kiln::text::train_bpe(corpus, settings_of(e), tmp.path.string());
    CHECK(tok.path() == tmp / "tokenizer.json");
    const json mine = json::parse(slurp(tmp / "tokenizer.json"));
    // the whole document: vocabulary, merges in order, added tokens, pre-tokenizer, decoder, ...
    const auto& hm = hf["model"]["merges"];
    const auto& mm = mine["model"]["merges"];
    CHECK(mm.size() == e["merges"].get<size_t>());
    for (size_t i = 0; i < std::min(hm.size(), mm.size()); ++i) {
      INFO("merge " << i);
      REQUIRE(mm[i] == hm[i]);
    }
    CHECK(mine["model"]["vocab"] == hf["model"]["vocab"]);
    CHECK(mine == hf);
    CHECK(tok.vocab_size() == e["vocab_size"].get<int32_t>());
    const auto lines = e["lines"].get<std::vector<std::string>>();
    for (size_t i = 0; i < lines.size(); ++i) {
      INFO("line " << i << ": " << lines[i]);
      const std::vector<int32_t> ids = tok.encode(lines[i]);
      CHECK(ids == e["ids"][i].get<std::vector<int32_t>>());
      CHECK(tok.decode(ids) == e["decoded"][i].get<std::string>());
    }
    if (!e["whole"].is_null()) CHECK(tok.encode(slurp(corpus[0])) == e["whole"].get<std::vector<int32_t>>());
    for (const std::string& sp : e["settings"]["special_tokens"].get<std::vector<std::string>>()) {
      REQUIRE(tok.id(sp));
      CHECK(tok.is_special(*tok.id(sp)));
    }
  }
}

TEST_CASE("bpe trainer: the same corpus in memory, in a .json path, and split into files gives the same tokenizer", "[text][bpe]") {
  const std::string text = slurp(kDir + "corpus.txt");
  BpeTrainOptions o{.vocab_size = 700, .min_frequency = 2, .special_tokens = {"<eos>"}};
  const std::string from_memory = kiln::text::train_bpe_json(std::vector<std::string>{text}, o);
  TempDir tmp("bpe_split");
  // files split at line ends: the lines, so the words and counts, are the same
  const size_t cut = text.find('\n', text.size() / 2) + 1;
  std::ofstream(tmp / "a.txt", std::ios::binary) << text.substr(0, cut);
  std::ofstream(tmp / "b.txt", std::ios::binary) << text.substr(cut);
  const Tokenizer tok = kiln::text::train_bpe(std::vector<std::string>{tmp / "a.txt", tmp / "b.txt"}, o, tmp / "my.json");
  CHECK(tok.path() == tmp / "my.json");
  CHECK(slurp(tmp / "my.json") == from_memory);
  CHECK(tok.vocab_size() == 700);
  CHECK(tok.token(0) == "<eos>");
  CHECK(tok.token(1) == "!");  // the bytes follow the specials, in the order of their stand-in characters
  CHECK(tok.token(1 + 256 - 1) == "Ń");
  // nothing but the output in the directory (the temporary file was renamed)
  CHECK(std::distance(fs::directory_iterator(tmp.path), fs::directory_iterator()) == 3);
}

TEST_CASE("bpe trainer: decode(encode(s)) == s on random text", "[text][bpe]") {
  const std::string text = slurp(kDir + "corpus.txt");
  const Tokenizer tok = [&] {
    TempDir tmp("bpe_roundtrip");
    return kiln::text::train_bpe(std::vector<std::string>{kDir + "corpus.txt"}, opts(900, 0, {"<|endoftext|>"}), tmp.path.string());
  }();  // the tokenizer lives on after its file is gone
  std::mt19937 rng(7);
  for (int i = 0; i < 300; ++i) {
    const std::string s = random_text(rng);
    INFO(i);
    const std::vector<int32_t> ids = tok.encode(s);
    CHECK(tok.decode(ids) == s);
    for (int32_t id : ids) CHECK((id >= 0 && id < tok.vocab_size()));
  }
  // every byte value as text (valid UTF-8 made of the control and ASCII bytes, and the Latin-1 range)
  std::string all;
  for (int b = 1; b < 0x80; ++b) all += static_cast<char>(b);
  for (uint32_t c = 0x80; c < 0x100; ++c) all += utf8(c);
  CHECK(tok.decode(tok.encode(all)) == all);
  CHECK(tok.decode(tok.encode(text)) == text);
  // the special token in text is one id, and skipped on request
  const auto ids = tok.encode("a<|endoftext|>b");
  CHECK(std::count(ids.begin(), ids.end(), 0) == 1);
  CHECK(tok.decode(ids, true) == "ab");
}

TEST_CASE("bpe trainer: bad input is an error naming it, and leaves no file", "[text][bpe]") {
  TempDir tmp("bpe_errors");
  const std::string corpus = kDir + "corpus.txt";
  std::ofstream(tmp / "empty.txt");
  auto train = [&](std::vector<std::string> files, BpeTrainOptions o, const std::string& out) {
    return error_of([&] { kiln::text::train_bpe(files, o, out); });
  };
  CHECK_THAT(train({tmp / "empty.txt"}, opts(300, 0, {}), tmp / "o1"), Catch::Contains("empty") && Catch::Contains("empty.txt"));
  CHECK_THAT(error_of([] {
               kiln::text::train_bpe_json(std::vector<std::string>{"", ""}, opts(300, 0, {}));
             }),
             Catch::Contains("corpus is empty"));
  CHECK_THAT(train({corpus}, opts(257, 0, {"<a>", "<b>"}), tmp / "o2"), Catch::Contains("vocab_size 257") && Catch::Contains("258"));
  CHECK(train({corpus}, opts(256, 0, {}), tmp / "o2") == "(no error)");  // 256 and no special tokens: the bytes alone
  CHECK_THAT(train({corpus}, opts(300, 0, {"<a>", "<a>"}), tmp / "o3"), Catch::Contains("'<a>' is given twice"));
  CHECK_THAT(train({corpus}, opts(300, 0, {""}), tmp / "o3"), Catch::Contains("special token is empty"));
  CHECK_THAT(train({corpus}, opts(300, -1, {}), tmp / "o3"), Catch::Contains("min_frequency"));
  CHECK_THAT(train({tmp / "missing.txt"}, opts(300, 0, {}), tmp / "o4"), Catch::Contains("missing.txt"));
  CHECK_THAT(train({tmp.path.string()}, opts(300, 0, {}), tmp / "o4"), Catch::Contains("is a directory"));
  CHECK_THAT(train({}, opts(300, 0, {}), tmp / "o4"), Catch::Contains("no training files"));
  std::ofstream(tmp / "latin1.txt", std::ios::binary) << "caf\xe9\n";
  CHECK_THAT(train({tmp / "latin1.txt"}, opts(300, 0, {}), tmp / "o5"),
             Catch::Contains("latin1.txt") && Catch::Contains("not UTF-8") && Catch::Contains("offset 3"));
  // an output that cannot be written: in a missing directory, under a file, in a read-only directory
  CHECK_THAT(train({corpus}, opts(300, 0, {}), tmp / "no/such/dir/tok.json"), Catch::Contains("tok.json"));
  CHECK_THAT(train({corpus}, opts(300, 0, {}), (tmp / "empty.txt") + "/sub"), Catch::Contains("empty.txt/sub"));
  if (::geteuid() != 0) {  // root writes anywhere
    fs::create_directories(tmp / "ro");
    fs::permissions(tmp / "ro", fs::perms::owner_read | fs::perms::owner_exec);
    CHECK_THAT(train({corpus}, opts(300, 0, {}), tmp / "ro/tok.json"), Catch::Contains("ro/tok.json"));
    fs::permissions(tmp / "ro", fs::perms::owner_all);
  }
  // an existing tokenizer.json is replaced whole, or left as it was when training fails
  std::ofstream(tmp / "keep.json") << "old";
  CHECK_THAT(train({tmp / "empty.txt"}, opts(300, 0, {}), tmp / "keep.json"), Catch::Contains("empty"));
  CHECK(slurp(tmp / "keep.json") == "old");
  // nothing else was written: the inputs, the read-only directory, keep.json and o2 (the good run)
  std::vector<std::string> left;
  for (const auto& f : fs::recursive_directory_iterator(tmp.path)) left.push_back(fs::relative(f.path(), tmp.path).string());
  std::sort(left.begin(), left.end());
  std::vector<std::string> expected{"empty.txt", "keep.json", "latin1.txt", "o2", "o2/tokenizer.json"};
  if (::geteuid() != 0) expected.insert(expected.begin() + 3, "ro");
  CHECK(left == expected);
}

TEST_CASE("bpe trainer: kiln tokenizer train writes the tokenizer kiln tokenize reads", "[text][bpe]") {
  TempDir tmp("bpe_cli");
  const std::string corpus = kDir + "corpus.txt";
  const json e = json::parse(slurp(kDir + "v1000/expected.json"));
  auto r =
      kt::run_command(fmt::format("{} tokenizer train --data {} --vocab-size 1000 --special-token '<|endoftext|>' --special-token "
                                  "'<pad>' --out {} 2>&1",
                                  KILN_CLI, corpus, tmp / "tok"));
  REQUIRE(r.status == 0);
  CHECK_THAT(r.out, Catch::Contains("\"vocab_size\":1000"));
  CHECK(json::parse(slurp(tmp / "tok/tokenizer.json")) == json::parse(slurp(kDir + "v1000/tokenizer.json")));
  r = kt::run_command(fmt::format("{} tokenize --tokenizer {} --print-ids < {} 2>&1", KILN_CLI, tmp / "tok", corpus));
  REQUIRE(r.status == 0);
  CHECK_THAT(r.out, Catch::Contains(fmt::format("{}", fmt::join(e["whole"].get<std::vector<int>>(), ","))));
  // errors: one line naming the problem, exit status 1
  r = kt::run_command(fmt::format("{} tokenizer train --data {} --vocab-size 100 --out {} 2>&1", KILN_CLI, corpus, tmp / "t2"));
  CHECK(r.status == 1);
  CHECK_THAT(r.out, Catch::Contains("vocab_size 100"));
  r = kt::run_command(fmt::format("{} tokenizer train --vocab-size 300 --out {} 2>&1", KILN_CLI, tmp / "t2"));
  CHECK(r.status == 1);
  CHECK_THAT(r.out, Catch::Contains("--data is required"));
  r = kt::run_command(fmt::format("{} tokenizer fit 2>&1", KILN_CLI));
  CHECK(r.status == 1);
  CHECK_THAT(r.out, Catch::Contains("expected a subcommand: train"));
  CHECK(!fs::exists(tmp / "t2"));
}
