#!/usr/bin/python3
"""kiln train step time of several builds / instruction sets, interleaved A/B (issue 14: AVX-512).

Each configuration is LABEL=KILN[@ISA]: a kiln command and, optionally, KILN_CPU_ISA for it. The
d_model 256, 4 layers, T 128, B 8 model of bench/train_vs_ref.py (mha), same data and initial weights
for all; each round runs every configuration once (--steps steps each, in a rotating order), and the
step times of steps 3.. of all rounds are pooled per configuration: median and 10th percentile (on a
loaded machine the low percentile is the better estimate of an undisturbed step), and their ratios to
the first configuration's.

  bench/isa_ab.py old=/path/old/kiln new=build/kiln@avx2 new512=build/kiln@avx512 [--rounds 3] [--steps 12]
"""
import argparse, json, os, statistics, subprocess, tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
REF = os.path.join(HERE, "..", "tests", "reference", "kiln_ref.py")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("configs", nargs="+", help="LABEL=KILN[@ISA]")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--steps", type=int, default=12)
    ap.add_argument("--attention", default="mha")
    a = ap.parse_args()
    configs = []
    for c in a.configs:
        label, _, rest = c.partition("=")
        kiln, _, isa = rest.partition("@")
        configs.append((label, kiln, isa))
    tmp = tempfile.mkdtemp(prefix="kiln-isa-ab-")
    B, T = 8, 128
    tok = os.path.join(tmp, "tokens.safetensors")
    subprocess.check_call(["/usr/bin/python3", REF, "tokens", "--vocab", "256", "--n", "200000", "--out", tok])
    json.dump({"batch_size": B, "seq_len": T, "steps": a.steps}, open(os.path.join(tmp, "train.json"), "w"))
    model = {"vocab_size": 256, "d_model": 256, "n_layers": 4, "n_heads": 2 if a.attention == "diff" else 4, "max_seq_len": T,
             "attention": a.attention, "residual": "standard", "attnres_block_size": 4}
    m = os.path.join(tmp, "model.json")
    json.dump(model, open(m, "w"))
    init = os.path.join(tmp, "init.safetensors")
    subprocess.check_call(["/usr/bin/python3", REF, "init", "--model", m, "--out", init])
    common = ["--model", m, "--train", os.path.join(tmp, "train.json"), "--data", tok, "--init-from", init, "--quiet"]
    ms = {label: [] for label, _, _ in configs}
    for r in range(a.rounds):
        order = configs[r % len(configs):] + configs[:r % len(configs)]
        for label, kiln, isa in order:
            env = dict(os.environ, KILN_NUM_THREADS="2")
            if isa:
                env["KILN_CPU_ISA"] = isa
            log = os.path.join(tmp, f"{label}.{r}.jsonl")
            subprocess.check_call([kiln, "train", *common, "--log", log], env=env)
            rows = [json.loads(l) for l in open(log) if l.strip()]
            ms[label] += [row["ms"] for row in rows[3:]]
    def p10(v):
        return sorted(v)[len(v) // 10]

    first, first10 = statistics.median(ms[configs[0][0]]), p10(ms[configs[0][0]])
    print(f"{'config':<12} {'median ms':>10} {'p10 ms':>8} {'steps':>6} {'median vs ' + configs[0][0]:>14} {'p10 vs ' + configs[0][0]:>11}")
    for label, kiln, isa in configs:
        med, low = statistics.median(ms[label]), p10(ms[label])
        print(f"{label:<12} {med:10.1f} {low:8.1f} {len(ms[label]):6d} {first / med:13.3f}x {first10 / low:10.3f}x   "
              f"({kiln}{' KILN_CPU_ISA=' + isa if isa else ''})")
    print(f"(logs in {tmp})")


if __name__ == "__main__":
    main()
