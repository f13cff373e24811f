#!/usr/bin/env python3
"""kiln_ref.DifferentialAttentionV2 against a port of the official module, in float64.

The port follows microsoft/unilm Diff-Transformer/Diff-Transformer-V2/multihead_flashdiffv2.py
(MultiheadFlashDiffV2) step by step in its own layout, [B, T, heads, hd] as flash-attn takes it, with
the two library calls it makes spelled out in plain torch: flash_attn_func(q, k, v, causal=True)
(softmax scale 1/sqrt(hd), GQA: query head i reads kv head i // (Hq / Hkv)) and
apply_rotary_emb(x, cos, sin, interleaved=True) (pairs (0,1), (2,3), ... turned by cos/sin of
position t times theta^(-2k/hd)). Same random weights in both; outputs and the gradients of x and of
every weight must agree to 1e-12. Exit 0 on agreement, 1 otherwise.

  check_diff2_port.py   (needs PyTorch; docs/specs.md section 1b)
"""
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import kiln_ref  # noqa: E402


def rotary_interleaved(x, cos, sin):
    """x [B, T, H, hd]; cos, sin [T, hd/2]."""
    x0, x1 = x[..., 0::2], x[..., 1::2]
    c, s = cos[None, :, None, :], sin[None, :, None, :]
    return torch.stack([x0 * c - x1 * s, x0 * s + x1 * c], dim=-1).flatten(-2)


def flash_attn_causal(q, k, v):
    """q [B, T, Hq, hd], k, v [B, S, Hkv, hd] -> [B, T, Hq, hd]."""
    Hq, Hkv, hd = q.shape[2], k.shape[2], q.shape[3]
    kv_of = torch.arange(Hq) // (Hq // Hkv)
    k, v = k[:, :, kv_of], v[:, :, kv_of]
    s = torch.einsum("bthd,bshd->bhts", q, k) / hd ** 0.5
    T, S = q.shape[1], k.shape[1]
    s = s.masked_fill(torch.ones(T, S, dtype=torch.bool).triu(1), float("-inf"))
    return torch.einsum("bhts,bshd->bthd", s.softmax(-1), v)


def official_forward(m, x, theta):
    """MultiheadFlashDiffV2.forward with use_diff_v2=True, on kiln_ref's module's weights."""
    bsz, tgt_len, _ = x.shape
    h, hkv, hd = m.h, m.hkv, m.hd
    q = m.q_proj(x).view(bsz, tgt_len, 2 * h, hd)
    k = m.k_proj(x).view(bsz, tgt_len, hkv, hd)
    v = m.v_proj(x).view(bsz, tgt_len, hkv, hd)
    ang = torch.arange(tgt_len, dtype=torch.float64)[:, None] * theta ** (-torch.arange(0, hd, 2, dtype=torch.float64) / hd)
    q, k = rotary_interleaved(q, ang.cos(), ang.sin()), rotary_interleaved(k, ang.cos(), ang.sin())
    attn = flash_attn_causal(q, k, v)
    lambda_val = m.lambda_proj(x)
    attn1, attn2 = attn[:, :, 0::2], attn[:, :, 1::2]
    attn = attn1 - torch.sigmoid(lambda_val).unsqueeze(-1) * attn2
    return m.o_proj(attn.reshape(bsz, tgt_len, h * hd))


def main():
    torch.manual_seed(0)
    bad = []
    for D, h, hkv in ((16, 2, 2), (24, 3, 2), (24, 3, 1), (16, 2, 4), (32, 4, 8)):
        c = kiln_ref.resolve_model(dict(kiln_ref.MODEL_DEFAULTS, d_model=D, n_heads=h, n_kv_heads=hkv, attention="diff2"))
        m = kiln_ref.DifferentialAttentionV2(c).double()
        with torch.no_grad():
            for p in m.parameters():
                p.normal_(0, 0.5)
        x = torch.randn(2, 9, D, dtype=torch.float64, requires_grad=True)
        w = torch.randn(2, 9, D, dtype=torch.float64)
        res = []
        for f in (lambda: m(x), lambda: official_forward(m, x, c["rope_theta"])):
            m.zero_grad()
            x.grad = None
            y = f()
            (y * w).sum().backward()
            res.append([("y", y.detach())] + [("dx", x.grad.clone())] + [("d" + n, p.grad.clone()) for n, p in m.named_parameters()])
        for (name, a), (_, b) in zip(*res):
            err = (a - b).abs().max().item() / max(b.abs().max().item(), 1e-300)
            if not err < 1e-12:
                bad.append(f"D={D} h={h} hkv={hkv} {name}: relative max error {err:.3g}")
    print("\n".join(bad) if bad else "kiln_ref.DifferentialAttentionV2 = the official module's forward (port): outputs and gradients agree")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
