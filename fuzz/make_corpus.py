#!/usr/bin/env python3
"""Writes the fuzzers' seed corpus (fuzz/corpus/<target>/): small valid files and edge cases of every
format kiln reads (docs/formats.md). Deterministic; run it again after a format changes:
    python3 fuzz/make_corpus.py [build/fuzz/fuzz_resume]
The resume seeds are checkpoints of the fuzzer's own small GPT, so the built fuzz_resume writes them
(KILN_FUZZ_SEEDS=fuzz/corpus/resume, fuzz/fuzz_resume.cpp) when its path is given; they are committed.
"""
import gzip, json, os, struct, subprocess, sys

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
OUT = os.path.join(HERE, "corpus")
SIZES = {"F64": 8, "F32": 4, "BF16": 2, "F16": 2, "I64": 8, "I32": 4, "I16": 2, "U16": 2, "I8": 1, "U8": 1, "U32": 4, "BOOL": 1}


def put(target, name, data):
    d = os.path.join(OUT, target)
    os.makedirs(d, exist_ok=True)
    with open(os.path.join(d, name), "wb") as f:
        f.write(data if isinstance(data, bytes) else data.encode())


def safetensors(tensors, metadata=None):
    """tensors: [(name, dtype, shape, raw bytes)] -> the file's bytes (names sorted, header padded to 8)."""
    header, blobs, off = {}, [], 0
    if metadata is not None:
        header["__metadata__"] = metadata
    for name, dt, shape, raw in sorted(tensors):
        header[name] = {"dtype": dt, "shape": shape, "data_offsets": [off, off + len(raw)]}
        blobs.append(raw)
        off += len(raw)
    js = json.dumps(header, separators=(",", ":")).encode()
    js += b" " * ((8 - len(js) % 8) % 8)
    return struct.pack("<Q", len(js)) + js + b"".join(blobs)


def main():
    # safetensors: every dtype, a scalar, an empty tensor, metadata, and a few broken headers
    ts = []
    for i, (dt, n) in enumerate(SIZES.items()):
        raw = bytes((j * 37 + i) % 256 for j in range(3 * n)) if dt != "BOOL" else bytes([0, 1, 1])
        ts.append((f"t{i}_{dt.lower()}", dt, [3], raw))
    put("safetensors", "every_dtype", safetensors(ts, {"format": "pt", "note": "caf\u00e9"}))
    put("safetensors", "scalar_and_empty", safetensors([("s", "F32", [], struct.pack("<f", 1.5)), ("e", "F32", [0, 4], b"")]))
    put("safetensors", "matrix", safetensors([("layers.0.attn.q_proj.weight", "F32", [2, 3], struct.pack("<6f", *range(6)))]))
    put("safetensors", "empty_header", struct.pack("<Q", 2) + b"{}")
    put("safetensors", "overlap", struct.pack("<Q", 96) + json.dumps({"a": {"dtype": "U8", "shape": [2], "data_offsets": [0, 2]}, "b": {"dtype": "U8", "shape": [2], "data_offsets": [1, 3]}}).encode().ljust(96) + b"abc")
    put("safetensors", "truncated", safetensors(ts[:2])[:-3])

    # model.json / train.json: the repository's own, the defaults, and edge cases
    with open(os.path.join(ROOT, "examples", "char_gpt", "model.json")) as f:
        put("model_json", "char_gpt", f.read())
    with open(os.path.join(ROOT, "examples", "char_gpt", "train.json")) as f:
        put("train_json", "char_gpt", f.read())
    put("model_json", "empty", "{}")
    put("model_json", "diff_gqa", json.dumps({"attention": "diff", "n_heads": 4, "n_kv_heads": 2, "d_model": 64, "residual": "attnres_block", "attnres_block_size": 2, "rope": False}))
    put("model_json", "bad_types", '{"d_model": "64", "n_layers": 1.5, "rope": 1}')
    put("model_json", "unknown_key", '{"d_modle": 64}')
    put("train_json", "empty", "{}")
    put("train_json", "sgd_step", json.dumps({"optimizer": {"name": "sgd", "lr": 0.1, "momentum": 0.9, "nesterov": True}, "schedule": {"name": "step", "warmup_steps": 2, "step_size": 3, "gamma": 0.5}, "steps": 10}))
    put("train_json", "cosine_accum", json.dumps({"batch_size": 2, "seq_len": 8, "steps": 5, "grad_accum": 3, "on_nonfinite": "skip", "schedule": {"name": "cosine", "warmup_steps": 1, "min_lr_ratio": 0.0}}))
    put("train_json", "bad", '{"optimizer": {"name": "adamw", "betas": [0.9]}, "steps": -1}')

    # IDX: the fuzzer's first byte picks the mode (even: one file; odd: images + labels split at bytes 1..2)
    def idx(type_code, dims, payload):
        return bytes([0, 0, type_code, len(dims)]) + b"".join(struct.pack(">I", d) for d in dims) + payload
    images = idx(0x08, [2, 2, 2], bytes(range(8)))
    labels = idx(0x08, [2], bytes([3, 7]))
    put("idx", "ubyte", b"\x00" + idx(0x08, [4], bytes([1, 2, 3, 4])))
    put("idx", "i32_gz", b"\x02" + gzip.compress(idx(0x0C, [2, 2], struct.pack(">4i", 1, -2, 3, -4)), mtime=0))
    put("idx", "f64", b"\x00" + idx(0x0E, [1], struct.pack(">d", 0.25)))
    put("idx", "pair", b"\x01" + struct.pack("<H", len(images)) + images + labels)
    put("idx", "pair_gz", b"\x01" + struct.pack("<H", len(gzip.compress(images, mtime=0))) + gzip.compress(images, mtime=0) + gzip.compress(labels, mtime=0))

    # token files
    put("tokens", "i32", safetensors([("tokens", "I32", [10], struct.pack("<10i", *range(10)))], {"tokenizer": "bytes", "vocab_size": "256"}))
    put("tokens", "u8", safetensors([("tokens", "U8", [6], bytes([5, 4, 3, 2, 1, 0]))]))
    put("tokens", "i64_chars", safetensors([("tokens", "I64", [5], struct.pack("<5q", 0, 1, 2, 1, 0))], {"tokenizer": "chars", "alphabet": "ab\n", "vocab_size": "3"}))
    put("tokens", "f32", safetensors([("tokens", "F32", [2], struct.pack("<2f", 1, 2))]))

    # checkpoints: a kiln train checkpoint's metadata around one tensor, and a plain weights file
    meta = {"kiln_checkpoint": "1", "step": "20", "rng_seed": "0", "rng_offset": "1234",
            "model_config": json.dumps({"d_model": 32, "n_layers": 1, "n_heads": 2, "vocab_size": 64}),
            "train_config": json.dumps({"steps": 20, "batch_size": 2, "seq_len": 8}), "data": "tokens.safetensors"}
    put("checkpoint", "kiln_train", safetensors([("model.norm.weight", "F32", [2], struct.pack("<2f", 1, 1))], meta))
    put("checkpoint", "bad_step", safetensors([("x", "F32", [1], struct.pack("<f", 0))], dict(meta, step="12abc")))
    put("checkpoint", "weights_only", safetensors([("norm.weight", "F32", [2], struct.pack("<2f", 1, 1))]))

    # text
    put("text", "ascii", "The quick brown fox jumps over the lazy dog.\n\tIndented %\n")
    put("text", "utf8", "caf\u00e9 \u00fcber \u65e5\u672c\u8a9e \U0001f600\n")
    put("text", "alphabet", b"\x03abcabccba")
    put("text", "binary", bytes(range(256)))

    # JSONL logs (docs/formats.md, "The JSONL log"): kiln train's, kiln::fit's, a resumed run's repeats,
    # a torn last line, skipped steps with nulls, and lines kiln plot refuses
    def log(*records):
        return "".join(json.dumps(r, separators=(",", ":")) + "\n" for r in records)
    put("log", "train", log(*({"step": s, "loss": 3.2 - 0.1 * s, "lr": 0.001 * (s + 1), "grad_norm": 1.5, "ms": 12.5,
                                "tokens_per_s": 5000.0} for s in range(4)), {"step": 4, "loss": 2.7, "lr": 0.004, "eval_loss": 2.9}))
    put("log", "fit_samples", log({"step": 0, "loss": 0.7, "lr": 0.1, "grad_norm": 2.0, "samples_per_s": 900.0, "eval_loss": 0.6,
                                   "eval_accuracy": 0.8, "flops": 1e9, "gflops": 3.5},
                                  {"step": 1, "loss": None, "lr": 0.1, "grad_norm": None, "skipped": True, "skipped_steps": 1}))
    put("log", "resumed_torn", log({"step": 0, "loss": 1.0}, {"step": 1, "loss": 0.9}, {"step": 2, "loss": 0.8}, {"step": 1, "loss": 0.95},
                                   {"step": 2, "loss": 0.85}) + '{"step":3,"loss":0.')
    put("log", "blank_crlf", '\r\n{"step": 0, "loss": 1e-3, "lr": 0}\r\n  \t\n{"step": 1, "loss": 1e308, "lr": -0.0}')
    put("log", "bad_lines", b'{"step": -1, "loss": 1}\n{"step": 1.5}\n{"loss": 2}\n[1, 2]\n{"step": 18446744073709551615}\n'
        b'{"step": 2, "loss": "x"}\n\xff\xfe\n')

    # resume: checkpoints of fuzz_resume's own model, written by the fuzzer itself
    if len(sys.argv) > 1:
        d = os.path.join(OUT, "resume")
        os.makedirs(d, exist_ok=True)
        subprocess.run([sys.argv[1]], env=dict(os.environ, KILN_FUZZ_SEEDS=d), check=True)


if __name__ == "__main__":
    main()
