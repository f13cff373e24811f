#!/usr/bin/env python3
"""Encode speed, one thread: kiln::text::Tokenizer (bench_text) against Hugging Face `tokenizers`, same
machine, same run, on the same text and tokenizer files.

    scripts/hf_venv.sh && .venv-hf/bin/python bench/text/run.py --bench build/bench/bench_text

The text (about 4 MB): Debian's license and copyright texts under /usr/share (English prose, lists,
URLs, code-like lines) interleaved with the multilingual test corpus of tests/text (CJK, Arabic,
Cyrillic, emoji, code, whitespace runs). The tokenizers: byte-level BPE with vocabulary 32000 trained on
that text with the GPT-2, Llama 3 and Qwen2 layouts of tests/text/make_fixtures.py, and its BERT
(WordPiece, same vocabulary) and T5-style Unigram (--unigram-vocab) layouts (--only picks some). Each side encodes
the whole text as one string REPEATS times with a warm tokenizer (its word cache filled by the first
encode); the best time counts, the first is shown too. Then the same per line ("lines": each line
encoded apart, no special tokens; `tokenizers` through encode_batch on one thread, RAYON_NUM_THREADS=1),
the way a data pipeline calls it. The ids must agree (hash of the id list).
"""
import argparse
import glob
import json
import os
import subprocess
import sys
import tempfile
import time

os.environ["RAYON_NUM_THREADS"] = "1"
os.environ["TOKENIZERS_PARALLELISM"] = "false"
HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "..", "tests", "text"))
import make_fixtures as mf  # noqa: E402
from tokenizers import Tokenizer  # noqa: E402


def bench_text(size):
    parts = []
    files = sorted(glob.glob("/usr/share/common-licenses/*")) + sorted(glob.glob("/usr/share/doc/*/copyright"))
    corpus = "\n".join(mf.CORPUS_LINES) + "\n"
    total = 0
    for i, f in enumerate(files):
        if os.path.isdir(f):
            continue
        try:
            with open(f, encoding="utf-8") as fh:
                t = fh.read()
        except (UnicodeDecodeError, OSError):
            continue
        parts.append(t)
        total += len(t.encode())
        if i % 8 == 0:
            parts.append(corpus)
            total += len(corpus.encode())
        if total >= size:
            break
    return "".join(parts)


def fnv(ids):
    h = 1469598103934665603
    for i in ids:
        h ^= i & 0xFFFFFFFF
        h = (h * 1099511628211) & 0xFFFFFFFFFFFFFFFF
    return f"{h:016x}"


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--bench", default="build/bench/bench_text")
    ap.add_argument("--size", type=int, default=4 << 20)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--vocab", type=int, default=32000)
    ap.add_argument("--unigram-vocab", type=int, default=8000)
    ap.add_argument("--only", default="gpt2,llama3,qwen2,bert_uncased,unigram_t5", help="comma-separated tokenizer names")
    a = ap.parse_args()
    text = bench_text(a.size)
    with tempfile.TemporaryDirectory(prefix="kiln-bench-text-") as tmp:  # removed at the end, pass or fail
        run(a, text, tmp)


def run(a, text, tmp):
    path = os.path.join(tmp, "text.txt")
    with open(path, "w", encoding="utf-8") as f:
        f.write(text)
    mf.VOCAB = a.vocab
    mf.UNIGRAM_VOCAB = a.unigram_vocab
    mf.TRAIN = text.replace("\\", "\\\\")  # train on the bench text itself (make_fixtures unescapes \n, \t)
    print(f"text: {len(text.encode()) / 1e6:.2f} MB, vocabulary {a.vocab}, {a.repeats} encodes each, one thread")
    print("| tokenizer | input | kiln MB/s (first) | tokenizers MB/s (first) | kiln / tokenizers | tokens |")
    print("|---|---|---|---|---|---|")
    lines = [l + "\n" for l in text.split("\n")]  # as bench_text: on newlines only (splitlines also breaks at \f, \x1c, U+2028, ...)
    lines[-1] = lines[-1][:-1]
    for name, make in [(n, m) for n, m in mf.FAST if n in a.only.split(",")]:
        d = os.path.join(tmp, name)
        make().save_pretrained(d)
        tok = Tokenizer.from_file(os.path.join(d, "tokenizer.json"))
        mb = len(text.encode()) / 1e6
        for mode in ["whole", "lines"]:
            k = json.loads(subprocess.run([a.bench, d, path, str(a.repeats), mode], check=True, capture_output=True, text=True).stdout)
            times = []
            for _ in range(a.repeats):
                t0 = time.perf_counter()
                if mode == "whole":
                    ids = tok.encode(text).ids
                else:
                    ids = [i for e in tok.encode_batch(lines, add_special_tokens=False) for i in e.ids]
                times.append(time.perf_counter() - t0)
            assert fnv(ids) == k["hash"] and len(ids) == k["tokens"], (name, mode, len(ids), k)
            kb, tb = mb / k["best_s"], mb / min(times)
            print(f"| {name} | {mode} | {kb:.1f} ({mb / k['first_s']:.1f}) | {tb:.1f} ({mb / times[0]:.1f}) | {kb / tb:.2f} | {len(ids)} |",
                  flush=True)

if __name__ == "__main__":
    main()
