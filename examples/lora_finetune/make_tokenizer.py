#!/usr/bin/env python3
"""Writes tokenizer/tokenizer.json and tokenizer/tokenizer_config.json: a byte-level BPE tokenizer with
no merges, so one token per byte and id = the byte's value (the ids of `kiln tokenize` without --chars).
It is a real Hugging Face tokenizer (tokenizers' ByteLevel pre-tokenizer and decoder, GPT-2's byte-to-
character map), which transformers' AutoTokenizer and kiln's text::Tokenizer both read. Standard library
only: python3 examples/lora_finetune/make_tokenizer.py
"""
import json
import os


def bytes_to_unicode():  # GPT-2's map (tokenizers' ByteLevel): printable bytes stand for themselves
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    cs, n = bs[:], 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return dict(zip(bs, map(chr, cs)))


byte_char = bytes_to_unicode()
level = {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": False}
tokenizer = {
    "version": "1.0",
    "truncation": None,
    "padding": None,
    "added_tokens": [],
    "normalizer": None,
    "pre_tokenizer": level,
    "post_processor": None,
    "decoder": level,
    "model": {"type": "BPE", "dropout": None, "unk_token": None, "continuing_subword_prefix": None, "end_of_word_suffix": None,
              "fuse_unk": False, "byte_fallback": False, "ignore_merges": False,
              "vocab": {byte_char[b]: b for b in range(256)}, "merges": []},
}
config = {"tokenizer_class": "PreTrainedTokenizerFast", "model_max_length": 128, "clean_up_tokenization_spaces": False}
out = os.path.join(os.path.dirname(os.path.abspath(__file__)), "tokenizer")
os.makedirs(out, exist_ok=True)
with open(os.path.join(out, "tokenizer.json"), "w", encoding="utf-8") as f:
    json.dump(tokenizer, f, ensure_ascii=False, indent=1)
    f.write("\n")
with open(os.path.join(out, "tokenizer_config.json"), "w", encoding="utf-8") as f:
    json.dump(config, f, indent=1)
    f.write("\n")
