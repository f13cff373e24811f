#!/usr/bin/env python3
"""Writes PyTorch 1.13 parity cases for kiln's LSTM, GRU, LSTMCell and GRUCell (nn/rnn.hpp), float64.

    /usr/bin/python3 tests/nn/make_rnn_cases.py tests/nn/fixtures/rnn_torch.json

The committed fixture is this script's output (Debian's python3-torch 1.13); the test reads it,
so the default suite needs no Python. Each case: {"name", "module" ("LSTM", "GRU", "LSTMCell", "GRUCell"),
"options", "params" {name: array} (PyTorch's names, so kiln's must match one to one), "x", "h0", "c0"
(or null), "lengths" (or null: padded batch through pack_padded_sequence / pad_packed_sequence),
"g_out", "g_h", "g_c" (upstream gradients), "out", "h_n", "c_n", "grads" {name: array}, "gx", "gh0", "gc0"};
arrays as {"shape", "data"} (row-major). The loss is sum(out*g_out) + sum(h_n*g_h) + sum(c_n*g_c), so
every gradient (inputs, initial states, each parameter) is checked.
"""
import json
import sys

import torch
from torch.nn.utils.rnn import pack_padded_sequence, pad_packed_sequence

torch.manual_seed(2826)
torch.set_num_threads(1)
cases = []


def enc(t):
    if t is None:
        return None
    t = t.detach().contiguous()
    return {"shape": list(t.shape), "data": [round(v, 17) for v in t.double().flatten().tolist()]}


def rnn_case(name, kind, T, N, I, H, layers=1, bias=True, batch_first=False, bidir=False, proj=0, with_state=True,
             lengths=None, unbatched=False):
    opts = dict(input_size=I, hidden_size=H, num_layers=layers, bias=bias, batch_first=batch_first, bidirectional=bidir)
    if kind == "LSTM":
        opts["proj_size"] = proj
    m = getattr(torch.nn, kind)(**opts).double()
    D = 2 if bidir else 1
    P = proj if proj else H
    if unbatched:
        x = torch.randn(T, I, dtype=torch.float64, requires_grad=True)
        hs, cs = (layers * D, P), (layers * D, H)
    else:
        x = torch.randn(*((N, T, I) if batch_first else (T, N, I)), dtype=torch.float64, requires_grad=True)
        hs, cs = (layers * D, N, P), (layers * D, N, H)
    h0 = torch.randn(*hs, dtype=torch.float64, requires_grad=True) if with_state else None
    c0 = torch.randn(*cs, dtype=torch.float64, requires_grad=True) if with_state and kind == "LSTM" else None
    state = None
    if with_state:
        state = (h0, c0) if kind == "LSTM" else h0
    if lengths is not None:
        packed = pack_padded_sequence(x, torch.tensor(lengths), batch_first=batch_first, enforce_sorted=False)
        out, st = m(packed, state)
        out, _ = pad_packed_sequence(out, batch_first=batch_first, total_length=T)
    else:
        out, st = m(x, state)
    h_n, c_n = st if kind == "LSTM" else (st, None)
    g_out, g_h = torch.randn_like(out), torch.randn_like(h_n)
    g_c = torch.randn_like(c_n) if c_n is not None else None
    loss = (out * g_out).sum() + (h_n * g_h).sum() + ((c_n * g_c).sum() if c_n is not None else 0)
    loss.backward()
    cases.append({"name": name, "module": kind, "options": dict(opts, layers=layers), "lengths": lengths,
                  "params": {n: enc(p) for n, p in m.named_parameters()}, "x": enc(x), "h0": enc(h0), "c0": enc(c0),
                  "g_out": enc(g_out), "g_h": enc(g_h), "g_c": enc(g_c), "out": enc(out), "h_n": enc(h_n), "c_n": enc(c_n),
                  "grads": {n: enc(p.grad) for n, p in m.named_parameters()}, "gx": enc(x.grad),
                  "gh0": enc(h0.grad) if h0 is not None else None, "gc0": enc(c0.grad) if c0 is not None else None})


def cell_case(name, kind, N, I, H, bias=True, unbatched=False):
    m = getattr(torch.nn, kind)(I, H, bias=bias).double()
    shape = (I,) if unbatched else (N, I)
    hshape = (H,) if unbatched else (N, H)
    x = torch.randn(*shape, dtype=torch.float64, requires_grad=True)
    h0 = torch.randn(*hshape, dtype=torch.float64, requires_grad=True)
    c0 = torch.randn(*hshape, dtype=torch.float64, requires_grad=True) if kind == "LSTMCell" else None
    if kind == "LSTMCell":
        h, c = m(x, (h0, c0))
    else:
        h, c = m(x, h0), None
    g_h = torch.randn_like(h)
    g_c = torch.randn_like(c) if c is not None else None
    ((h * g_h).sum() + ((c * g_c).sum() if c is not None else 0)).backward()
    cases.append({"name": name, "module": kind, "options": {"input_size": I, "hidden_size": H, "bias": bias}, "lengths": None,
                  "params": {n: enc(p) for n, p in m.named_parameters()}, "x": enc(x), "h0": enc(h0), "c0": enc(c0),
                  "g_out": None, "g_h": enc(g_h), "g_c": enc(g_c), "out": None, "h_n": enc(h), "c_n": enc(c),
                  "grads": {n: enc(p.grad) for n, p in m.named_parameters()}, "gx": enc(x.grad), "gh0": enc(h0.grad),
                  "gc0": enc(c0.grad) if c0 is not None else None})


for kind in ["LSTM", "GRU"]:
    rnn_case(f"{kind} 1 layer", kind, T=5, N=3, I=4, H=6)
    rnn_case(f"{kind} 2 layers bidirectional batch_first", kind, T=4, N=2, I=3, H=5, layers=2, batch_first=True, bidir=True)
    rnn_case(f"{kind} no bias, no initial state", kind, T=3, N=2, I=3, H=4, bias=False, with_state=False)
    rnn_case(f"{kind} unbatched 2 layers", kind, T=4, N=1, I=3, H=4, layers=2, unbatched=True)
    rnn_case(f"{kind} padded lengths bidirectional", kind, T=5, N=3, I=3, H=4, bidir=True, lengths=[5, 2, 3])
    rnn_case(f"{kind} padded lengths 2 layers batch_first", kind, T=4, N=3, I=2, H=3, layers=2, batch_first=True,
             lengths=[1, 4, 3])
rnn_case("LSTM proj_size 2 layers bidirectional", "LSTM", T=4, N=2, I=3, H=5, layers=2, bidir=True, proj=3)
for kind in ["LSTMCell", "GRUCell"]:
    cell_case(f"{kind}", kind, N=3, I=4, H=5)
    cell_case(f"{kind} unbatched no bias", kind, N=1, I=3, H=4, bias=False, unbatched=True)

with open(sys.argv[1], "w") as f:
    json.dump({"torch": torch.__version__, "cases": cases}, f, separators=(",", ":"))
