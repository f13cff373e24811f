// kiln::text::Tokenizer against the real libraries: the ids `tokenizers` / transformers / `sentencepiece`
// computed for fixtures/corpus.txt with the tokenizers of fixtures/ (tests/text/make_fixtures.py made
// both), line by line and for the whole text, and transformers' decode of them; the streaming decoder;
// and bad files.
#include <catch2/catch.hpp>

#include <filesystem>
#include <fstream>
#include <random>
#include <sstream>

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <nlohmann/json.hpp>

#include <kiln/core/error.hpp>
#include <kiln/text/tokenizer.hpp>

#include "common/kiln_test.hpp"
#include "text_test.hpp"

using kiln::text::TextStream;
using kiln::text::Tokenizer;
using kt::error_of;
using kt::slurp;
using json = nlohmann::json;
namespace fs = std::filesystem;

namespace {

const std::string kFixtures = std::string(KILN_SOURCE_DIR) + "/tests/text/fixtures/";
const std::vector<std::string> kNames{
    "gpt2",       "llama3",       "qwen2",      "sp_llama2_json", "sp_metaspace_json", "sp_bpe",
    "sp_unigram", "bert_uncased", "bert_cased", "unigram_t5",     "unigram_bytes",     "unigram_precompiled"};

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
  // bytes of one emoji split over byte-fallback tokens: nothing until the run of them ends (the next
  // piece), then the whole character
  const Tokenizer sp = Tokenizer::load(kFixtures + "sp_llama2_json");
  const auto ids = sp.encode("\xF0\x9F\xA6\x80 a", false);  // 🦀, not in the vocabulary: four <0x..> tokens
  REQUIRE(ids.size() >= 5);
  TextStream s(sp);
  std::string got;
  int byte_pieces = 0;
  for (const int32_t id : ids) {
    const std::string t = sp.token(id), piece = s.push(id);
    if (t.size() == 6 && t.rfind("<0x", 0) == 0) {
      ++byte_pieces;
      CHECK(piece.empty());
    }
    got += piece;
  }
  CHECK(byte_pieces == 4);
  CHECK(got.find("\xF0\x9F\xA6\x80") != std::string::npos);  // given out when " a" came
  CHECK(got + s.finish() == sp.decode(ids));

  // A byte-fallback run decodes as a whole: "<0x2A>" alone is "*", but "<0x2A><0xA3>" (not UTF-8) is
  // two U+FFFD, so a stream that gave out "*" at once could not add up to decode (and gave out half of
  // a U+FFFD). Random id sequences, half of them byte pieces.
  std::vector<int32_t> bytes, others;
  for (int32_t id = 0; id < sp.vocab_size(); ++id) {
    const std::string t = sp.token(id);
    (t.size() == 6 && t.rfind("<0x", 0) == 0 ? bytes : others).push_back(id);
  }
  REQUIRE(bytes.size() == 256);
  std::mt19937 rng(7);
  for (int trial = 0; trial < 300; ++trial) {
    std::vector<int32_t> seq;
    for (int i = 0; i < 10; ++i) {
      const auto& from = rng() % 2 ? bytes : others;
      seq.push_back(from[rng() % from.size()]);
    }
    TextStream st(sp);
    std::string out;
    for (const int32_t id : seq) {
      const std::string piece = st.push(id);
      CHECK(valid_utf8(piece));
      out += piece;
    }
    const std::string rest = st.finish();
    CHECK(valid_utf8(rest));
    CHECK(out + rest == sp.decode(seq));
  }
  {  // the case that showed it: '*' then a lone continuation byte, then a piece
    TextStream st(sp);
    std::string out = st.push(*sp.id("<0x2A>"));
    CHECK(out.empty());  // the run may go on
    out += st.push(*sp.id("<0xA3>"));
    out += st.push(others.back());
    const std::vector<int32_t> seq = {*sp.id("<0x2A>"), *sp.id("<0xA3>"), others.back()};
    CHECK(out + st.finish() == sp.decode(seq));
    CHECK(sp.decode(seq).rfind("\xEF\xBF\xBD\xEF\xBF\xBD", 0) == 0);
  }
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
  j["model"]["type"] = "WordLevel";
  e = load_error(j.dump());
  CHECK_THAT(e, Catch::Contains(p) && Catch::Contains("model.type") && Catch::Contains("WordLevel"));
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
  j["pre_tokenizer"]["pretokenizers"][0]["type"] = "CharDelimiterSplit";
  CHECK_THAT(load_error(j.dump()), Catch::Contains("pre_tokenizer.pretokenizers[0].type") && Catch::Contains("CharDelimiterSplit"));
  j = json::parse(good);
  j["normalizer"] = {{"type", "ByteLevel"}};
  CHECK_THAT(load_error(j.dump()), Catch::Contains("normalizer.type") && Catch::Contains("ByteLevel"));
  j = json::parse(good);
  j["normalizer"] = {{"type", "Precompiled"}, {"precompiled_charsmap", "AAAA"}};  // 3 bytes
  CHECK_THAT(load_error(j.dump()), Catch::Contains("normalizer.precompiled_charsmap") && Catch::Contains("header"));
  j = json::parse(good);
  j["normalizer"] = {{"type", "Precompiled"}, {"precompiled_charsmap", "QAAAAA=="}};  // a trie of 64 bytes in 4
  CHECK_THAT(load_error(j.dump()), Catch::Contains("normalizer.precompiled_charsmap") && Catch::Contains("64 bytes"));
  j = json::parse(good);
  j["decoder"] = {{"type", "CTC"}};
  CHECK_THAT(load_error(j.dump()), Catch::Contains("decoder.type") && Catch::Contains("CTC"));
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
  j["post_processor"] = {{"type", "FancyProcessing"}};
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

// Unigram and WordPiece files that are not well formed, and a ByteLevel pre-tokenizer on a model that
// is not BPE.
TEST_CASE("text: bad Unigram and WordPiece files name the field", "[text]") {
  const std::string dir = temp_dir("bad-models");
  const std::string p = dir + "/tokenizer.json";
  auto load_error = [&](const json& j) {
    write(p, j.dump());
    return error_of([&] { Tokenizer::load(p); });
  };
  json u = json::parse(slurp(kFixtures + "unigram_t5/tokenizer.json"));
  json j = u;
  j["model"]["vocab"][5] = json::array({"x"});
  CHECK_THAT(load_error(j), Catch::Contains(p) && Catch::Contains("model.vocab[5]") && Catch::Contains("[piece, score]"));
  j = u;
  j["model"]["unk_id"] = 100000;
  CHECK_THAT(load_error(j), Catch::Contains("model.unk_id"));
  j = u;
  j["model"]["vocab"] = json::array();
  CHECK_THAT(load_error(j), Catch::Contains("model.vocab") && Catch::Contains("empty"));
  j = u;
  j["model"]["shrinking"] = 1;
  CHECK_THAT(load_error(j), Catch::Contains("model.shrinking") && Catch::Contains("Unigram"));
  j = u;
  j["pre_tokenizer"] = {{"type", "ByteLevel"}, {"add_prefix_space", false}};
  CHECK_THAT(load_error(j), Catch::Contains("pre_tokenizer") && Catch::Contains("ByteLevel"));
  // without an unk id a character outside the vocabulary cannot be encoded (tokenizers: MissingUnkId)
  j = u;
  j["model"]["unk_id"] = nullptr;
  write(p, j.dump());
  const Tokenizer no_unk = Tokenizer::load(p);
  CHECK(no_unk.encode("the", false).size() >= 1);
  CHECK_THAT(error_of([&] { no_unk.encode("\xE2\x98\x83", false); }), Catch::Contains("unk_id") && Catch::Contains(p));

  json w = json::parse(slurp(kFixtures + "bert_cased/tokenizer.json"));
  j = w;
  j["model"]["max_input_chars_per_word"] = -3;
  CHECK_THAT(load_error(j), Catch::Contains("model.max_input_chars_per_word"));
  j = w;
  j["model"]["vocab"] = json::array();
  CHECK_THAT(load_error(j), Catch::Contains("model.vocab"));
  j = w;
  j["model"]["unk_token"] = "[NOPE]";
  write(p, j.dump());
  const Tokenizer bad_unk = Tokenizer::load(p);
  CHECK_THAT(error_of([&] { bad_unk.encode("\xE2\x98\x83", false); }), Catch::Contains("[NOPE]"));
  j = w;
  j["post_processor"] = {{"type", "BertProcessing"}, {"sep", json::array({"[SEP]"})}, {"cls", json::array({"[CLS]", 2})}};
  CHECK_THAT(load_error(j), Catch::Contains("post_processor.sep"));
  j = w;
  j["normalizer"]["lowercase"] = "yes";
  CHECK_THAT(load_error(j), Catch::Contains("normalizer.lowercase"));
  fs::remove_all(dir);
}

// WordPiece on a hand-made vocabulary: greedy longest match, ## pieces, a word with no segmentation or
// longer than max_input_chars_per_word is one [UNK] (whatever pieces it would have had), multi-byte
// characters step back whole; BertPreTokenizer splits off each punctuation mark.
TEST_CASE("text: WordPiece is greedy longest-match with unk for whole words", "[text]") {
  const std::string dir = temp_dir("wordpiece");
  json j = {
      {"model",
       {{"type", "WordPiece"},
        {"unk_token", "[UNK]"},
        {"continuing_subword_prefix", "##"},
        {"max_input_chars_per_word", 6},
        {"vocab", {{"[UNK]", 0}, {"un", 1}, {"##aff", 2}, {"##able", 3}, {"u", 4}, {"##n", 5}, {"caf", 6}, {"##\xC3\xA9", 7}, {"!", 8}}}}},
      {"pre_tokenizer", {{"type", "BertPreTokenizer"}}},
      {"decoder", {{"type", "WordPiece"}, {"prefix", "##"}, {"cleanup", true}}}};
  write(dir + "/tokenizer.json", j.dump());
  const Tokenizer tok = Tokenizer::load(dir);
  CHECK(tok.encode("unaff!") == std::vector<int32_t>{1, 2, 8});
  CHECK(tok.encode("unable") == std::vector<int32_t>{1, 3});
  CHECK(tok.encode("unaffable") == std::vector<int32_t>{0});  // 9 characters > 6
  CHECK(tok.encode("unx un") == std::vector<int32_t>{0, 1});  // "x" has no piece: the whole word is [UNK]
  CHECK(tok.encode("caf\xC3\xA9!!") == std::vector<int32_t>{6, 7, 8, 8});
  CHECK(tok.decode(std::vector<int32_t>{1, 2, 8, 6, 7}) == "unaff! caf\xC3\xA9");
  fs::remove_all(dir);
}

// Unigram on a hand-made vocabulary: the best total score wins over the greedy longest piece, runs of
// unknown characters fuse into one unk, and with byte_fallback an unknown run becomes its bytes.
TEST_CASE("text: Unigram is the Viterbi best segmentation", "[text]") {
  const std::string dir = temp_dir("unigram");
  json vocab = json::array({json::array({"<unk>", 0.0}), json::array({"a", -1.0}), json::array({"b", -1.0}), json::array({"ab", -3.0}),
                            json::array({"abc", -30.0}), json::array({"c", -2.5}), json::array({"bc", -1.0}), json::array({"xy", -30.0}),
                            json::array({"y", 8.0})});
  json j = {{"model", {{"type", "Unigram"}, {"unk_id", 0}, {"vocab", vocab}}}};
  write(dir + "/tokenizer.json", j.dump());
  const Tokenizer tok = Tokenizer::load(dir);
  CHECK(tok.encode("ab") == std::vector<int32_t>{1, 2});       // -2 beats "ab" -3
  CHECK(tok.encode("abc") == std::vector<int32_t>{1, 6});      // a + bc = -2 beats abc -30, ab + c -5.5
  CHECK(tok.encode("axxb") == std::vector<int32_t>{1, 0, 2});  // "xx" one fused unk
  // an unknown character scores the lowest score (-30) less 10: unk(x) + y = -40 + 8 loses to xy = -30
  CHECK(tok.encode("xy") == std::vector<int32_t>{7});
  for (int b = 0; b < 256; ++b) vocab.push_back(json::array({fmt::format("<0x{:02X}>", b), -20.0}));
  j["model"]["vocab"] = vocab;
  j["model"]["byte_fallback"] = true;
  write(dir + "/tokenizer.json", j.dump());
  const Tokenizer bytes = Tokenizer::load(dir);
  CHECK(bytes.encode("axxb") == std::vector<int32_t>{1, 9 + 'x', 9 + 'x', 2});
  fs::remove_all(dir);
}

// BertNormalizer and Lowercase: the characters whose handling tokenizers' Unicode tables fix (checked
// against tokenizers over every code point when the fixtures were made).
TEST_CASE("text: BertNormalizer cleans, spaces CJK, strips accents and lowercases as tokenizers", "[text]") {
  const Tokenizer bert = Tokenizer::load(kFixtures + "bert_uncased");
  const Tokenizer cased = Tokenizer::load(kFixtures + "bert_cased");
  // control and format characters vanish; U+0890 (Cf only since Unicode 14) stays
  CHECK(bert.encode("a\x01\xE2\x80\x8B"
                    "b",
                    false) == bert.encode("ab", false));
  CHECK(cased.encode("x\xE0\xA2\x90", false) != cased.encode("x", false));
  // CJK ideographs are words of their own with handle_chinese_chars
  CHECK(bert.encode("\xE6\x88\x91\xE4\xBB\xAC", false) == bert.encode("\xE6\x88\x91 \xE4\xBB\xAC", false));
}

// Lowercase is Rust's char::to_lowercase one character at a time: U+0130 becomes "i" + U+0307, and a
// final capital sigma is σ (no final-sigma rule).
TEST_CASE("text: Lowercase maps characters as tokenizers", "[text]") {
  const std::string dir = temp_dir("lowercase");
  const json j = {{"normalizer", {{"type", "Lowercase"}}},
                  {"model",
                   {{"type", "WordPiece"},
                    {"unk_token", "[UNK]"},
                    {"vocab", {{"[UNK]", 0}, {"i", 1}, {"##\xCC\x87", 2}, {"##\xCF\x83", 3}, {"\xCF\x83", 4}, {"##\xCF\x82", 5}}}}}};
  write(dir + "/tokenizer.json", j.dump());
  const Tokenizer tok = Tokenizer::load(dir);
  CHECK(tok.encode("\xC4\xB0\xCE\xA3") == std::vector<int32_t>{1, 2, 3});  // İΣ -> i U+0307 σ
  CHECK(tok.encode("\xCE\xA3") == std::vector<int32_t>{4});
  fs::remove_all(dir);
}
