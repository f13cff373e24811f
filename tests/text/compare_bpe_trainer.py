#!/usr/bin/env python3
"""`kiln tokenizer train` against Hugging Face `tokenizers`' BpeTrainer on random corpora and settings:
the two tokenizer.json documents must be equal (vocabulary, merges in order, added tokens, layout).
Needs `tokenizers` (scripts/hf_venv.sh); not part of the default suite, which checks the committed
fixtures instead (test_bpe_trainer.cpp).

    .venv-hf/bin/python tests/text/compare_bpe_trainer.py build/kiln [SEED] [TRIALS]
"""
import json
import os
import random
import subprocess
import sys
import tempfile

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers


def hf_train(path, vocab, min_frequency, specials):
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.post_processor = processors.ByteLevel(trim_offsets=False)
    tok.train([path], trainers.BpeTrainer(vocab_size=vocab, min_frequency=min_frequency, special_tokens=specials, show_progress=False,
                                          initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    return json.loads(tok.to_str())


def main():
    kiln = sys.argv[1]
    rng = random.Random(int(sys.argv[2]) if len(sys.argv) > 2 else 0)
    trials = int(sys.argv[3]) if len(sys.argv) > 3 else 20
    bad = compared = 0
    with tempfile.TemporaryDirectory(prefix="kiln_bpe_compare_") as d:
        corpus, out = os.path.join(d, "corpus.txt"), os.path.join(d, "tokenizer.json")
        for trial in range(trials):
            # small alphabets make many ties and repeated symbols (aaaa), the cases the tie-break decides
            alphabet = rng.choice(["ab", "abc ", "aab b\n", "xyz  \t\n", "αβγ ab\n", "😀a b\n", "abcdefghij klm\n", "It's 1,234!\r\n"])
            text = "".join(rng.choice(alphabet) for _ in range(rng.randint(50, 5000)))
            with open(corpus, "w", encoding="utf-8", newline="") as f:
                f.write(text)
            vocab, minf = rng.choice([257, 260, 300, 400, 1000]), rng.choice([0, 1, 2, 5])
            specials = rng.choice([[], ["<s>"], ["a", "<x>"]])  # "a" is also a byte: it keeps the special's id
            if vocab < 256 + len(specials):
                continue
            compared += 1
            want = hf_train(corpus, vocab, minf, specials)
            args = [kiln, "tokenizer", "train", "--data", corpus, "--vocab-size", str(vocab), "--min-frequency", str(minf), "--out", out]
            for s in specials:
                args += ["--special-token", s]
            r = subprocess.run(args, capture_output=True, text=True)
            got = json.load(open(out)) if r.returncode == 0 else None
            if got != want:
                bad += 1
                print(f"trial {trial}: differs (alphabet {alphabet!r}, {len(text)} chars, vocab {vocab}, min_frequency {minf}, "
                      f"specials {specials}){': ' + r.stderr if r.returncode else ''}")
    print(f"{compared} corpora compared, {bad} different")
    sys.exit(1 if bad else 0)


if __name__ == "__main__":
    main()
