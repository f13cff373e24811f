#pragma once
// kiln::text::train_bpe: trains a byte-level BPE tokenizer (GPT-2's layout) on text files and writes the
// tokenizer.json that kiln::text::Tokenizer and Hugging Face `tokenizers` load (docs/formats.md,
// "Training a BPE tokenizer").
//
//   kiln::text::BpeTrainOptions o{.vocab_size = 1024, .min_frequency = 2, .special_tokens = {"<|endoftext|>"}};
//   kiln::text::Tokenizer tok = kiln::text::train_bpe({"corpus.txt"}, o, "my_tokenizer/");  // writes my_tokenizer/tokenizer.json
//
// It is `tokenizers`' BpeTrainer behind a ByteLevel pre-tokenizer, as this Python trains it:
//   tok = Tokenizer(models.BPE()); tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
//   tok.decoder = decoders.ByteLevel(); tok.post_processor = processors.ByteLevel(trim_offsets=False)
//   tok.train(files, trainers.BpeTrainer(vocab_size=..., min_frequency=..., special_tokens=[...],
//                                        initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
// and gives the same vocabulary and merges, merge for merge (tests/text/test_bpe_trainer.cpp checks it
// against what tokenizers 0.20.3 trained on the fixtures):
// - each file is read line by line, each line with its '\n' a text of its own (so white space never
//   spans two lines), split by the GPT-2 regex into words; words are counted;
// - ids: the special tokens first (0, 1, ...), then the 256 bytes in the order of their GPT-2 stand-in
//   characters, then one token per merge;
// - each merge joins the adjacent pair with the largest count (summed over the words' counts); ties go
//   to the pair with the smaller (first id, second id); training stops when the vocabulary reaches
//   vocab_size, when no pair is left, or when the best pair occurs fewer than min_frequency times.
// Special tokens in the training text are ordinary text (as in `tokenizers`: they are added after
// training); in the trained tokenizer they are added tokens matched in the raw text.
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "kiln/text/tokenizer.hpp"

#pragma GCC visibility push(default)  // exported from libkiln (CMakeLists.txt: hidden by default)
namespace kiln::text {

struct BpeTrainOptions {
  // The vocabulary size to reach: special tokens + 256 bytes + merges (at least 256 + the specials).
  int64_t vocab_size = 30000;
  // A pair is merged only if it occurs at least this often (0 and 1: every pair that occurs).
  int64_t min_frequency = 0;
  // Added tokens (special: true), given ids 0, 1, ... in this order; duplicates are an error.
  std::vector<std::string> special_tokens;
};

// The tokenizer.json text (a JSON document) trained on `texts` (each read as a file's contents). A
// kiln::Error for: no words at all (every text empty), a vocab_size below 256 + the special tokens, an
// empty or repeated special token, text that is not UTF-8 (naming the text's index and byte offset).
std::string train_bpe_json(std::span<const std::string> texts, const BpeTrainOptions& options);

// Trains on the files and writes the tokenizer: `out` is a tokenizer.json path (anything ending in
// ".json") or a directory (created if missing; gets out/tokenizer.json). Written as kiln writes every file
// (core/atomic_file.hpp: a temporary file beside it, fsync'ed and renamed), so a failure leaves nothing
// half-written and an existing file as it was. Returns the tokenizer, loaded back
// from the file. Unreadable files and unwritable outputs are a kiln::Error naming the path.
Tokenizer train_bpe(std::span<const std::string> files, const BpeTrainOptions& options, const std::string& out);

}  // namespace kiln::text
#pragma GCC visibility pop
