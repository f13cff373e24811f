// kiln::text::Tokenizer against the real libraries: the ids `tokenizers` / transformers / `sentencepiece`
// computed for fixtures/corpus.txt with the tokenizers of fixtures/ (tests/text/make_fixtures.py made
// both), line by line and for the whole text, and transformers' decode of them; the streaming decoder;
// and bad files.
#include <catch2/catch.hpp>

#include <filesystem>
#include <fstream>
#include <sstream>

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <nlohmann/json.hpp>

#include <kiln/core/error.hpp>
#include <kiln/text/tokenizer.hpp>

#include "common/kiln_test.hpp"

using kiln::text::TextStream;
using kiln::text::Tokenizer;
using kt::error_of;
using json = nlohmann::json;
namespace fs = std::filesystem;

namespace {

const std::string kFixtures = std::string(KILN_SOURCE_DIR) + "/tests/text/fixtures/";
const std::vector<std::string> kNames{"gpt2", "llama3", "qwen2", "sp_llama2_json", "sp_metaspace_json", "sp_bpe", "sp_unigram"};

std::string slurp(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  REQUIRE(in);
  std::ostringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

std::vector<std::string> corpus_lines() { return json::parse(slurp(kFixtures + "corpus.json")).get<std::vector<std::string>>(); }

// The corpus as one text: its lines joined by newlines.
std::string joined(const std::vector<std::string>& lines) {
  std::string whole;
  for (size_t i = 0; i < lines.size(); ++i) whole += (i ? "\n" : "") + lines[i];
  return whole;
}

json expected(const std::string& name) { return json::parse(slurp(kFixtures + name + "/expected.json")); }

std::string temp_dir(const std::string& name) {
  const fs::path p = fs::temp_directory_path() / fmt::format("kiln-text-{}-{}", ::getpid(), name);
  fs::remove_all(p);
  fs::create_directories(p);
  return p.string();
}

// Whole UTF-8 characters only (a piece that ends inside a character fails).
bool valid_utf8(const std::string& s) {
  for (size_t i = 0; i < s.size();) {
    const auto b = static_cast<unsigned char>(s[i]);
    const size_t n = b < 0x80 ? 1 : (b >> 5) == 6 ? 2 : (b >> 4) == 14 ? 3 : (b >> 3) == 30 ? 4 : 0;
    if (n == 0 || i + n > s.size()) return false;
    for (size_t k = 1; k < n; ++k)
      if ((static_cast<unsigned char>(s[i + k]) & 0xC0) != 0x80) return false;
    i += n;
  }
  return true;
}

void write(const std::string& path, const std::string& content) { std::ofstream(path, std::ios::binary) << content; }

}  // namespace

// The corpus files hold the lines the fixtures were computed for (the script writes them all).
TEST_CASE("text: the corpus and the fixtures agree", "[text]") {
  const auto lines = corpus_lines();
  const std::string whole = joined(lines);
  CHECK(whole == slurp(kFixtures + "corpus.txt"));
  for (const auto& name : kNames) {
    INFO(name);
    CHECK(expected(name)["lines"].size() == lines.size());
  }
}

TEST_CASE("text: encode is id for id the real library's, line by line and for the whole text", "[text]") {
  const auto lines = corpus_lines();
  const std::string whole = joined(lines);
  for (const auto& name : kNames) {
    INFO(name);
    const Tokenizer tok = Tokenizer::load(kFixtures + name);
    const json ex = expected(name);
    CHECK(tok.vocab_size() == ex["vocab_size"].get<int32_t>());
    CHECK(tok.bos_id() == (ex["bos_id"].is_null() ? std::nullopt : std::optional<int32_t>(ex["bos_id"].get<int32_t>())));
    CHECK(tok.eos_id() == (ex["eos_id"].is_null() ? std::nullopt : std::optional<int32_t>(ex["eos_id"].get<int32_t>())));
    for (size_t i = 0; i < lines.size(); ++i) {
      INFO(fmt::format("line {}: '{}'", i, lines[i]));
      CHECK(tok.encode(lines[i]) == ex["lines"][i].get<std::vector<int32_t>>());
      CHECK(tok.encode(lines[i], false) == ex["lines_no_special"][i].get<std::vector<int32_t>>());
    }
    CHECK(tok.encode(whole) == ex["whole"].get<std::vector<int32_t>>());
  }
}

TEST_CASE("text: decode is transformers' tokenizer.decode", "[text]") {
  const auto lines = corpus_lines();
  for (const auto& name : kNames) {
    INFO(name);
    const Tokenizer tok = Tokenizer::load(kFixtures + name);
    const json ex = expected(name);
    const auto whole = ex["whole"].get<std::vector<int32_t>>();
    CHECK(tok.decode(whole) == ex["decode_whole"].get<std::string>());
    CHECK(tok.decode(whole, true) == ex["decode_whole_skip"].get<std::string>());
    for (size_t i = 0; i < lines.size(); ++i) {
      INFO(fmt::format("line {}: '{}'", i, lines[i]));
      CHECK(tok.decode(ex["lines_no_special"][i].get<std::vector<int32_t>>()) == ex["decode_lines"][i].get<std::string>());
    }
  }
}

// Byte-level BPE without normalizer or clean-up promises decode(encode(x)) == x for any text (but
// the spaces an lstrip token takes: GPT-2's fixture has one, <|mask|>).
TEST_CASE("text: byte-level tokenizers round-trip any text", "[text]") {
  const auto lines = corpus_lines();
  const Tokenizer tok = Tokenizer::load(kFixtures + "gpt2");
  for (const auto& line : lines)
    if (line.find("<|mask|>") == std::string::npos) CHECK(tok.decode(tok.encode(line)) == line);
  CHECK(tok.decode(tok.encode("a   <|mask|>")) == "a<|mask|>");
  const std::string bytes = "\x01\x02 \x7f caf\xC3\xA9 \xF0\x9F\x98\x80\t\r\n";
  CHECK(tok.decode(tok.encode(bytes)) == bytes);
}

TEST_CASE("text: vocabulary pieces and special tokens", "[text]") {
  const Tokenizer gpt2 = Tokenizer::load(kFixtures + "gpt2");
  const auto eot = gpt2.id("<|endoftext|>");
  REQUIRE(eot.has_value());
  CHECK(gpt2.token(*eot) == "<|endoftext|>");
  CHECK(gpt2.is_special(*eot));
  CHECK(gpt2.encode("<|endoftext|>") == std::vector<int32_t>{*eot});
  const auto space_the = gpt2.id("\xC4\xA0the");  // "Ġthe"
  REQUIRE(space_the.has_value());
  CHECK(gpt2.token(*space_the) == "\xC4\xA0the");
  CHECK_FALSE(gpt2.is_special(*space_the));
  CHECK_FALSE(gpt2.id("no such piece").has_value());
  CHECK_THROWS_AS(gpt2.token(gpt2.vocab_size()), kiln::Error);
  const std::vector<int32_t> bad{gpt2.vocab_size()};
  CHECK_THROWS_AS(gpt2.decode(bad), kiln::Error);
  CHECK_THROWS_AS(gpt2.encode("bad \xFF utf-8"), kiln::Error);

  const Tokenizer sp = Tokenizer::load(kFixtures + "sp_bpe/tokenizer.model");
  CHECK(sp.token(1) == "<s>");
  CHECK(sp.id("<s>") == 1);
  CHECK(sp.is_special(1));
  CHECK(sp.bos_id() == 1);
  CHECK(sp.encode("a").front() == 1);
  CHECK(sp.encode("a", false).front() != 1);
}

// Streaming: the pieces concatenate to decode(all), and none ends inside a UTF-8 character.
TEST_CASE("text: TextStream gives whole characters and adds up to decode", "[text]") {
  const auto lines = corpus_lines();
  const std::string whole = joined(lines);
  for (const auto& name : kNames) {
    INFO(name);
    const Tokenizer tok = Tokenizer::load(kFixtures + name);
    for (const bool skip : {false, true}) {
      const auto ids = tok.encode(whole);
      TextStream stream(tok, skip);
      std::string out;
      size_t nonempty = 0;
      for (const int32_t id : ids) {
        const std::string piece = stream.push(id);
        if (!piece.empty()) ++nonempty;
        CHECK(valid_utf8(piece));  // never half a character
        out += piece;
      }
      out += stream.finish();
      // Llama 3's tokenizer_config turns clean_up_tokenization_spaces on: decode joins " ." etc., which a
      // stream that has given out the space cannot take back.
      if (name != "llama3") CHECK(out == tok.decode(ids, skip));
      CHECK(nonempty > ids.size() / 3);
    }
  }
  // bytes of one emoji split over byte-fallback tokens: nothing until the character is complete
  const Tokenizer sp = Tokenizer::load(kFixtures + "sp_llama2_json");
  const auto ids = sp.encode("\xF0\x9F\xA6\x80", false);  // 🦀, not in the vocabulary: four <0x..> tokens
  REQUIRE(ids.size() >= 4);
  TextStream s(sp);
  std::string got;
  for (size_t i = 0; i < ids.size(); ++i) {
    const std::string piece = s.push(ids[i]);
    if (i + 1 < ids.size()) CHECK(piece.find("\xEF\xBF\xBD") == std::string::npos);
    got += piece;
  }
  CHECK(got == sp.decode(ids));
}

TEST_CASE("text: bad tokenizer files are a kiln::Error naming the file and the field", "[text]") {
  const std::string good = slurp(kFixtures + "qwen2/tokenizer.json");
  const std::string dir = temp_dir("bad");
  const std::string p = dir + "/tokenizer.json";
  auto load_error = [&](const std::string& content) {
    write(p, content);
    return error_of([&] { Tokenizer::load(p); });
  };
  // truncated and corrupt
  std::string e = load_error(good.substr(0, good.size() / 2));
  CHECK_THAT(e, Catch::Contains(p) && Catch::Contains("not valid JSON"));
  e = load_error("");
  CHECK_THAT(e, Catch::Contains("not valid JSON"));
  e = load_error("[1, 2]");
  CHECK_THAT(e, Catch::Contains("JSON object"));
  // unknown model type
  json j = json::parse(good);
  j["model"]["type"] = "WordPiece";
  e = load_error(j.dump());
  CHECK_THAT(e, Catch::Contains(p) && Catch::Contains("model.type") && Catch::Contains("WordPiece"));
  // a merge naming a missing token
  j = json::parse(good);
  j["model"]["merges"][3] = json::array({"no-such-token", "x"});
  e = load_error(j.dump());
  CHECK_THAT(e, Catch::Contains("model.merges[3]") && Catch::Contains("no-such-token"));
  j = json::parse(good);
  j["model"]["merges"][2] = "three part merge";
  e = load_error(j.dump());
  CHECK_THAT(e, Catch::Contains("model.merges[2]"));
  // unknown pre-tokenizer, normalizer, decoder; dropout; inverted split
  j = json::parse(good);
  j["pre_tokenizer"]["pretokenizers"][0]["type"] = "BertPreTokenizer";
  CHECK_THAT(load_error(j.dump()), Catch::Contains("pre_tokenizer.pretokenizers[0].type") && Catch::Contains("BertPreTokenizer"));
  j = json::parse(good);
  j["normalizer"] = {{"type", "Lowercase"}};
  CHECK_THAT(load_error(j.dump()), Catch::Contains("normalizer.type") && Catch::Contains("Lowercase"));
  j = json::parse(good);
  j["decoder"] = {{"type", "WordPiece"}};
  CHECK_THAT(load_error(j.dump()), Catch::Contains("decoder.type"));
  j = json::parse(good);
  j["model"]["dropout"] = 0.1;
  CHECK_THAT(load_error(j.dump()), Catch::Contains("model.dropout"));
  j = json::parse(good);
  j["pre_tokenizer"]["pretokenizers"][0]["invert"] = true;
  CHECK_THAT(load_error(j.dump()), Catch::Contains("invert"));
  j = json::parse(good);
  j["pre_tokenizer"]["pretokenizers"][0]["pattern"]["Regex"] = "(unclosed";
  CHECK_THAT(load_error(j.dump()), Catch::Contains("does not compile"));
  j = json::parse(good);
  j["post_processor"] = {{"type", "RobertaProcessing"}};
  CHECK_THAT(load_error(j.dump()), Catch::Contains("post_processor.type"));
  j = json::parse(good);
  j["model"]["vocab"]["extra"] = 5;  // an id given twice
  CHECK_THAT(load_error(j.dump()), Catch::Contains("model.vocab") && Catch::Contains("id 5"));
  j = json::parse(good);
  j["model"]["vocab"].erase("a");  // a token the merges need
  CHECK_THAT(load_error(j.dump()), Catch::Contains("model.merges"));

  // tokenizer_config.json naming a token the tokenizer lacks
  fs::copy_file(kFixtures + "qwen2/tokenizer.json", p, fs::copy_options::overwrite_existing);
  write(dir + "/tokenizer_config.json", R"({"eos_token": "<|nope|>"})");
  CHECK_THAT(error_of([&] { Tokenizer::load(dir); }), Catch::Contains("tokenizer_config.json") && Catch::Contains("eos_token"));
  write(dir + "/tokenizer_config.json", R"({"eos_token": )");
  CHECK_THAT(error_of([&] { Tokenizer::load(dir); }), Catch::Contains("tokenizer_config.json") && Catch::Contains("not valid JSON"));

  // SentencePiece: truncated and corrupt model files
  const std::string model = slurp(kFixtures + "sp_bpe/tokenizer.model");
  const std::string mp = dir + "/tokenizer.model";
  write(mp, model.substr(0, model.size() / 3));
  CHECK_THAT(error_of([&] { Tokenizer::load(mp); }), Catch::Contains(mp) && Catch::Contains("SentencePiece"));
  write(mp, "this is not a model");
  CHECK_THAT(error_of([&] { Tokenizer::load(mp); }), Catch::Contains(mp));
  // a directory with neither file, a path that does not exist
  const std::string empty = temp_dir("empty");
  CHECK_THAT(error_of([&] { Tokenizer::load(empty); }), Catch::Contains("neither tokenizer.json nor tokenizer.model"));
  CHECK_THAT(error_of([&] { Tokenizer::load(empty + "/missing"); }), Catch::Contains("does not exist"));
  fs::remove_all(dir);
  fs::remove_all(empty);
}

// Llama 3's ignore_merges: a word that is in the vocabulary is one token, whatever the merges would make
// of it (tokenizers' BPE::tokenize). The trained fixtures never tell the two apart: every piece of a
// trained vocabulary is what its merges build.
TEST_CASE("text: ignore_merges takes a whole word from the vocabulary", "[text]") {
  const std::string dir = temp_dir("ignore");
  json j = {{"model",
             {{"type", "BPE"},
              {"vocab", {{"a", 0}, {"b", 1}, {"c", 2}, {"bc", 3}, {"abc", 4}}},
              {"merges", json::array({"b c"})},
              {"ignore_merges", false}}},
            {"pre_tokenizer", {{"type", "Split"}, {"pattern", {{"String", " "}}}, {"behavior", "Removed"}, {"invert", false}}}};
  write(dir + "/tokenizer.json", j.dump());
  CHECK(Tokenizer::load(dir).encode("abc cab") == std::vector<int32_t>{0, 3, 2, 0, 1});
  j["model"]["ignore_merges"] = true;
  write(dir + "/tokenizer.json", j.dump());
  CHECK(Tokenizer::load(dir).encode("abc cab") == std::vector<int32_t>{4, 2, 0, 1});
  fs::remove_all(dir);
}
