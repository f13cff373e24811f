#!/usr/bin/env python3
"""PyTorch 1.13 references (float64) for kiln's masked attention modules, written as JSON to argv[1].

Run at test time by tests/nn/test_transformer_torch.cpp. Each case holds the kiln parameter values by
kiln name, the inputs (kiln conventions: key padding true = a real key, bool masks true = may attend),
the output and every gradient of loss = sum(y * r) by kiln name.

  mha_*      nn.MultiheadAttention(bias=False, batch_first=True) against kiln MultiHeadAttention
             (rope = False, causal = False): in_proj_weight is split into q_proj, k_proj, v_proj.
  enc_*      nn.TransformerEncoderLayer(batch_first=True, dropout=0) with the attention biases zeroed
             (kiln's attention has none) against kiln TransformerEncoderLayer.
  dec_*      nn.TransformerDecoderLayer likewise, tgt_mask = the causal mask (+ an extra mask).

Torch 1.13 has no F.scaled_dot_product_attention; a masked reference is also computed explicitly
here (softmax(q kᵀ/√d + mask) v per head) and checked against nn.MultiheadAttention before writing.
"""
import json
import math
import sys

import torch
import torch.nn as nn

torch.manual_seed(1234)
DT = torch.float64


def arr(t):
    t = t.detach()
    if t.dtype == torch.bool:
        return {"shape": list(t.shape), "dtype": "bool", "data": [int(v) for v in t.reshape(-1).tolist()]}
    data = []
    for v in t.reshape(-1).tolist():
        data.append("-inf" if v == -math.inf else ("inf" if v == math.inf else ("nan" if v != v else v)))
    return {"shape": list(t.shape), "dtype": "f64", "data": data}


def mha_params(m, prefix, E):
    w = m.in_proj_weight
    return {prefix + "q_proj.weight": w[:E], prefix + "k_proj.weight": w[E:2 * E], prefix + "v_proj.weight": w[2 * E:],
            prefix + "out_proj.weight": m.out_proj.weight}


def mha_grads(m, prefix, E):
    g = m.in_proj_weight.grad
    return {prefix + "q_proj.weight": g[:E], prefix + "k_proj.weight": g[E:2 * E], prefix + "v_proj.weight": g[2 * E:],
            prefix + "out_proj.weight": m.out_proj.weight.grad}


def explicit_attention(x, mem, m, H, kpm, attn_mask):
    """softmax(q kᵀ/√d + mask) v by hand (torch conventions: kpm / bool attn_mask true = ignore)."""
    B, T, E = x.shape
    S = mem.shape[1]
    d = E // H
    w = m.in_proj_weight
    q = (x @ w[:E].T).view(B, T, H, d).transpose(1, 2)
    k = (mem @ w[E:2 * E].T).view(B, S, H, d).transpose(1, 2)
    v = (mem @ w[2 * E:].T).view(B, S, H, d).transpose(1, 2)
    s = q @ k.transpose(-1, -2) / math.sqrt(d)
    if attn_mask is not None:
        am = attn_mask if attn_mask.dim() == 2 else attn_mask.view(B, H, T, S)
        s = s.masked_fill(am, -math.inf) if am.dtype == torch.bool else s + am
    if kpm is not None:
        s = s.masked_fill(kpm.view(B, 1, 1, S), -math.inf)
    o = torch.softmax(s, -1) @ v
    return m.out_proj(o.transpose(1, 2).reshape(B, T, E))


cases = {}


def mha_case(name, B, T, S, E, H, cross, mask_kind):
    m = nn.MultiheadAttention(E, H, bias=False, batch_first=True).to(DT)
    x = torch.randn(B, T, E, dtype=DT, requires_grad=True)
    mem = torch.randn(B, S, E, dtype=DT, requires_grad=True) if cross else x
    kpm = torch.zeros(B, S, dtype=torch.bool)
    kpm[0, S - 2:] = True  # padding at the end of batch 0 ...
    kpm[B - 1, 1] = True   # ... and early in the last batch
    kiln_mask = None
    if mask_kind == "bool2d":  # torch bool: true = ignore; key 0 stays visible
        am = torch.rand(T, S) < 0.3
        am[:, 0] = False
        kiln_mask = ~am
    elif mask_kind == "add3d":  # additive per (batch, head): [B·H, T, S] in torch, [B, H, T, S] in kiln
        am = torch.randn(B * H, T, S, dtype=DT)
        am[:, :, 2] = -math.inf
        kiln_mask = am.view(B, H, T, S)
    else:
        am = None
    y, _ = m(x, mem, mem, key_padding_mask=kpm, attn_mask=am, need_weights=False)
    ref = explicit_attention(x, mem, m, H, kpm, am)
    assert torch.allclose(y, ref, atol=1e-12, rtol=1e-12), name
    r = torch.randn_like(y)
    (y * r).sum().backward()
    grads = mha_grads(m, "", E)
    grads["x"] = x.grad
    inputs = {"x": arr(x), "key_padding": arr(~kpm), "r": arr(r)}
    if cross:
        inputs["memory"] = arr(mem)
        grads["memory"] = mem.grad
    if kiln_mask is not None:
        inputs["mask"] = arr(kiln_mask)
    cases[name] = {"kind": "mha", "E": E, "H": H, "params": {k: arr(v) for k, v in mha_params(m, "", E).items()},
                   "inputs": inputs, "y": arr(y), "grads": {k: arr(v) for k, v in grads.items()}}


def layer_params(layer, decoder, E):
    p = mha_params(layer.self_attn, "self_attn.", E)
    if decoder:
        p.update(mha_params(layer.multihead_attn, "multihead_attn.", E))
    names = ["linear1", "linear2", "norm1", "norm2"] + (["norm3"] if decoder else [])
    for n in names:
        mod = getattr(layer, n)
        p[n + ".weight"] = mod.weight
        p[n + ".bias"] = mod.bias
    return p


def layer_grads(layer, decoder, E):
    g = mha_grads(layer.self_attn, "self_attn.", E)
    if decoder:
        g.update(mha_grads(layer.multihead_attn, "multihead_attn.", E))
    names = ["linear1", "linear2", "norm1", "norm2"] + (["norm3"] if decoder else [])
    for n in names:
        mod = getattr(layer, n)
        g[n + ".weight"] = mod.weight.grad
        g[n + ".bias"] = mod.bias.grad
    return g


def zero_attn_biases(mha):
    with torch.no_grad():
        mha.in_proj_bias.zero_()
        mha.out_proj.bias.zero_()


def layer_case(name, decoder, norm_first, activation, B=2, T=6, S=7, E=16, H=4, F=24):
    cls = nn.TransformerDecoderLayer if decoder else nn.TransformerEncoderLayer
    layer = cls(E, H, dim_feedforward=F, dropout=0.0, activation=activation, batch_first=True, norm_first=norm_first).to(DT)
    zero_attn_biases(layer.self_attn)
    if decoder:
        zero_attn_biases(layer.multihead_attn)
    with torch.no_grad():  # non-trivial norm affine parameters
        for n in ["norm1", "norm2"] + (["norm3"] if decoder else []):
            getattr(layer, n).weight.add_(0.3 * torch.randn(E, dtype=DT))
            getattr(layer, n).bias.add_(0.3 * torch.randn(E, dtype=DT))
    x = torch.randn(B, T, E, dtype=DT, requires_grad=True)
    r = torch.randn(B, T, E, dtype=DT)
    inputs = {"x": arr(x), "r": arr(r)}
    grads = {}
    if not decoder:
        kpm = torch.zeros(B, T, dtype=torch.bool)
        kpm[1, 0] = True
        kpm[0, T - 1] = True
        am = torch.rand(T, T) < 0.25  # torch bool: true = ignore
        am[:, 1] = False
        y = layer(x, src_mask=am, src_key_padding_mask=kpm)
        inputs.update({"src_key_padding": arr(~kpm), "src_mask": arr(~am)})
    else:
        mem = torch.randn(B, S, E, dtype=DT, requires_grad=True)
        causal = torch.triu(torch.full((T, T), -math.inf, dtype=DT), 1)
        extra = 0.5 * torch.randn(T, T, dtype=DT)  # kiln's tgt_mask adds to its causal mask
        tkpm = torch.zeros(B, T, dtype=torch.bool)
        tkpm[1, T - 1] = True
        tkpm[0, 2] = True
        mkpm = torch.zeros(B, S, dtype=torch.bool)
        mkpm[0, 0] = True
        mkpm[1, S - 3:] = True
        mm = torch.randn(T, S, dtype=DT)
        y = layer(x, mem, tgt_mask=causal + extra, memory_mask=mm, tgt_key_padding_mask=tkpm, memory_key_padding_mask=mkpm)
        inputs.update({"memory": arr(mem), "tgt_key_padding": arr(~tkpm), "tgt_mask": arr(extra), "memory_key_padding": arr(~mkpm),
                       "memory_mask": arr(mm)})
    (y * r).sum().backward()
    grads = layer_grads(layer, decoder, E)
    grads["x"] = x.grad
    if decoder:
        grads["memory"] = mem.grad
    cases[name] = {"kind": "dec" if decoder else "enc", "E": E, "H": H, "F": F, "norm_first": norm_first, "activation": activation,
                   "params": {k: arr(v) for k, v in layer_params(layer, decoder, E).items()}, "inputs": inputs, "y": arr(y),
                   "grads": {k: arr(v) for k, v in grads.items()}}


mha_case("mha_self_bool_mask", 2, 5, 5, 16, 4, False, "bool2d")
mha_case("mha_self_additive_head_mask", 2, 5, 5, 16, 4, False, "add3d")
mha_case("mha_cross_padding_only", 2, 5, 7, 16, 4, True, None)
mha_case("mha_cross_additive_head_mask", 2, 5, 7, 16, 2, True, "add3d")
mha_case("mha_cross_bool_mask", 3, 4, 9, 12, 3, True, "bool2d")
layer_case("enc_post_norm_relu", False, False, "relu")
layer_case("enc_pre_norm_gelu", False, True, "gelu")
layer_case("dec_post_norm_relu", True, False, "relu")
layer_case("dec_pre_norm_gelu", True, True, "gelu")

with open(sys.argv[1], "w") as f:
    json.dump(cases, f)
