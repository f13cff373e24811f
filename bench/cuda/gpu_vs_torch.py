#!/usr/bin/env python3
"""The PyTorch side of the GPU benchmarks, and kiln train --device cuda against PyTorch eager.

  bench/cuda/gpu_vs_torch.py [--kiln build/kiln] [--steps 20] [--only gpt|attention] [--precisions f32,bf16,f16]
      [--attention mha,diff]
  bench/cuda/gpu_vs_torch.py --smoke --kiln KILN [--kiln-device cuda]   tiny shapes, torch on the CPU if
      it has no GPU: checks that the script runs end to end (the emulated device's CTest does this)

Prints JSON lines: torch.matmul GEMMs (same shapes as bench_cuda), scaled_dot_product_attention
forward+backward (same shapes), elementwise add and index_add / embedding backward (same sizes), and a GPT-2-small-sized training step (d_model 768, 12 layers,
T 1024, AdamW) for attention mha and diff, as tokens/s of kiln_ref.py's model in eager mode on the GPU
and of `kiln train --device cuda` on the same model config. `--precisions` runs that step in each of
f32, bf16 and f16 (PyTorch: `torch.autocast`, and a `GradScaler` for f16; kiln: train.json's
"precision"), and prints both frameworks' first and last losses, so a real-sized model's mixed-precision
training is seen to train as its f32 run does. `--only gpt` skips the kernel benchmarks, `--only attention` runs the attention cases alone.
"""
import argparse, importlib.util, json, math, os, statistics, subprocess, sys, tempfile, time

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
# The PyTorch reference model: the repository's tests/reference/kiln_ref.py.
REF = os.path.join(HERE, "..", "..", "tests", "reference", "kiln_ref.py")


def sync():
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def sdpa(q, k, v):
    """Causal attention: PyTorch's fused scaled_dot_product_attention (torch >= 2.0, the GPU image's);
    Debian's torch 1.13 lacks it, and the --smoke check falls back to the same math unfused."""
    F = torch.nn.functional
    if hasattr(F, "scaled_dot_product_attention"):
        return F.scaled_dot_product_attention(q, k, v, is_causal=True)
    s = (q @ k.transpose(-1, -2)) / math.sqrt(q.size(-1))
    t = q.size(-2)
    s = s.masked_fill(torch.ones(t, t, dtype=torch.bool, device=q.device).triu(1), float("-inf"))
    return s.softmax(-1) @ v


def timed(f, reps=20):
    for _ in range(3):
        f()
    sync()
    t = []
    for _ in range(reps):
        a = time.perf_counter()
        f()
        sync()
        t.append((time.perf_counter() - a) * 1e3)
    return statistics.median(t)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--kiln", default=os.path.join(HERE, "..", "..", "build", "kiln"))
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--kiln-device", default="cuda")
    ap.add_argument("--smoke", action="store_true")
    ap.add_argument("--only", choices=["all", "gpt", "attention"], default="all")
    ap.add_argument("--precisions", default="f32")
    ap.add_argument("--attention", default="mha,diff")
    a = ap.parse_args()
    dev = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if dev.type != "cuda" and not a.smoke:
        sys.exit("gpu_vs_torch.py: PyTorch sees no GPU (use --smoke for a CPU check of the script)")
    name = torch.cuda.get_device_name() if dev.type == "cuda" else "cpu"
    print(json.dumps({"device": name, "torch": torch.__version__}), flush=True)
    gemms = [(1024, 1024, 1024), (4096, 4096, 4096), (8192, 768, 768), (8192, 3072, 768), (8192, 768, 3072), (8192, 50304, 768)]
    atts = [(4, 12, 12, 1024, 64, 64), (4, 6, 6, 1024, 64, 128), (4, 12, 4, 1024, 64, 64), (2, 16, 16, 2048, 128, 128)]
    T, B, V, d_model, n_layers, heads = 1024, a.batch, 50304, 768, 12, 12
    reps = 20
    if a.smoke:
        gemms, atts = [(24, 40, 16)], [(1, 2, 2, 24, 16, 16), (1, 2, 1, 24, 16, 32)]
        T, B, V, d_model, n_layers, heads, reps = 16, 2, 64, 32, 2, 4, 2
        a.steps = 5
    precisions = a.precisions.split(",")
    for p in precisions:
        if p not in ("f32", "bf16", "f16"):
            sys.exit(f"gpu_vs_torch.py: --precisions: {p!r} is not f32, bf16 or f16")
    if a.only == "gpt":
        gemms, atts = [], []
    if a.only == "attention":
        gemms = []
    for M, N, K in gemms:
        for dt, tf32 in [(torch.float32, False), (torch.float32, True), (torch.bfloat16, False)]:
            torch.backends.cuda.matmul.allow_tf32 = tf32
            x, y = torch.randn(M, K, device=dev, dtype=dt), torch.randn(K, N, device=dev, dtype=dt)
            ms = timed(lambda: x @ y, reps)
            print(json.dumps({"bench": "gemm", "M": M, "N": N, "K": K, "dtype": str(dt), "tf32": tf32, "torch_tflops": 2 * M * N * K / ms / 1e9}))
    torch.backends.cuda.matmul.allow_tf32 = False
    F = torch.nn.functional
    for Ba, H, Hkv, Ta, d, dv in atts:
        q = torch.randn(Ba, H, Ta, d, device=dev, requires_grad=True)
        k = torch.randn(Ba, Hkv, Ta, d, device=dev, requires_grad=True)
        v = torch.randn(Ba, Hkv, Ta, dv, device=dev, requires_grad=True)
        rep = H // Hkv
        kk, vv = (k.repeat_interleave(rep, 1), v.repeat_interleave(rep, 1)) if rep > 1 else (k, v)
        fwd = timed(lambda: sdpa(q, kk.detach(), vv.detach()), reps)
        o = sdpa(q, kk, vv)
        g = torch.randn_like(o)
        bwd = timed(lambda: torch.autograd.grad(o, (q, k, v), g, retain_graph=True), reps)
        # bf16 inputs (bench_cuda's bf16_*): PyTorch's own bf16 kernels where it has them (FlashAttention-2)
        qb, kb, vb = (x.detach().bfloat16().requires_grad_() for x in (q, k, v))
        kkb, vvb = (kb.repeat_interleave(rep, 1), vb.repeat_interleave(rep, 1)) if rep > 1 else (kb, vb)
        fwd_b = timed(lambda: sdpa(qb, kkb.detach(), vvb.detach()), reps)
        ob = sdpa(qb, kkb, vvb)
        bwd_b = timed(lambda: torch.autograd.grad(ob, (qb, kb, vb), g.bfloat16(), retain_graph=True), reps)
        print(json.dumps({"bench": "attention", "B": Ba, "H": H, "Hkv": Hkv, "T": Ta, "d": d, "dv": dv, "torch_fwd_ms": fwd,
                          "torch_bwd_ms": bwd, "torch_bf16_fwd_ms": fwd_b, "torch_bf16_bwd_ms": bwd_b}), flush=True)
    # elementwise add and a device copy (bench_cuda's "add"), as bandwidth
    if a.only == "attention":
        return
    for n in ([] if a.only == "gpt" else [1000] if a.smoke else [1 << 20, 1 << 26]):
        x, y = torch.randn(n, device=dev), torch.randn(n, device=dev)
        add = timed(lambda: x + y, reps)
        dst = torch.empty_like(x)
        cp = timed(lambda: dst.copy_(x), reps)
        print(json.dumps({"bench": "add", "n": n, "torch_gbps": 12 * n / add / 1e6, "copy_gbps": 8 * n / cp / 1e6}), flush=True)
    # the embedding gradient on bench_cuda's ids: index_add_ (atomics) and embedding backward (sorted)
    if a.only != "gpt":
        index_add_bench(dev, a.smoke, reps)
    gpt_steps(a, dev, T, B, V, d_model, n_layers, heads, precisions)


def index_add_bench(dev, smoke, reps):
    F = torch.nn.functional
    Vi, Ni, Di = (50, 300, 8) if smoke else (50304, 8 * 1024, 768)
    ids = torch.tensor([min(Vi - 1, math.floor(Vi ** math.fmod(i * 0.6180339887498949, 1.0)) - 1) for i in range(Ni)], device=dev)
    src = torch.randn(Ni, Di, device=dev)
    base = torch.zeros(Vi, Di, device=dev)
    ia = timed(lambda: base.index_add(0, ids, src), reps)
    w = torch.zeros(Vi, Di, device=dev, requires_grad=True)
    e = F.embedding(ids, w)
    eb = timed(lambda: torch.autograd.grad(e, (w,), src, retain_graph=True), reps)
    print(json.dumps({"bench": "index_add", "vocab": Vi, "n": Ni, "dim": Di, "torch_index_add_ms": ia, "torch_embedding_backward_ms": eb}),
          flush=True)


def gpt_steps(a, dev, T, B, V, d_model, n_layers, heads, precisions):
    """The GPT-2-small-shaped training step (smoke: tiny) in each precision, PyTorch eager against
    `kiln train`."""
    F = torch.nn.functional
    spec = importlib.util.spec_from_file_location("kiln_ref", REF)
    ref = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(ref)
    tmp_dir = tempfile.TemporaryDirectory(prefix="kiln-gpu-")  # removed when main returns
    tmp = tmp_dir.name
    tok = os.path.join(tmp, "tokens.safetensors")
    n_tok = max(20000, B * (T + 1) * (a.steps + 5))  # kiln_ref.py's generator is a Python loop: no more than needed
    subprocess.check_call([sys.executable, REF, "tokens", "--vocab", str(V), "--n", str(n_tok), "--out", tok])
    for att, prec in [(t, p) for t in a.attention.split(",") for p in precisions]:
        train = {"batch_size": B, "seq_len": T, "steps": a.steps, "precision": prec,
                 "optimizer": {"name": "adamw", "lr": 3e-4, "weight_decay": 0.1}}
        tpath = os.path.join(tmp, f"train_{prec}.json")
        json.dump(train, open(tpath, "w"))
        model = {"vocab_size": V, "d_model": d_model, "n_layers": n_layers, "n_heads": heads if att == "mha" else heads // 2,
                 "max_seq_len": T, "attention": att}
        mpath = os.path.join(tmp, f"{att}.json")
        json.dump(model, open(mpath, "w"))
        c = ref.resolve_model(dict(ref.MODEL_DEFAULTS, **model))
        net = ref.GPT(c).to(dev)
        opt = torch.optim.AdamW(net.parameters(), lr=3e-4, weight_decay=0.1)
        idx = torch.randint(0, V, (B, T + 1), device=dev)
        # autocast as PyTorch users write it; the CPU autocast of older torch has no f16 (smoke only)
        low = {"bf16": torch.bfloat16, "f16": torch.float16}.get(prec)
        use_ac = low is not None and (dev.type == "cuda" or low == torch.bfloat16)
        scaler = torch.cuda.amp.GradScaler() if prec == "f16" and dev.type == "cuda" else None
        losses = []

        def step():
            with torch.autocast(dev.type, dtype=low if use_ac else torch.bfloat16, enabled=use_ac):
                logits = net(idx[:, :-1])
                loss = F.cross_entropy(logits.reshape(-1, logits.size(-1)).float(), idx[:, 1:].reshape(-1))
            opt.zero_grad(set_to_none=True)
            if scaler:
                scaler.scale(loss).backward()
                scaler.step(opt)
                scaler.update()
            else:
                loss.backward()
                opt.step()
            losses.append(loss.detach())

        ms = timed(step, reps=a.steps)
        torch_losses = [float(l) for l in losses]
        del net, opt
        if dev.type == "cuda":
            torch.cuda.empty_cache()
        log = os.path.join(tmp, f"{att}_{prec}.kiln.jsonl")
        subprocess.check_call([a.kiln, "train", "--model", mpath, "--train", tpath, "--data", tok,
                               "--device", a.kiln_device, "--log", log, "--progress", "off"])
        rows = [json.loads(l) for l in open(log) if l.strip()]
        kms = statistics.median(r["ms"] for r in rows[3:])  # after warm-up
        print(json.dumps({"bench": "gpt_step", "attention": att, "precision": prec, "B": B, "T": T,
                          "torch_eager_tok_s": B * T / ms * 1e3, "kiln_tok_s": B * T / kms * 1e3, "speedup": ms / kms,
                          "torch_autocast": use_ac, "torch_loss_first_last": [torch_losses[0], torch_losses[-1]],
                          "kiln_loss_first_last": [rows[0]["loss"], rows[-1]["loss"]],
                          "kiln_loss_scale_last": rows[-1].get("loss_scale")}), flush=True)


if __name__ == "__main__":
    sys.exit(main())
