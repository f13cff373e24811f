// Byte-level BPE training, step for step as `tokenizers`' BpeTrainer (models/bpe/trainer.rs, word.rs):
// words are counted once, pair counts are kept incrementally (each merge only touches the words that
// hold the pair, and changes the counts of the pairs around it), and a max-heap of (count, pair) with
// lazy updates picks the next merge: an entry whose count is stale is pushed back with the current
// count. See bpe_trainer.hpp for the rules.
#include "kiln/text/bpe_trainer.hpp"

#include <algorithm>
#include <array>
#include <filesystem>
#include <queue>
#include <unordered_map>

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <nlohmann/json.hpp>

#include "kiln/core/atomic_file.hpp"
#include "kiln/core/error.hpp"
#include "kiln/text/detail.hpp"

namespace kiln::text {
namespace {

using Pair = std::pair<int32_t, int32_t>;
uint64_t key(Pair p) { return (static_cast<uint64_t>(static_cast<uint32_t>(p.first)) << 32) | static_cast<uint32_t>(p.second); }
Pair unkey(uint64_t k) { return {static_cast<int32_t>(k >> 32), static_cast<int32_t>(k & 0xffffffffu)}; }

struct Merge {
  int64_t count;
  Pair pair;
  std::vector<uint32_t> words;  // where the pair may occur
};
// tokenizers' Ord for Merge: the larger count first, then the smaller pair
struct Lower {
  bool operator()(const Merge& a, const Merge& b) const { return a.count != b.count ? a.count < b.count : a.pair > b.pair; }
};

// Merges every (c1, c2) of `w` into `rep`, left to right, and reports the pair counts that change
// (word.rs Word::merge: the pair itself is not counted down).
void merge_word(std::vector<int32_t>& w, int32_t c1, int32_t c2, int32_t rep, std::vector<std::pair<Pair, int>>& changes) {
  for (size_t i = 0; i < w.size(); ++i) {
    if (w[i] != c1 || i + 1 >= w.size() || w[i + 1] != c2) continue;
    if (i > 0) {
      changes.push_back({{w[i - 1], c1}, -1});
      changes.push_back({{w[i - 1], rep}, 1});
    }
    w[i] = rep;
    w.erase(w.begin() + static_cast<std::ptrdiff_t>(i) + 1);
    if (i + 1 < w.size()) {
      changes.push_back({{c2, w[i + 1]}, -1});
      changes.push_back({{rep, w[i + 1]}, 1});
    }
  }
}

}  // namespace

std::string train_bpe_json(std::span<const std::string> texts, const BpeTrainOptions& o) {
  // the vocabulary: special tokens, then the bytes in the order of their stand-in characters
  std::vector<std::string> id_to_word;
  std::unordered_map<std::string, int32_t> word_to_id;
  auto add = [&](const std::string& s) {
    if (word_to_id.count(s)) return;
    word_to_id.emplace(s, static_cast<int32_t>(id_to_word.size()));
    id_to_word.push_back(s);
  };
  for (const std::string& s : o.special_tokens) {
    KILN_CHECK(!s.empty(), "train_bpe: a special token is empty");
    KILN_CHECK(!word_to_id.count(s), "train_bpe: the special token '{}' is given twice", s);
    add(s);
  }
  const auto n_special = static_cast<int64_t>(o.special_tokens.size());
  KILN_CHECK(o.vocab_size >= 256 + n_special, "train_bpe: vocab_size {} is smaller than the 256 byte tokens + {} special token(s) = {}",
             o.vocab_size, n_special, 256 + n_special);
  KILN_CHECK(o.min_frequency >= 0, "train_bpe: min_frequency must be >= 0, got {}", o.min_frequency);
  std::array<std::string, 256> byte_str;
  std::vector<std::pair<uint32_t, int>> chars;
  for (int b = 0; b < 256; ++b) {
    detail::append_utf8(byte_str[b], detail::byte_level_char(static_cast<uint8_t>(b)));
    chars.emplace_back(detail::byte_level_char(static_cast<uint8_t>(b)), b);
  }
  std::sort(chars.begin(), chars.end());
  for (const auto& [c, b] : chars) add(byte_str[b]);
  std::array<int32_t, 256> byte_id;
  for (int b = 0; b < 256; ++b) byte_id[b] = word_to_id.at(byte_str[b]);

  // count the words: each line (with its '\n') of each text, split by the GPT-2 regex
  std::unordered_map<std::string, int64_t> word_counts;
  for (size_t t = 0; t < texts.size(); ++t) {
    const std::string_view text = texts[t];
    const size_t valid = detail::utf8_valid_prefix(text);
    KILN_CHECK(valid == text.size(), "train_bpe: text {} is not UTF-8 at byte {}", t, valid);
    for (size_t at = 0; at < text.size();) {
      size_t nl = text.find('\n', at);
      nl = nl == std::string_view::npos ? text.size() : nl + 1;
      detail::byte_level_pieces(text.substr(at, nl - at), [&](std::string_view w) { ++word_counts[std::string(w)]; });
      at = nl;
    }
  }
  KILN_CHECK(!word_counts.empty(), "train_bpe: the corpus is empty ({} text(s), no words)", texts.size());

  // the words as symbol ids, in a fixed order (the merges do not depend on it)
  std::vector<std::pair<std::string, int64_t>> sorted(word_counts.begin(), word_counts.end());
  std::sort(sorted.begin(), sorted.end());
  std::vector<std::vector<int32_t>> words(sorted.size());
  std::vector<int64_t> counts(sorted.size());
  for (size_t i = 0; i < sorted.size(); ++i) {
    counts[i] = sorted[i].second;
    for (const char c : sorted[i].first) words[i].push_back(byte_id[static_cast<uint8_t>(c)]);
  }

  // the pair counts and where each pair occurs
  std::unordered_map<uint64_t, int64_t> pair_counts;
  std::unordered_map<uint64_t, std::vector<uint32_t>> where;
  for (size_t i = 0; i < words.size(); ++i)
    for (size_t j = 0; j + 1 < words[i].size(); ++j) {
      const uint64_t k = key({words[i][j], words[i][j + 1]});
      pair_counts[k] += counts[i];
      auto& w = where[k];
      if (w.empty() || w.back() != i) w.push_back(static_cast<uint32_t>(i));
    }
  std::priority_queue<Merge, std::vector<Merge>, Lower> queue;
  auto flush = [&] {
    for (auto& [k, w] : where)
      if (const int64_t c = pair_counts[k]; c > 0) queue.push({c, unkey(k), std::move(w)});
    where.clear();
  };
  flush();

  std::vector<Pair> merges;
  std::vector<std::pair<Pair, int>> changes;
  while (static_cast<int64_t>(word_to_id.size()) < o.vocab_size && !queue.empty()) {
    Merge top = queue.top();
    queue.pop();
    const int64_t now = pair_counts[key(top.pair)];
    if (top.count != now) {
      top.count = now;
      queue.push(std::move(top));
      continue;
    }
    if (top.count < 1 || o.min_frequency > top.count) break;
    const std::string merged = id_to_word[top.pair.first] + id_to_word[top.pair.second];
    add(merged);
    const int32_t rep = word_to_id.at(merged);
    merges.push_back(top.pair);
    for (const uint32_t i : top.words) {
      changes.clear();
      merge_word(words[i], top.pair.first, top.pair.second, rep, changes);
      for (const auto& [p, change] : changes) {
        const uint64_t k = key(p);
        pair_counts[k] += change * counts[i];
        if (change > 0) {
          auto& w = where[k];
          if (w.empty() || w.back() != i) w.push_back(i);
        }
      }
    }
    flush();
  }

  // tokenizer.json as `tokenizers` 0.20 saves it
  using ojson = nlohmann::ordered_json;
  ojson added = ojson::array();
  for (size_t i = 0; i < o.special_tokens.size(); ++i)
    added.push_back({{"id", i},
                     {"content", o.special_tokens[i]},
                     {"single_word", false},
                     {"lstrip", false},
                     {"rstrip", false},
                     {"normalized", false},
                     {"special", true}});
  auto byte_level = [](bool add_prefix_space, bool trim_offsets) {
    return ojson{{"type", "ByteLevel"}, {"add_prefix_space", add_prefix_space}, {"trim_offsets", trim_offsets}, {"use_regex", true}};
  };
  ojson vocab = ojson::object();
  for (size_t i = 0; i < id_to_word.size(); ++i) vocab[id_to_word[i]] = i;
  ojson merge_list = ojson::array();
  for (const Pair& p : merges) merge_list.push_back({id_to_word[p.first], id_to_word[p.second]});
  const ojson doc{{"version", "1.0"},
                  {"truncation", nullptr},
                  {"padding", nullptr},
                  {"added_tokens", added},
                  {"normalizer", nullptr},
                  {"pre_tokenizer", byte_level(false, true)},
                  {"post_processor", byte_level(true, false)},
                  {"decoder", byte_level(true, true)},
                  {"model",
                   {{"type", "BPE"},
                    {"dropout", nullptr},
                    {"unk_token", nullptr},
                    {"continuing_subword_prefix", nullptr},
                    {"end_of_word_suffix", nullptr},
                    {"fuse_unk", false},
                    {"byte_fallback", false},
                    {"ignore_merges", false},
                    {"vocab", vocab},
                    {"merges", merge_list}}}};
  return doc.dump(2, ' ', false, nlohmann::json::error_handler_t::strict) + "\n";
}

Tokenizer train_bpe(std::span<const std::string> files, const BpeTrainOptions& options, const std::string& out) {
  namespace fs = std::filesystem;
  KILN_CHECK(!files.empty(), "train_bpe: no training files");
  KILN_CHECK(!out.empty(), "train_bpe: the output path is empty");
  std::vector<std::string> texts;
  texts.reserve(files.size());
  for (const std::string& f : files) {
    std::error_code ec;
    KILN_CHECK(!fs::is_directory(f, ec), "train_bpe: '{}' is a directory, not a text file", f);
    texts.push_back(detail::read_file(f));
    const size_t valid = detail::utf8_valid_prefix(texts.back());
    KILN_CHECK(valid == texts.back().size(), "train_bpe: '{}' is not UTF-8 text (invalid byte at offset {})", f, valid);
  }
  KILN_CHECK(std::any_of(texts.begin(), texts.end(), [](const std::string& t) { return !t.empty(); }),
             "train_bpe: the corpus is empty: {} hold(s) no text", fmt::join(files, ", "));
  const std::string json = train_bpe_json(texts, options);

  const bool to_file = out.size() >= 5 && out.compare(out.size() - 5, 5, ".json") == 0;
  std::error_code ec;
  if (!to_file) {
    fs::create_directories(out, ec);
    KILN_CHECK(!ec && fs::is_directory(out), "train_bpe: cannot create the directory '{}'{}", out, ec ? ": " + ec.message() : "");
  }
  const std::string path = to_file ? out : (fs::path(out) / "tokenizer.json").string();
  try {
    write_atomically(path, {{json.data(), json.size()}});
  } catch (const Error& e) {
    throw Error(fmt::format("train_bpe: cannot write the tokenizer '{}': {}", path, e.what()));
  }
  return Tokenizer::load(path);
}

}  // namespace kiln::text
