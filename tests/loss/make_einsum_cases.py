#!/usr/bin/env python3
"""Writes PyTorch parity cases for kiln's einsum (nn/einsum.hpp) as JSON (float64).

    /usr/bin/python3 tests/loss/make_einsum_cases.py OUT.json

Each case: {"equation", "inputs": [arrays], "g", "out", "grads": [arrays]}; arrays as {"shape", "data"}
(row-major float64). g is the upstream gradient, grads the gradients of sum(out * g). Sizes are drawn
from a fixed seed.
"""
import json
import random
import sys

import torch

torch.manual_seed(2806)
random.seed(2806)
torch.set_num_threads(1)


def enc(t):
    t = t.detach().contiguous()
    return {"shape": list(t.shape), "data": t.double().flatten().tolist()}


EQUATIONS = ["ij,jk->ik", "bij,bjk->bik", "bhqd,bhkd->bhqk", "bhqk,bhkd->bhqd", "ij->ji", "ij->", "ij->j", "i,i->", "i,j->ij",
             "ij,ij->ij", "bij,jk->bik", "abc,cd,de->abe", "ij,jk", "ba,ca", "ijk->kij", "nc,c->n", "ij,kl->ijkl", "bi,bi->b",
             "ij,jk,kl->il", "xyz,zy->x"]
cases = []
for eq in EQUATIONS:
    sizes = {c: random.randint(1, 4) for c in "abcdehijklnqkxyz"}
    lhs = eq.split("->")[0]
    ins = [torch.randn([sizes[c] for c in t], dtype=torch.float64) for t in lhs.split(",")]
    leaves = [x.clone().requires_grad_(True) for x in ins]
    out = torch.einsum(eq, *leaves)
    g = torch.randn(out.shape, dtype=torch.float64)
    (out * g).sum().backward()
    cases.append({"equation": eq, "inputs": [enc(x) for x in ins], "g": enc(g), "out": enc(out), "grads": [enc(x.grad) for x in leaves]})

with open(sys.argv[1], "w") as f:
    json.dump(cases, f)
