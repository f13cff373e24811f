#!/usr/bin/env python3
"""The PyTorch side of the GPU benchmarks, and kiln train --device cuda against PyTorch eager.

  bench/cuda/gpu_vs_torch.py [--kiln build/kiln] [--steps 20]

Prints JSON lines: torch.matmul GEMMs (same shapes as bench_cuda), scaled_dot_product_attention
forward+backward (same shapes), and a GPT-2-small-sized training step (d_model 768, 12 layers,
T 1024, AdamW) for attention mha and diff, as tokens/s of kiln_ref.py's model in eager mode on the GPU
and of `kiln train --device cuda` on the same model config.
"""
import argparse, importlib.util, json, os, statistics, subprocess, sys, tempfile, time

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
REF = os.path.join(HERE, "..", "..", "..", "shared", "reference", "kiln_ref.py")


def timed(f, reps=20):
    for _ in range(3):
        f()
    torch.cuda.synchronize()
    t = []
    for _ in range(reps):
        a = time.perf_counter()
        f()
        torch.cuda.synchronize()
        t.append((time.perf_counter() - a) * 1e3)
    return statistics.median(t)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--kiln", default=os.path.join(HERE, "..", "..", "build", "kiln"))
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--batch", type=int, default=4)
    a = ap.parse_args()
    dev = torch.device("cuda")
    print(json.dumps({"device": torch.cuda.get_device_name(), "torch": torch.__version__}))
    for M, N, K in [(1024, 1024, 1024), (4096, 4096, 4096), (8192, 768, 768), (8192, 3072, 768), (8192, 768, 3072), (8192, 50304, 768)]:
        for dt, tf32 in [(torch.float32, False), (torch.float32, True), (torch.bfloat16, False)]:
            torch.backends.cuda.matmul.allow_tf32 = tf32
            x, y = torch.randn(M, K, device=dev, dtype=dt), torch.randn(K, N, device=dev, dtype=dt)
            ms = timed(lambda: x @ y)
            print(json.dumps({"bench": "gemm", "M": M, "N": N, "K": K, "dtype": str(dt), "tf32": tf32, "torch_tflops": 2 * M * N * K / ms / 1e9}))
    torch.backends.cuda.matmul.allow_tf32 = False
    F = torch.nn.functional
    for B, H, Hkv, T, d, dv in [(4, 12, 12, 1024, 64, 64), (4, 6, 6, 1024, 64, 128), (4, 12, 4, 1024, 64, 64)]:
        q = torch.randn(B, H, T, d, device=dev, requires_grad=True)
        k = torch.randn(B, Hkv, T, d, device=dev, requires_grad=True)
        v = torch.randn(B, Hkv, T, dv, device=dev, requires_grad=True)
        rep = H // Hkv
        kk, vv = (k.repeat_interleave(rep, 1), v.repeat_interleave(rep, 1)) if rep > 1 else (k, v)
        fwd = timed(lambda: F.scaled_dot_product_attention(q, kk.detach(), vv.detach(), is_causal=True))
        o = F.scaled_dot_product_attention(q, kk, vv, is_causal=True)
        g = torch.randn_like(o)
        bwd = timed(lambda: torch.autograd.grad(o, (q, k, v), g, retain_graph=True))
        print(json.dumps({"bench": "attention", "B": B, "H": H, "Hkv": Hkv, "T": T, "d": d, "dv": dv, "torch_fwd_ms": fwd, "torch_bwd_ms": bwd}))
    # training step, GPT-2 small shape
    spec = importlib.util.spec_from_file_location("kiln_ref", REF)
    ref = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(ref)
    tmp = tempfile.mkdtemp(prefix="kiln-gpu-")
    T, B = 1024, a.batch
    tok = os.path.join(tmp, "tokens.safetensors")
    subprocess.check_call([sys.executable, REF, "tokens", "--vocab", "50304", "--n", "2000000", "--out", tok])
    train = {"batch_size": B, "seq_len": T, "steps": a.steps, "optimizer": {"name": "adamw", "lr": 3e-4, "weight_decay": 0.1}}
    json.dump(train, open(os.path.join(tmp, "train.json"), "w"))
    for att in ["mha", "diff"]:
        model = {"vocab_size": 50304, "d_model": 768, "n_layers": 12, "n_heads": 12 if att == "mha" else 6, "max_seq_len": T,
                 "attention": att}
        mpath = os.path.join(tmp, f"{att}.json")
        json.dump(model, open(mpath, "w"))
        c = ref.resolve_model(dict(ref.MODEL_DEFAULTS, **model))
        net = ref.GPT(c).to(dev)
        opt = torch.optim.AdamW(net.parameters(), lr=3e-4, weight_decay=0.1)
        idx = torch.randint(0, 50304, (B, T + 1), device=dev)

        def step():
            logits = net(idx[:, :-1])
            loss = F.cross_entropy(logits.reshape(-1, logits.size(-1)), idx[:, 1:].reshape(-1))
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()

        ms = timed(step, reps=a.steps)
        del net, opt
        torch.cuda.empty_cache()
        log = os.path.join(tmp, f"{att}.kiln.jsonl")
        subprocess.check_call([a.kiln, "train", "--model", mpath, "--train", os.path.join(tmp, "train.json"), "--data", tok,
                               "--device", "cuda", "--log", log, "--progress", "off"])
        rows = [json.loads(l) for l in open(log) if l.strip()]
        kms = statistics.median(r["ms"] for r in rows[3:])
        print(json.dumps({"bench": "gpt_step", "attention": att, "B": B, "T": T, "torch_eager_tok_s": B * T / ms * 1e3,
                          "kiln_tok_s": B * T / kms * 1e3, "speedup": ms / kms}))


if __name__ == "__main__":
    sys.exit(main())
