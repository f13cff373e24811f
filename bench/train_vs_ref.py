#!/usr/bin/python3
"""kiln train vs the PyTorch reference (kiln_ref.py train) on the same files, one after the other.

Prints, per model variant: median step time over steps 3.. (the "ms" of each log), train tokens/s,
peak RSS of each process, and the ratios. docs/specs.md §5: the reference runs under
OMP_WAIT_POLICY=PASSIVE with --threads 2; kiln with KILN_NUM_THREADS=2.

  bench/train_vs_ref.py [--kiln build/kiln] [--steps 30] [--variants mha,diff,mha+attnres_block,diff+attnres_block]
                        [--kiln-base other/kiln]

--kiln-base: a second kiln build (e.g. before a change) run on the same files right after the first,
reported as "base ms" and "base speedup" (its own ratio to the same reference run).
"""
import argparse, json, os, resource, statistics, subprocess, sys, tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
REF = os.path.join(HERE, "..", "tests", "reference", "kiln_ref.py")


def run(cmd, env):
    """Runs cmd, returns (peak RSS in MiB of that child)."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
    pid = os.fork()
    if pid == 0:
        os.execvpe(cmd[0], cmd, env)
    _, status, usage = os.wait4(pid, 0)
    if status != 0:
        sys.exit(f"failed ({status}): {' '.join(cmd)}")
    return usage.ru_maxrss / 1024.0


def bench_model(variant, T):
    """The d_model 256 benchmark model (docs/specs.md §5) of a variant "attention[+residual]"."""
    att, _, res = variant.partition("+")
    return {"vocab_size": 256, "d_model": 256, "n_layers": 4, "n_heads": 2 if att == "diff" else 4,
            "max_seq_len": T, "attention": att, "residual": res or "standard", "attnres_block_size": 4}


def median_ms(log):
    rows = [json.loads(l) for l in open(log) if l.strip()]
    return statistics.median(r["ms"] for r in rows[3:])


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--kiln", default=os.path.join(HERE, "..", "build", "kiln"))
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--variants", default="mha,diff,mha+attnres_block,diff+attnres_block")
    ap.add_argument("--kiln-base", default="")
    a = ap.parse_args()
    tmp = tempfile.mkdtemp(prefix="kiln-bench-")
    B, T = 8, 128
    train = {"batch_size": B, "seq_len": T, "steps": a.steps}
    tok = os.path.join(tmp, "tokens.safetensors")
    base_env = dict(os.environ)
    subprocess.check_call(["/usr/bin/python3", REF, "tokens", "--vocab", "256", "--n", "200000", "--out", tok])
    json.dump(train, open(os.path.join(tmp, "train.json"), "w"))
    print(f"{'variant':<22} {'kiln ms':>8} {'ref ms':>8} {'kiln tok/s':>11} {'ref tok/s':>10} {'speedup':>8} "
          f"{'kiln RSS':>9} {'ref RSS':>8}" + (f" {'base ms':>8} {'base speedup':>12}" if a.kiln_base else ""))
    results = []
    for v in a.variants.split(","):
        model = bench_model(v, T)
        m = os.path.join(tmp, f"{v}.json")
        json.dump(model, open(m, "w"))
        init = os.path.join(tmp, f"{v}.init.safetensors")
        subprocess.check_call(["/usr/bin/python3", REF, "init", "--model", m, "--out", init])
        common = ["--model", m, "--train", os.path.join(tmp, "train.json"), "--data", tok, "--init-from", init]
        klog, rlog = os.path.join(tmp, f"{v}.kiln.jsonl"), os.path.join(tmp, f"{v}.ref.jsonl")
        kenv = dict(base_env, KILN_NUM_THREADS="2")
        renv = dict(base_env, OMP_WAIT_POLICY="PASSIVE", OMP_NUM_THREADS="2")
        krss = run([a.kiln, "train", *common, "--log", klog, "--quiet"], kenv)
        if a.kiln_base:
            blog = os.path.join(tmp, f"{v}.base.jsonl")
            run([a.kiln_base, "train", *common, "--log", blog, "--quiet"], kenv)
        rrss = run(["/usr/bin/python3", REF, "train", *common, "--log", rlog, "--threads", "2"], renv)
        km, rm = median_ms(klog), median_ms(rlog)
        row = {"variant": v, "kiln_ms": km, "ref_ms": rm, "kiln_tok_s": B * T / km * 1e3, "ref_tok_s": B * T / rm * 1e3,
               "speedup": rm / km, "kiln_rss_mib": krss, "ref_rss_mib": rrss}
        base = ""
        if a.kiln_base:
            row["base_ms"] = median_ms(blog)
            base = f" {row['base_ms']:8.1f} {rm / row['base_ms']:11.2f}x"
        results.append(row)
        print(f"{v:<22} {km:8.1f} {rm:8.1f} {row['kiln_tok_s']:11.0f} {row['ref_tok_s']:10.0f} {rm / km:7.2f}x "
              f"{krss:8.0f}M {rrss:7.0f}M" + base, flush=True)
    json.dump(results, open(os.path.join(tmp, "results.json"), "w"), indent=1)
    print(f"(logs and results.json in {tmp})")


if __name__ == "__main__":
    main()
