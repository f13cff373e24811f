#!/usr/bin/env python3
"""`kiln train` against the PyTorch reference (kiln_ref.py train) on randomly drawn configurations.

  random_configs.py KILN KILN_REF WORK_DIR FIRST COUNT [MPIRUN|none MPI_COUNT]

The parity tests in test_train_parity.cpp cover chosen combinations; this draws the rest of the space
docs/specs.md allows: vocabulary, width, depth, heads and KV heads (GQA), head widths down to 2, FFN
width, attention (mha / diff / diff2), residual (standard / attnres_full / attnres_block with any block size),
RoPE on or off with its theta, tied embeddings, norm epsilons, the optional affine sub-norms, batch
size, any seq_len up to max_seq_len (1 included), AdamW or SGD with momentum, weight decay, the three
schedules with warm-up, clipping on or off. Case i draws its configuration, tokens and initial weights
from seed i, so a failure names a case that replays alone (FIRST = i, COUNT = 1) and leaves its files
in WORK_DIR/i.

Cases FIRST .. FIRST+COUNT-1 run in one process (2 threads); with MPIRUN, MPI_COUNT further cases run
under `mpirun -np 2` (one thread per rank). Per step: loss within 1e-4 relative and gradient norm
within 1e-3 relative of the reference (docs/specs.md §5), the learning rate to 1e-12.
Fails (exit 1) without PyTorch (python3-torch), which the suite's set-up installs (scripts/setup.sh --python), as the C++ torch tests do.
"""
import json
import os
import random
import subprocess
import sys

kiln, kiln_ref, work = sys.argv[1:4]
first, count = int(sys.argv[4]), int(sys.argv[5])
mpirun = sys.argv[6] if len(sys.argv) > 6 and sys.argv[6] != "none" else ""
mpi_count = int(sys.argv[7]) if len(sys.argv) > 7 else 0
try:
    import torch  # noqa: F401
except ImportError:
    sys.exit("random_configs.py: PyTorch (python3-torch) is needed for the reference: run scripts/setup.sh --python, or set KILN_PYTHON")
PY = sys.executable
ENV = dict(os.environ, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1")


def draw(r):
    """A model.json and a train.json that docs/specs.md accepts, drawn from r."""
    attention = r.choice(["mha", "diff", "diff2"])
    rope = r.random() < 0.7
    while True:  # a head width the attention and RoPE accept (diff: two halves; RoPE: even)
        heads = r.randint(1, 6)
        head_width = r.choice([2, 4, 6, 8, 10, 12, 16]) * (2 if attention == "diff" else 1)
        rope_width = head_width // 2 if attention == "diff" else head_width
        if not rope or rope_width % 2 == 0:
            break
    # diff2 runs 2·heads query heads: any divisor of those (a pair may straddle two kv heads, as in the official module)
    q_heads = 2 * heads if attention == "diff2" else heads
    kv_choices = [d for d in range(1, q_heads + 1) if q_heads % d == 0]
    model = {"vocab_size": r.randint(5, 300), "d_model": heads * head_width, "n_layers": r.randint(1, 5),
             "n_heads": heads, "n_kv_heads": r.choice(kv_choices),
             "max_seq_len": r.randint(8, 96), "attention": attention,
             "residual": r.choice(["standard", "attnres_full", "attnres_block"]), "attnres_block_size": r.randint(1, 5),
             "rope": rope, "rope_theta": r.choice([500.0, 10000.0, 1e6]), "tie_embeddings": r.random() < 0.5,
             "norm_eps": r.choice([1e-6, 1e-5, 1e-3]), "diff_subln_affine": r.random() < 0.5,
             "attnres_key_norm_affine": r.random() < 0.5}
    if r.random() < 0.5:
        model["ffn_hidden"] = r.randint(1, 200)
    if r.random() < 0.5:
        opt = {"name": "adamw", "lr": r.choice([1e-3, 3e-3, 1e-2]), "betas": [0.9, r.choice([0.95, 0.999])], "eps": 1e-8,
               "weight_decay": r.choice([0.0, 0.1])}
    else:
        opt = {"name": "sgd", "lr": r.choice([0.05, 0.1]), "momentum": r.choice([0.0, 0.9]), "weight_decay": r.choice([0.0, 0.1])}
    schedule = r.choice([{"name": "constant"},
                         {"name": "cosine", "warmup_steps": r.randint(0, 4), "min_lr_ratio": 0.1},
                         {"name": "linear", "warmup_steps": r.randint(0, 3), "min_lr_ratio": 0.0}])
    train = {"batch_size": r.choice([2, 4, 6]), "seq_len": r.randint(1, model["max_seq_len"]), "steps": 6,
             "grad_clip": r.choice([0.0, 0.1, 1.0]), "optimizer": opt, "schedule": schedule}
    return model, train


def run(cmd, env=ENV):
    p = subprocess.run(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=600)
    return p.returncode, p.stdout


def case(i, under_mpi):
    model, train = draw(random.Random(i))
    d = os.path.join(work, str(i))
    os.makedirs(d, exist_ok=True)
    m, t, tok, init = (os.path.join(d, f) for f in ("model.json", "train.json", "tokens.safetensors", "init.safetensors"))
    json.dump(model, open(m, "w"), indent=1)
    json.dump(train, open(t, "w"), indent=1)
    what = (f"case {i}{' (mpirun -np 2)' if under_mpi else ''}: {model['attention']} {model['residual']} "
            f"h{model['n_heads']}/{model['n_kv_heads']} d{model['d_model']} L{model['n_layers']} "
            f"T{train['seq_len']} B{train['batch_size']} {train['optimizer']['name']}; files in {d}")
    # the three reference commands in one process (joined by "+": PyTorch imported once)
    rc, out = run([PY, kiln_ref, "tokens", "--vocab", str(model["vocab_size"]), "--n", "3000", "--seed", str(i), "--out", tok,
                   "+", "init", "--model", m, "--seed", str(i), "--out", init,
                   "+", "train", "--model", m, "--train", t, "--data", tok, "--init-from", init,
                   "--log", os.path.join(d, "ref.jsonl"), "--threads", "1"])
    if rc:
        return f"{what}\n  the reference failed: {out[-1000:]}"
    cmd = [kiln, "train", "--model", m, "--train", t, "--data", tok, "--init-from", init,
           "--log", os.path.join(d, "kiln.jsonl"), "--quiet"]
    if under_mpi:
        cmd = [mpirun, "-np", "2", "--oversubscribe", "--bind-to", "none"] + cmd
    rc, out = run(cmd, dict(ENV, KILN_NUM_THREADS="1" if under_mpi else "2"))
    if rc:
        return f"{what}\n  kiln train failed ({rc}): {out[-1000:]}"
    ref = [json.loads(x) for x in open(os.path.join(d, "ref.jsonl")) if x.strip()]
    got = [json.loads(x) for x in open(os.path.join(d, "kiln.jsonl")) if x.strip()]
    if len(got) != len(ref):
        return f"{what}\n  {len(got)} log records, the reference {len(ref)}"
    bad = []
    for k, r in zip(got, ref):
        for key, tol in (("loss", 1e-4), ("grad_norm", 1e-3), ("lr", 1e-12)):
            if abs(k[key] - r[key]) > tol * max(abs(r[key]), 1e-12):
                bad.append(f"step {r['step']} {key}: kiln {k[key]!r}, reference {r[key]!r}")
    return f"{what}\n  " + "\n  ".join(bad) if bad else None


failures = []
cases = [(i, False) for i in range(first, first + count)]
if mpirun and mpi_count > 0:
    cases += [(i, True) for i in range(first + count, first + count + mpi_count)]
for i, under_mpi in cases:
    f = case(i, under_mpi)
    print(f if f else f"case {i}{' (mpirun -np 2)' if under_mpi else ''}: ok", flush=True)
    if f:
        failures.append(f)
print(f"{len(cases) - len(failures)} of {len(cases)} random configurations match the reference")
sys.exit(1 if failures else 0)
