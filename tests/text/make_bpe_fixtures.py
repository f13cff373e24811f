#!/usr/bin/env python3
"""Regenerates tests/text/fixtures/bpe_train/: what Hugging Face `tokenizers`' BpeTrainer trains on a
small corpus, for kiln::text::train_bpe to reproduce merge for merge (tests/text/test_bpe_trainer.cpp).

    scripts/hf_venv.sh && .venv-hf/bin/python tests/text/make_bpe_fixtures.py

Nothing is downloaded. fixtures/bpe_train/corpus.txt is made here: the lines of make_fixtures.py's
training text and test corpus, and lines of words drawn (fixed seed) from them with random white space,
digits, punctuation and characters of several scripts, so counts tie often (the trainer's tie-breaking
is part of what is checked). For each setting in SETTINGS, <name>/tokenizer.json is the tokenizer
`tokenizers` trained on that file, laid out as GPT-2's (ByteLevel pre-tokenizer without prefix space,
ByteLevel decoder and post-processor), and <name>/expected.json the ids it gives for make_fixtures.py's
test lines (CORPUS_LINES) and for the whole corpus (v1000 only), and its decode of them.
"""
import json
import os
import random

import tokenizers
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

import make_fixtures

HERE = os.path.dirname(os.path.abspath(__file__))
OUT = os.path.join(HERE, "fixtures", "bpe_train")

# name: (vocab_size, min_frequency, special tokens)
SETTINGS = {
    "v1000": (1000, 0, ["<|endoftext|>", "<pad>"]),
    "v600_min3": (600, 3, []),
    "v4000_min2": (4000, 2, ["<s>"]),  # stops on min_frequency before the vocabulary is full
}


def corpus():
    rng = random.Random(27)
    base = make_fixtures.TRAIN.replace("\\n", "\n").replace("\\t", "\t").splitlines(keepends=True)
    base += [line + "\n" for line in make_fixtures.CORPUS_LINES]
    words = " ".join(base).split()
    extra = "αβγδ жзий ñçßø 中文字 かなカナ 한글 ٠١٢ 🙂🚀 \u00a0\u2009"
    lines = []
    for _ in range(900):
        n = rng.randint(1, 14)
        parts = []
        for _ in range(n):
            r = rng.random()
            if r < 0.75:
                parts.append(rng.choice(words))
            elif r < 0.85:
                parts.append(str(rng.randint(0, 10 ** rng.randint(1, 6))))
            elif r < 0.93:
                parts.append("".join(rng.choice(extra) for _ in range(rng.randint(1, 4))))
            else:
                parts.append(rng.choice([",", ".", "!!", "--", "'s", "'ll", "()", "{}", "..."]))
        sep = rng.choice([" ", " ", " ", "  ", "\t", " \t "])
        lines.append(rng.choice(["", "", " ", "    "]) + sep.join(parts) + rng.choice(["\n", "\n", " \n", "\n\n", "\r\n"]))
    return "".join(base * 2 + lines)


def train(path, vocab_size, min_frequency, specials):
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.post_processor = processors.ByteLevel(trim_offsets=False)
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, min_frequency=min_frequency, special_tokens=specials, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train([path], trainer)
    return tok


def main():
    os.makedirs(OUT, exist_ok=True)
    path = os.path.join(OUT, "corpus.txt")
    with open(path, "w", encoding="utf-8", newline="") as f:
        f.write(corpus())
    with open(path, encoding="utf-8", newline="") as f:
        whole = f.read()
    for name, (vocab, minf, specials) in SETTINGS.items():
        tok = train(path, vocab, minf, specials)
        d = os.path.join(OUT, name)
        os.makedirs(d, exist_ok=True)
        tok.save(os.path.join(d, "tokenizer.json"))
        lines = make_fixtures.CORPUS_LINES + ["<|endoftext|>x<pad> <s>"]
        ids = [tok.encode(s).ids for s in lines]
        whole_ids = tok.encode(whole).ids if name == "v1000" else None  # one is enough (size)
        data = {"settings": {"vocab_size": vocab, "min_frequency": minf, "special_tokens": specials},
                "lines": lines, "ids": ids, "decoded": [tok.decode(i, skip_special_tokens=False) for i in ids],
                "whole": whole_ids, "vocab_size": tok.get_vocab_size(), "merges": len(json.loads(tok.to_str())["model"]["merges"])}
        with open(os.path.join(d, "expected.json"), "w", encoding="utf-8") as f:
            json.dump(data, f, ensure_ascii=False, separators=(",", ":"))
    with open(os.path.join(OUT, "versions.json"), "w") as f:
        json.dump({"tokenizers": tokenizers.__version__}, f)


if __name__ == "__main__":
    main()
