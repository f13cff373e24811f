#!/usr/bin/python3
"""kiln train step time, "precision": "f32" vs "bf16" (autocast), on the d_model 256 benchmark model
(4 layers, T 128, B 8; bench/train_vs_ref.py's configs and data), the two runs alternated per variant.
Prints the median step time over steps 3.. of each and the f32/bf16 ratio.

  KILN_NUM_THREADS=2 bench/amp/train_amp.py [--kiln build/kiln] [--steps 20] [--variants mha,diff+attnres_block]
"""
import argparse, json, os, statistics, subprocess, sys, tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
REF = os.path.join(HERE, "..", "..", "tests", "reference", "kiln_ref.py")
sys.path.insert(0, os.path.join(HERE, ".."))
from train_vs_ref import bench_model  # noqa: E402  (the same model configs)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--kiln", default=os.path.join(HERE, "..", "..", "build", "kiln"))
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--variants", default="mha,diff+attnres_block")
    a = ap.parse_args()
    tmp = tempfile.mkdtemp(prefix="kiln-amp-bench-")
    B, T = 8, 128
    tok = os.path.join(tmp, "tokens.safetensors")
    subprocess.check_call(["/usr/bin/python3", REF, "tokens", "--vocab", "256", "--n", "200000", "--out", tok])
    env = dict(os.environ, KILN_NUM_THREADS=os.environ.get("KILN_NUM_THREADS", "2"))
    print(f"{'variant':<22} {'f32 ms':>8} {'bf16 ms':>8} {'speedup':>8}   (KILN_NUM_THREADS={env['KILN_NUM_THREADS']})")
    for v in a.variants.split(","):
        model = bench_model(v, T)
        m = os.path.join(tmp, f"{v}.json")
        json.dump(model, open(m, "w"))
        ms = {"f32": [], "bf16": []}
        for r in range(a.rounds):
            for prec in ("f32", "bf16"):
                tj = os.path.join(tmp, f"train_{prec}.json")
                json.dump({"batch_size": B, "seq_len": T, "steps": a.steps, "precision": prec}, open(tj, "w"))
                log = os.path.join(tmp, f"{v}.{prec}.{r}.jsonl")
                out = subprocess.run([a.kiln, "train", "--model", m, "--train", tj, "--data", tok, "--log", log,
                                      "--progress", "off"], env=env, capture_output=True, text=True)
                if out.returncode != 0:
                    sys.exit(out.stdout + out.stderr)
                if r == 0 and prec == "f32" and v == a.variants.split(",")[0]:
                    print("  " + out.stdout.splitlines()[0])
                rows = [json.loads(l) for l in open(log) if l.strip()]
                ms[prec] += [x["ms"] for x in rows[3:]]
        f, h = statistics.median(ms["f32"]), statistics.median(ms["bf16"])
        print(f"{v:<22} {f:8.1f} {h:8.1f} {f / h:7.2f}x")


if __name__ == "__main__":
    main()
