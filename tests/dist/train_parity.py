#!/usr/bin/env python3
"""`mpirun -np 2 kiln train` against one process (docs/distributed.md, "What N ranks compute").

  train_parity.py MPIRUN KILN KILN_REF WORK_DIR

Each rank takes its contiguous half of every batch's rows (docs/specs.md §4 row order) and the
gradients are averaged, so 2 ranks with batch_size B take the steps of one process with batch_size B:
  * per-step losses within 1e-5 relative and final weights within 1e-4 (relative L2 over the model) of
    `kiln train` in one process, for MHA and Diff + AttnRes, with and without ZeRO-1, with gradient
    accumulation;
  * losses within 1e-4 and weights within 1e-3 of the PyTorch reference (kiln_ref.py train, one process);
  * a 2-rank run stopped and resumed (by 2 ranks) is bit-identical to one that never stopped; a ZeRO-1
    checkpoint written by 2 ranks resumes in 1 process (and continues as the 2-rank run does, to 1e-5);
  * a batch_size that does not divide among the ranks is refused, naming both.
Fails (exit 1) without PyTorch (python3-torch), which the suite's set-up installs (scripts/setup.sh --python), as the C++ torch tests do.
"""
import json
import math
import os
import subprocess
import sys

mpirun, kiln, kiln_ref, work = sys.argv[1:5]
os.makedirs(work, exist_ok=True)
try:
    import torch  # noqa: F401
except ImportError:
    sys.exit("train_parity.py: PyTorch (python3-torch) is needed for the reference and the data: run scripts/setup.sh --python, or set KILN_PYTHON")
sys.path.insert(0, os.path.dirname(kiln_ref))
from kiln_ref import load_safetensors  # noqa: E402

ENV = dict(os.environ, KILN_NUM_THREADS="1", OMP_NUM_THREADS="1", OMPI_ALLOW_RUN_AS_ROOT="1",
           OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1")
MPI = [mpirun, "-np", "2", "--oversubscribe", "--bind-to", "none"]
failures = []


def run(cmd, expect_ok=True):
    p = subprocess.run(cmd, env=ENV, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=300)
    if expect_ok and p.returncode != 0:
        print(p.stdout)
        raise SystemExit(f"FAIL: {' '.join(cmd)} exited {p.returncode}")
    return p


def path(name):
    return os.path.join(work, name)


def write_json(name, obj):
    with open(path(name), "w") as f:
        json.dump(obj, f)
    return path(name)


def losses(log):
    with open(log) as f:
        return [json.loads(line)["loss"] for line in f if line.strip()]


def check(cond, what):
    print(("ok   " if cond else "FAIL ") + what)
    if not cond:
        failures.append(what)


def rel_l2(a, b):
    d2 = n2 = 0.0
    for k in b:
        d2 += float(((a[k].double() - b[k].double()) ** 2).sum())
        n2 += float((b[k].double() ** 2).sum())
    return math.sqrt(d2 / max(n2, 1e-30))


def compare(name, got_log, want_log, got_w, want_w, loss_rel, weight_rel):
    g, w = losses(got_log), losses(want_log)
    worst = max(abs(a - b) / abs(b) for a, b in zip(g, w)) if len(g) == len(w) and w else float("inf")
    check(len(g) == len(w) and worst <= loss_rel, f"{name}: {len(g)} steps, losses within {loss_rel:g} (worst {worst:.2e})")
    a, b = load_safetensors(got_w), load_safetensors(want_w)
    d = rel_l2(a, b) if set(a) == set(b) else float("inf")
    check(d <= weight_rel, f"{name}: final weights within {weight_rel:g} (relative L2 {d:.2e})")


tokens = path("tokens.safetensors")
run([sys.executable, kiln_ref, "tokens", "--vocab", "64", "--n", "20000", "--seed", "2", "--out", tokens])

MODELS = {
    "mha": {"vocab_size": 64, "d_model": 64, "n_layers": 2, "n_heads": 4, "max_seq_len": 32},
    "diff+attnres_block": {"vocab_size": 64, "d_model": 64, "n_layers": 2, "n_heads": 2, "max_seq_len": 32,
                           "attention": "diff", "residual": "attnres_block", "attnres_block_size": 2, "n_kv_heads": 1},
}
BASE = {"batch_size": 4, "seq_len": 32, "steps": 12, "optimizer": {"name": "adamw", "lr": 3e-3, "betas": [0.9, 0.95],
        "weight_decay": 0.1}, "schedule": {"name": "cosine", "warmup_steps": 2, "min_lr_ratio": 0.1}}


def init_of(model):
    return path("init-" + os.path.basename(model).replace(".json", ".safetensors"))


def train(tag, model, train_cfg, ranks, extra=()):
    log, save = path(f"{tag}.jsonl"), path(f"{tag}.safetensors")
    cmd = ([] if ranks == 1 else MPI) + [kiln, "train", "--model", model, "--train", train_cfg, "--data", tokens,
                                        "--init-from", init_of(model), "--log", log, "--save", save,
                                        "--progress", "off", *extra]
    run(cmd)
    return log, save


for mname, m in MODELS.items():
    model = write_json(f"{mname}.json", m)
    run([sys.executable, kiln_ref, "init", "--model", model, "--seed", "5", "--out", init_of(model)])
    for zero in (0, 1):
        for accum in (1, 2):
            t = dict(BASE, zero_stage=zero, grad_accum=accum)
            cfg = write_json(f"train-{mname}-z{zero}-a{accum}.json", t)
            tag = f"{mname}-z{zero}-a{accum}"
            one = train(f"{tag}-1p", model, cfg, 1)
            two = train(f"{tag}-2r", model, cfg, 2)
            compare(f"{mname}, zero_stage {zero}, grad_accum {accum}: 2 ranks vs 1 process", two[0], one[0], two[1], one[1], 1e-5, 1e-4)

    # against the PyTorch reference, one process (it has neither ZeRO nor accumulation)
    cfg = write_json(f"train-{mname}-ref.json", BASE)
    two = train(f"{mname}-ref-2r", model, cfg, 2)
    ref_log, ref_w = path(f"{mname}-ref.jsonl"), path(f"{mname}-ref.safetensors")
    run([sys.executable, kiln_ref, "train", "--model", model, "--train", cfg, "--data", tokens, "--init-from",
         init_of(model), "--log", ref_log, "--save", ref_w, "--threads", "1"])
    compare(f"{mname}: 2 ranks vs kiln_ref.py train", two[0], ref_log, two[1], ref_w, 1e-4, 1e-3)

# Stop and resume, 2 ranks, ZeRO-1 on: bit-identical to the uninterrupted 2-rank run.
model = path("mha.json")
cfg = write_json("train-resume.json", dict(BASE, zero_stage=1, checkpoint_every=4))
full = train("resume-full", model, cfg, 2, ["--checkpoint", path("full.ck.safetensors")])
ck = path("resume.ck.safetensors")
train("resume-a", model, cfg, 2, ["--checkpoint", ck, "--stop-after", "5"])
part_log = path("resume-a.jsonl")
run(MPI + [kiln, "train", "--model", model, "--train", cfg, "--data", tokens, "--resume", ck, "--checkpoint", ck,
           "--log", part_log, "--save", path("resume-b.safetensors"), "--progress", "off"])
check(losses(part_log) == losses(full[0]), "2 ranks stopped after step 5 and resumed by 2 ranks: the same losses, bit for bit")
a, b = load_safetensors(path("resume-b.safetensors")), load_safetensors(full[1])
check(set(a) == set(b) and all(bool((a[k] == b[k]).all()) for k in b), "... and the same final weights, bit for bit")

# A ZeRO-1 checkpoint written by 2 ranks, resumed in one process (with a plain AdamW).
train("zero1p-a", model, cfg, 2, ["--checkpoint", ck, "--stop-after", "5"])
one_log = path("zero1p-a.jsonl")
run([kiln, "train", "--model", model, "--train", cfg, "--data", tokens, "--resume", ck, "--checkpoint", ck, "--log", one_log,
     "--save", path("zero1p-b.safetensors"), "--progress", "off"])
compare("ZeRO-1 checkpoint of 2 ranks resumed in 1 process", one_log, full[0], path("zero1p-b.safetensors"), full[1], 1e-5, 1e-4)

# A batch that does not divide.
bad = write_json("train-bad.json", dict(BASE, batch_size=3))
p = run(MPI + [kiln, "train", "--model", model, "--train", bad, "--data", tokens, "--progress", "off"], expect_ok=False)
check(p.returncode != 0 and "batch_size 3" in p.stdout and "2 ranks" in p.stdout,
      f"batch_size 3 on 2 ranks: refused (exit {p.returncode}), naming 3 and 2")

print(f"{len(failures)} failed" if failures else "train_parity.py: all passed")
sys.exit(1 if failures else 0)
