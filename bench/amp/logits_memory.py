#!/usr/bin/python3
"""Peak memory and step time of `kiln train` where the logits are the step's largest tensors: a GPT with
GPT-2's vocabulary (50,304), d_model 256, 2 layers, B 8, T 256 (2,048 x 50,304 logits a step), in f32 and
under bf16 autocast. One process per run (peak resident set from wait4), the runs alternated A B B A
per kiln binary and precision; prints each run's peak, median step time over steps 2.. and last loss.

  KILN_NUM_THREADS=2 bench/amp/logits_memory.py [--kiln build-cpu/kiln[,other/kiln]] [--steps 8] [--rounds 2]
                                                [--loss-chunk-rows -1,0] [--precisions bf16,f32]

Several binaries (comma-separated) compare builds, e.g. before and after a change (bench/RESULTS.md,
"bf16 logits into the cross-entropy"); several train.json `loss_chunk_rows` values compare the LM head
and loss made whole (-1) with the fused op (0: automatic, N: rows per chunk), each binary with each.
"""
import argparse, json, os, random, shutil, statistics, struct, subprocess, sys, tempfile


def tokens(path, n, vocab):
    rng = random.Random(1)
    data = struct.pack(f"<{n}q", *(rng.randrange(vocab) for _ in range(n)))
    head = json.dumps({"tokens": {"dtype": "I64", "shape": [n], "data_offsets": [0, len(data)]}}).encode()
    head += b" " * (-len(head) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(head)) + head + data)


def run(kiln, model, train, tok, log, env):
    p = subprocess.Popen([kiln, "train", "--model", model, "--train", train, "--data", tok, "--log", log, "--progress", "off"],
                         env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    err = p.stderr.read()
    _, status, usage = os.wait4(p.pid, 0)
    if status != 0:
        sys.exit(f"{kiln} train failed: {err.decode(errors='replace')}")
    rows = [json.loads(l) for l in open(log) if '"ms"' in l]
    return usage.ru_maxrss / 1024, statistics.median(r["ms"] for r in rows[2:]), rows[-1]["loss"]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--kiln", default="build-cpu/kiln")
    ap.add_argument("--steps", type=int, default=8)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--loss-chunk-rows", default="", help="comma-separated train.json loss_chunk_rows values (default: unset)")
    ap.add_argument("--precisions", default="bf16,f32")
    a = ap.parse_args()
    vocab, B, T = 50304, 8, 256
    tmp = tempfile.mkdtemp(prefix="kiln-logits-")
    tok, model = os.path.join(tmp, "tok.safetensors"), os.path.join(tmp, "model.json")
    tokens(tok, 400000, vocab)
    json.dump({"vocab_size": vocab, "d_model": 256, "n_layers": 2, "n_heads": 4, "max_seq_len": T, "attention": "mha"}, open(model, "w"))
    env = dict(os.environ, KILN_NUM_THREADS=os.environ.get("KILN_NUM_THREADS", "2"))
    print(f"vocab {vocab}, B {B}, T {T}, KILN_NUM_THREADS={env['KILN_NUM_THREADS']}")
    chunks = [int(c) for c in a.loss_chunk_rows.split(",")] if a.loss_chunk_rows else [None]
    variants = [(k, c) for k in a.kiln.split(",") for c in chunks]
    for prec in a.precisions.split(","):
        order = [v for _ in range(a.rounds) for v in (variants + variants[::-1])]
        for i, (k, c) in enumerate(order):
            train = os.path.join(tmp, f"train_{prec}_{c}.json")
            cfg = {"batch_size": B, "seq_len": T, "steps": a.steps, "precision": prec}
            if c is not None:
                cfg["loss_chunk_rows"] = c
            json.dump(cfg, open(train, "w"))
            rss, ms, loss = run(k, model, train, tok, os.path.join(tmp, f"log{i}.jsonl"), env)
            label = k if c is None else f"{k} loss_chunk_rows {c}"
            print(f"{prec:5s} {label:48s} peak {rss:8.1f} MiB  step {ms:7.1f} ms  loss {loss:.6f}")
    shutil.rmtree(tmp)


if __name__ == "__main__":
    main()
