#!/usr/bin/python3
"""PyTorch reference for kiln's GPT model family (docs/specs.md, in this repository).

This file is the numerical specification: kiln's `kiln train` must reproduce what
`kiln_ref.py train` computes, step by step, from the same files.

Run it with Debian's python3 (apt-get install python3-torch python3-numpy):

  kiln_ref.py init  --model M.json --seed 0 --out init.safetensors
  kiln_ref.py train --model M.json --train T.json --data tokens.safetensors \
                    --init-from init.safetensors --save final.safetensors --log log.jsonl
  kiln_ref.py grads --model M.json --data tokens.safetensors --init-from init.safetensors \
                    --batch 2 --seq-len 16 --out grads.safetensors
  kiln_ref.py tokens --vocab 256 --n 100000 --seed 1 --out tokens.safetensors

Commands joined by a lone "+" run in order in one process (PyTorch imported once), each as it would
run alone: kiln_ref.py tokens ... + init ... + train ...

Add --dtype float64 for a high-precision reference. Each log line carries "ms", the wall time of that
step: the median over steps 3.. is the peer figure for a side-by-side speed comparison (run with
OMP_WAIT_POLICY=PASSIVE and --threads 2 on the 2-core machines: Debian's PyTorch otherwise loses ~2x to
OpenBLAS and OpenMP threads competing).
"""
import argparse
import json
import math
import struct
import sys
import time

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

# ----------------------------------------------------------------------------- safetensors
_DT = {"F64": np.float64, "F32": np.float32, "F16": np.float16, "I64": np.int64,
       "I32": np.int32, "I16": np.int16, "I8": np.int8, "U8": np.uint8, "U16": np.uint16,
       "U32": np.uint32, "U64": np.uint64, "BOOL": np.bool_}
_NAME = {np.dtype(v): k for k, v in _DT.items()}


def save_safetensors(path, tensors, metadata=None):
    """tensors: dict name -> torch.Tensor or np.ndarray. Written little-endian, sorted by name."""
    header, blobs, off = {}, [], 0
    for name in sorted(tensors):
        t = tensors[name]
        a = t.detach().cpu().contiguous().numpy() if isinstance(t, torch.Tensor) else np.ascontiguousarray(t)
        b = a.astype(a.dtype.newbyteorder("<")).tobytes()
        header[name] = {"dtype": _NAME[a.dtype], "shape": list(a.shape), "data_offsets": [off, off + len(b)]}
        blobs.append(b)
        off += len(b)
    if metadata:
        header["__metadata__"] = {k: str(v) for k, v in metadata.items()}
    h = json.dumps(header, separators=(",", ":")).encode()
    h += b" " * ((8 - len(h) % 8) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)))
        f.write(h)
        for b in blobs:
            f.write(b)


def load_safetensors(path):
    with open(path, "rb") as f:
        raw = f.read()
    (n,) = struct.unpack("<Q", raw[:8])
    header = json.loads(raw[8:8 + n])
    data = raw[8 + n:]
    out = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        a, b = info["data_offsets"]
        arr = np.frombuffer(data[a:b], dtype=np.dtype(_DT[info["dtype"]]).newbyteorder("<"))
        out[name] = torch.from_numpy(arr.reshape(info["shape"]).copy())
    return out


# ----------------------------------------------------------------------------- config
MODEL_DEFAULTS = {
    "vocab_size": 256, "d_model": 128, "n_layers": 4, "n_heads": 4, "n_kv_heads": None,
    "ffn_hidden": None, "max_seq_len": 256, "attention": "mha", "residual": "standard",
    "attnres_block_size": 4, "rope": True, "rope_theta": 10000.0, "tie_embeddings": False,
    "norm_eps": 1e-5, "diff_subln_affine": False, "attnres_key_norm_affine": True,
}
TRAIN_DEFAULTS = {
    "batch_size": 8, "seq_len": 64, "steps": 20, "grad_clip": 1.0,
    "optimizer": {"name": "adamw", "lr": 1e-3, "betas": [0.9, 0.95], "eps": 1e-8, "weight_decay": 0.1},
    "schedule": {"name": "constant"},
}


def load_config(path, defaults):
    cfg = dict(defaults)
    if path:
        with open(path) as f:
            user = json.load(f)
        unknown = set(user) - set(defaults)
        if unknown:
            sys.exit(f"unknown config keys: {sorted(unknown)}")
        cfg.update(user)
    return cfg


def resolve_model(cfg):
    c = dict(cfg)
    if c["n_kv_heads"] is None:
        c["n_kv_heads"] = c["n_heads"]
    if c["ffn_hidden"] is None:
        c["ffn_hidden"] = ((8 * c["d_model"] // 3) + 63) // 64 * 64
    return c


# ----------------------------------------------------------------------------- modules
class RMSNorm(nn.Module):
    def __init__(self, dim, eps, affine=True):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim)) if affine else None

    def forward(self, x):
        y = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)
        return y * self.weight if self.weight is not None else y


def rope(x, pos, theta):
    """Interleaved (GPT-J style) rotary embedding over the last dim: pairs (0,1), (2,3), ...
    x: [B, H, T, d]; pair i of position t is rotated by t * theta^(-2i/d)."""
    d = x.shape[-1]
    inv = theta ** (-torch.arange(0, d, 2, dtype=torch.float64, device=x.device) / d)
    ang = (pos.to(device=x.device, dtype=torch.float64)[:, None] * inv[None, :]).to(x.dtype)  # [T, d/2]
    cos, sin = ang.cos(), ang.sin()
    x0, x1 = x[..., 0::2], x[..., 1::2]
    y0 = x0 * cos - x1 * sin
    y1 = x0 * sin + x1 * cos
    return torch.stack([y0, y1], dim=-1).flatten(-2)


def causal_scores_mask(T, dtype, device=None):
    return torch.triu(torch.full((T, T), float("-inf"), dtype=dtype, device=device), diagonal=1)


class MultiHeadAttention(nn.Module):
    """n_heads query heads of width hd = d_model / n_heads; n_kv_heads key/value heads (GQA)."""

    def __init__(self, c):
        super().__init__()
        D, H, Hkv = c["d_model"], c["n_heads"], c["n_kv_heads"]
        assert D % H == 0 and H % Hkv == 0
        self.H, self.Hkv, self.hd = H, Hkv, D // H
        self.q_proj = nn.Linear(D, H * self.hd, bias=False)
        self.k_proj = nn.Linear(D, Hkv * self.hd, bias=False)
        self.v_proj = nn.Linear(D, Hkv * self.hd, bias=False)
        self.out_proj = nn.Linear(H * self.hd, D, bias=False)
        self.rope, self.theta = c["rope"], c["rope_theta"]

    def forward(self, x):
        B, T, D = x.shape
        q = self.q_proj(x).view(B, T, self.H, self.hd).transpose(1, 2)
        k = self.k_proj(x).view(B, T, self.Hkv, self.hd).transpose(1, 2)
        v = self.v_proj(x).view(B, T, self.Hkv, self.hd).transpose(1, 2)
        if self.rope:
            pos = torch.arange(T, device=x.device)
            q, k = rope(q, pos, self.theta), rope(k, pos, self.theta)
        rep = self.H // self.Hkv
        k = k.repeat_interleave(rep, dim=1)  # query head i uses kv head i // rep
        v = v.repeat_interleave(rep, dim=1)
        s = (q @ k.transpose(-1, -2)) / math.sqrt(self.hd) + causal_scores_mask(T, x.dtype, x.device)
        y = F.softmax(s, dim=-1) @ v
        return self.out_proj(y.transpose(1, 2).reshape(B, T, D))


def lambda_init_for(depth):
    return 0.8 - 0.6 * math.exp(-0.3 * depth)  # depth: 0-based layer index


class DifferentialAttention(nn.Module):
    """Differential attention (Diff Transformer V1, flash semantics for GQA).
    n_heads = h differential heads; sub-head width d = d_model / h / 2.
    Q, K: 2h (2*h_kv) sub-heads of width d, stripe layout: within head i's 2d chunk, the first d
    columns are branch 1, the next d branch 2. V: h_kv heads of width 2d."""

    def __init__(self, c, depth):
        super().__init__()
        D, h, hkv = c["d_model"], c["n_heads"], c["n_kv_heads"]
        assert D % (2 * h) == 0 and h % hkv == 0
        self.h, self.hkv, self.d = h, hkv, D // h // 2
        d = self.d
        self.q_proj = nn.Linear(D, h * 2 * d, bias=False)
        self.k_proj = nn.Linear(D, hkv * 2 * d, bias=False)
        self.v_proj = nn.Linear(D, hkv * 2 * d, bias=False)
        self.out_proj = nn.Linear(h * 2 * d, D, bias=False)
        self.lambda_init = lambda_init_for(depth)
        self.lambda_q1 = nn.Parameter(torch.zeros(d))
        self.lambda_k1 = nn.Parameter(torch.zeros(d))
        self.lambda_q2 = nn.Parameter(torch.zeros(d))
        self.lambda_k2 = nn.Parameter(torch.zeros(d))
        self.subln = RMSNorm(2 * d, c["norm_eps"], affine=c["diff_subln_affine"])
        self.rope, self.theta = c["rope"], c["rope_theta"]

    def lam(self):
        return (torch.exp(torch.dot(self.lambda_q1, self.lambda_k1))
                - torch.exp(torch.dot(self.lambda_q2, self.lambda_k2)) + self.lambda_init)

    def forward(self, x):
        B, T, D = x.shape
        h, hkv, d = self.h, self.hkv, self.d
        q = self.q_proj(x).view(B, T, h, 2, d).permute(0, 3, 2, 1, 4)    # [B, 2, h, T, d]
        k = self.k_proj(x).view(B, T, hkv, 2, d).permute(0, 3, 2, 1, 4)  # [B, 2, hkv, T, d]
        v = self.v_proj(x).view(B, T, hkv, 2 * d).transpose(1, 2)       # [B, hkv, T, 2d]
        if self.rope:
            pos = torch.arange(T, device=x.device)
            q, k = rope(q, pos, self.theta), rope(k, pos, self.theta)
        rep = h // hkv
        k = k.repeat_interleave(rep, dim=2)  # diff head i uses kv group i // rep, both branches
        v = v.repeat_interleave(rep, dim=1)
        mask = causal_scores_mask(T, x.dtype, x.device)
        a1 = F.softmax(q[:, 0] @ k[:, 0].transpose(-1, -2) / math.sqrt(d) + mask, dim=-1)
        a2 = F.softmax(q[:, 1] @ k[:, 1].transpose(-1, -2) / math.sqrt(d) + mask, dim=-1)
        o = (a1 - self.lam() * a2) @ v                                     # [B, h, T, 2d]
        o = self.subln(o) * (1.0 - self.lambda_init)
        return self.out_proj(o.transpose(1, 2).reshape(B, T, h * 2 * d))


class DifferentialAttentionV2(nn.Module):
    """Differential attention V2 (docs/specs.md section 1b; the official multihead_flashdiffv2.py).
    n_heads = h output heads of width hd = d_model / h; 2h query heads, n_kv_heads key/value heads
    (2h a multiple of them: query head i uses kv head i // (2h / n_kv_heads)). Output head j pairs
    query heads 2j and 2j+1: o_j = a_2j - sigmoid(lambda_proj(x)_j) * a_2j+1."""

    def __init__(self, c):
        super().__init__()
        D, h, hkv = c["d_model"], c["n_heads"], c["n_kv_heads"]
        assert D % h == 0 and (2 * h) % hkv == 0
        self.h, self.hkv, self.hd = h, hkv, D // h
        hd = self.hd
        self.q_proj = nn.Linear(D, 2 * h * hd, bias=False)
        self.k_proj = nn.Linear(D, hkv * hd, bias=False)
        self.v_proj = nn.Linear(D, hkv * hd, bias=False)
        self.o_proj = nn.Linear(h * hd, D, bias=False)
        self.lambda_proj = nn.Linear(D, h, bias=False)
        self.rope, self.theta = c["rope"], c["rope_theta"]

    def forward(self, x):
        B, T, D = x.shape
        h, hd = self.h, self.hd
        q = self.q_proj(x).view(B, T, 2 * h, hd).transpose(1, 2)          # [B, 2h, T, hd]
        k = self.k_proj(x).view(B, T, self.hkv, hd).transpose(1, 2)
        v = self.v_proj(x).view(B, T, self.hkv, hd).transpose(1, 2)
        if self.rope:
            pos = torch.arange(T, device=x.device)
            q, k = rope(q, pos, self.theta), rope(k, pos, self.theta)
        rep = 2 * h // self.hkv
        k = k.repeat_interleave(rep, dim=1)  # query head i uses kv head i // rep
        v = v.repeat_interleave(rep, dim=1)
        s = (q @ k.transpose(-1, -2)) / math.sqrt(hd) + causal_scores_mask(T, x.dtype, x.device)
        a = F.softmax(s, dim=-1) @ v                                        # [B, 2h, T, hd]
        lam = torch.sigmoid(self.lambda_proj(x)).transpose(1, 2).unsqueeze(-1)  # [B, h, T, 1]
        o = a[:, 0::2] - lam * a[:, 1::2]                                   # [B, h, T, hd]
        return self.o_proj(o.transpose(1, 2).reshape(B, T, h * hd))


class SwiGLU(nn.Module):
    def __init__(self, c):
        super().__init__()
        D, F_ = c["d_model"], c["ffn_hidden"]
        self.gate_proj = nn.Linear(D, F_, bias=False)
        self.up_proj = nn.Linear(D, F_, bias=False)
        self.down_proj = nn.Linear(F_, D, bias=False)

    def forward(self, x):
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class DepthAttention(nn.Module):
    """One Attention-Residuals read: h = sum_i softmax_i(w . RMSNorm(v_i)) v_i (softmax over sources,
    per token; keys normalised, values raw, no 1/sqrt(D) scale; w zero-initialised)."""

    def __init__(self, c):
        super().__init__()
        self.query = nn.Parameter(torch.zeros(c["d_model"]))
        self.key_norm = RMSNorm(c["d_model"], c["norm_eps"], affine=c["attnres_key_norm_affine"])

    def forward(self, sources):
        V = torch.stack(sources)                         # [n, B, T, D]
        logits = self.key_norm(V) @ self.query           # [n, B, T]
        alpha = F.softmax(logits, dim=0)
        return (alpha.unsqueeze(-1) * V).sum(0)


class Layer(nn.Module):
    def __init__(self, c, depth):
        super().__init__()
        self.attn_norm = RMSNorm(c["d_model"], c["norm_eps"])
        attn = {"mha": MultiHeadAttention, "diff": lambda c: DifferentialAttention(c, depth), "diff2": DifferentialAttentionV2}
        self.attn = attn[c["attention"]](c)
        self.mlp_norm = RMSNorm(c["d_model"], c["norm_eps"])
        self.mlp = SwiGLU(c)
        if c["residual"] != "standard":
            self.attn_res = DepthAttention(c)
            self.mlp_res = DepthAttention(c)

    def sublayers(self):
        return [(lambda h: self.attn(self.attn_norm(h)), getattr(self, "attn_res", None)),
                (lambda h: self.mlp(self.mlp_norm(h)), getattr(self, "mlp_res", None))]


class GPT(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.c = c
        assert c["attention"] in ("mha", "diff", "diff2") and c["residual"] in ("standard", "attnres_full", "attnres_block")
        self.tok_emb = nn.Embedding(c["vocab_size"], c["d_model"])
        self.layers = nn.ModuleList([Layer(c, i) for i in range(c["n_layers"])])
        if c["residual"] != "standard":
            self.final_res = DepthAttention(c)
        self.norm = RMSNorm(c["d_model"], c["norm_eps"])
        if not c["tie_embeddings"]:
            self.lm_head = nn.Linear(c["d_model"], c["vocab_size"], bias=False)

    def block_size(self):
        return 1 if self.c["residual"] == "attnres_full" else self.c["attnres_block_size"]

    def forward(self, idx):
        x = self.tok_emb(idx)
        if self.c["residual"] == "standard":
            for layer in self.layers:
                for f, _ in layer.sublayers():
                    x = x + f(x)
        else:
            S = self.block_size()
            blocks, partial, j = [x], None, 0          # b_0 = embedding, never summed into a block
            for layer in self.layers:
                for f, res in layer.sublayers():
                    if j > 0 and j % S == 0:
                        blocks.append(partial)
                        partial = None
                    h = res(blocks + ([partial] if partial is not None else []))
                    out = f(h)
                    partial = out if partial is None else partial + out
                    j += 1
            x = self.final_res(blocks + [partial])
        x = self.norm(x)
        w = self.tok_emb.weight if self.c["tie_embeddings"] else self.lm_head.weight
        return x @ w.t()


def init_params(model, seed):
    """Matrices and embeddings ~ N(0, 0.02); norm weights 1; lambda vectors ~ N(0, 0.1);
    AttnRes queries 0. Drawn with torch's generator in named_parameters() order."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("query"):
                p.zero_()
            elif ".lambda_" in name:
                p.copy_(torch.randn(p.shape, generator=g, dtype=torch.float64) * 0.1)
            elif p.dim() >= 2:
                p.copy_(torch.randn(p.shape, generator=g, dtype=torch.float64) * 0.02)
            else:
                p.fill_(1.0)


# ----------------------------------------------------------------------------- training
def batch(tokens, step, B, T):
    N = tokens.numel()
    if N <= T:
        sys.exit(f"token file has {N} tokens; need more than seq_len={T}")
    rows = []
    for r in range(B):
        start = ((step * B + r) * T) % (N - T)
        rows.append(tokens[start:start + T + 1])
    w = torch.stack(rows).long()
    return w[:, :-1], w[:, 1:]


def lr_at(step, t):
    lr, sch = t["optimizer"]["lr"], t["schedule"]
    if sch["name"] == "constant":
        return lr
    warm, steps = sch.get("warmup_steps", 0), t["steps"]
    if step < warm:
        return lr * (step + 1) / warm
    lo = lr * sch.get("min_lr_ratio", 0.1)
    p = (step - warm) / max(1, steps - warm)
    if sch["name"] == "cosine":
        return lo + 0.5 * (lr - lo) * (1 + math.cos(math.pi * p))
    if sch["name"] == "linear":
        return lr + (lo - lr) * p
    sys.exit(f"unknown schedule {sch['name']}")


def make_optimizer(model, t):
    o = t["optimizer"]
    decay = [p for p in model.parameters() if p.dim() >= 2]
    rest = [p for p in model.parameters() if p.dim() < 2]
    groups = [{"params": decay, "weight_decay": o.get("weight_decay", 0.0)},
              {"params": rest, "weight_decay": 0.0}]
    if o["name"] == "adamw":
        return torch.optim.AdamW(groups, lr=o["lr"], betas=tuple(o.get("betas", (0.9, 0.999))),
                                 eps=o.get("eps", 1e-8))
    if o["name"] == "sgd":
        return torch.optim.SGD(groups, lr=o["lr"], momentum=o.get("momentum", 0.0),
                               nesterov=o.get("nesterov", False))
    sys.exit(f"unknown optimizer {o['name']}")


def build(args, dtype):
    c = resolve_model(load_config(args.model, MODEL_DEFAULTS))
    model = GPT(c).to(dtype)
    if getattr(args, "init_from", None):
        sd = load_safetensors(args.init_from)
        own = dict(model.named_parameters())
        missing, extra = set(own) - set(sd), set(sd) - set(own)
        if missing or extra:
            sys.exit(f"weights do not match the model: missing {sorted(missing)}, unexpected {sorted(extra)}")
        with torch.no_grad():
            for n, p in own.items():
                if tuple(sd[n].shape) != tuple(p.shape):
                    sys.exit(f"{n}: shape {list(sd[n].shape)} != {list(p.shape)}")
                p.copy_(sd[n].to(dtype))
    else:
        init_params(model, getattr(args, "seed", 0))
    return c, model


def cmd_init(args):
    _, model = build(args, torch.float32)
    save_safetensors(args.out, {n: p for n, p in model.named_parameters()})


def cmd_tokens(args):
    g = torch.Generator().manual_seed(args.seed)
    # A learnable stream: mostly t+1 = (5t+3) mod V, sometimes a random token.
    n, V = args.n, args.vocab
    noise = torch.randint(0, V, (n,), generator=g)
    keep = torch.rand(n, generator=g) < 0.75
    out = torch.empty(n, dtype=torch.int64)
    out[0] = 0
    for i in range(1, n):
        out[i] = (5 * out[i - 1] + 3) % V if keep[i] else noise[i]
    save_safetensors(args.out, {"tokens": out.to(torch.int32)})


def cmd_grads(args):
    dtype = getattr(torch, args.dtype)
    _, model = build(args, dtype)
    tokens = load_safetensors(args.data)["tokens"]
    x, y = batch(tokens, 0, args.batch, args.seq_len)
    logits = model(x)
    loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), y.reshape(-1))
    loss.backward()
    out = {"loss": loss.detach().reshape(1), "logits": logits.detach()}
    out.update({"grad." + n: p.grad for n, p in model.named_parameters()})
    save_safetensors(args.out, out)
    print(json.dumps({"loss": loss.item()}))


def cmd_train(args):
    dtype = getattr(torch, args.dtype)
    torch.set_num_threads(args.threads)
    _, model = build(args, dtype)
    t = load_config(args.train, TRAIN_DEFAULTS)
    tokens = load_safetensors(args.data)["tokens"]
    opt = make_optimizer(model, t)
    B, T = t["batch_size"], t["seq_len"]
    log = open(args.log, "w") if args.log else None
    for step in range(t["steps"]):
        t0 = time.perf_counter()
        lr = lr_at(step, t)
        for g_ in opt.param_groups:
            g_["lr"] = lr
        x, y = batch(tokens, step, B, T)
        opt.zero_grad(set_to_none=True)
        logits = model(x)
        loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), y.reshape(-1))
        loss.backward()
        clip = t.get("grad_clip", 0.0) or 0.0
        norm = torch.sqrt(sum((p.grad.double() ** 2).sum() for p in model.parameters() if p.grad is not None)).item()
        if clip > 0:
            torch.nn.utils.clip_grad_norm_(model.parameters(), clip)
        opt.step()
        loss_value = loss.item()
        ms = 1e3 * (time.perf_counter() - t0)
        rec = {"step": step, "loss": loss_value, "lr": lr, "grad_norm": norm, "ms": ms}
        if log:
            log.write(json.dumps(rec) + "\n")
    if log:
        log.close()
    if args.save:
        save_safetensors(args.save, {n: p for n, p in model.named_parameters()})


def main():
    ap = argparse.ArgumentParser(description="kiln PyTorch reference")
    sub = ap.add_subparsers(dest="cmd", required=True)
    p = sub.add_parser("init"); p.add_argument("--model"); p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", required=True); p.set_defaults(fn=cmd_init)
    p = sub.add_parser("tokens"); p.add_argument("--vocab", type=int, default=256)
    p.add_argument("--n", type=int, default=100000); p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", required=True); p.set_defaults(fn=cmd_tokens)
    for name, fn in (("train", cmd_train), ("grads", cmd_grads)):
        p = sub.add_parser(name); p.add_argument("--model"); p.add_argument("--data", required=True)
        p.add_argument("--init-from"); p.add_argument("--seed", type=int, default=0)
        p.add_argument("--dtype", default="float32", choices=["float32", "float64"]); p.set_defaults(fn=fn)
        if name == "train":
            p.add_argument("--train"); p.add_argument("--save"); p.add_argument("--log")
            p.add_argument("--threads", type=int, default=2)
        else:
            p.add_argument("--batch", type=int, default=2); p.add_argument("--seq-len", type=int, default=16)
            p.add_argument("--out", required=True)
    argv, cmds = sys.argv[1:], [[]]
    for a in argv:
        if a == "+":
            cmds.append([])
        else:
            cmds[-1].append(a)
    for c in cmds:
        args = ap.parse_args(c)
        args.fn(args)


if __name__ == "__main__":
    main()
