#!/usr/bin/env python3
"""Writes PyTorch parity cases for kiln's 2-D interpolate (nn/upsample.hpp) as JSON (float64).

    /usr/bin/python3 tests/loss/make_interp_cases.py OUT.json

Each case: {"name", "args": {"mode", "align_corners" (or null), "size" [h, w] or null, "scale_factor"
[h, w] or null}, "x", "g", "out", "gx"}; arrays as {"shape", "data"} (row-major float64). g is the upstream
gradient and gx the gradient of sum(out * g). Random shapes from a fixed seed, up- and downsampling,
integer and fractional scales, scale 2 (PyTorch's shift path for nearest) and 1.
"""
import json
import random
import sys

import torch
import torch.nn.functional as F

torch.manual_seed(2805)
random.seed(2805)
torch.set_num_threads(1)
cases = []


def enc(t):
    t = t.detach().contiguous()
    return {"shape": list(t.shape), "data": t.double().flatten().tolist()}


def add(name, x, mode, align_corners=None, size=None, scale_factor=None):
    xl = x.clone().requires_grad_(True)
    out = F.interpolate(xl, size=size, scale_factor=scale_factor, mode=mode, align_corners=align_corners)
    g = torch.randn(out.shape, dtype=torch.float64)
    (out * g).sum().backward()
    cases.append({"name": name, "args": {"mode": mode, "align_corners": align_corners, "size": list(size) if size else None,
                                         "scale_factor": list(scale_factor) if scale_factor else None},
                  "x": enc(x), "g": enc(g), "out": enc(out), "gx": enc(xl.grad)})


scales = [(2.0, 2.0), (1.0, 1.0), (1.5, 2.5), (0.5, 0.75), (3.0, 1.0), (0.3, 1.7)]
for mode, acs in [("nearest", [None]), ("bilinear", [False, True])]:
    for ac in acs:
        for i in range(8):
            n, c, h, w = random.randint(1, 2), random.randint(1, 3), random.randint(1, 7), random.randint(1, 7)
            x = torch.randn(n, c, h, w, dtype=torch.float64)
            if i < len(scales):
                sf = scales[i]
                if int(h * sf[0]) == 0 or int(w * sf[1]) == 0:
                    sf = (2.0, 3.0)
                add(f"{mode} ac={ac} {list(x.shape)} scale {sf}", x, mode, ac, scale_factor=sf)
            else:
                size = (random.randint(1, 11), random.randint(1, 11))
                add(f"{mode} ac={ac} {list(x.shape)} size {size}", x, mode, ac, size=size)
        # the same output size from a size and from a scale factor: different source pixels in PyTorch
        x = torch.randn(1, 2, 5, 7, dtype=torch.float64)
        add(f"{mode} ac={ac} size (8, 11)", x, mode, ac, size=(8, 11))
        add(f"{mode} ac={ac} scale (1.7, 1.7)", x, mode, ac, scale_factor=(1.7, 1.7))
        if not ac:
            assert cases[-1]["out"] != cases[-2]["out"]

with open(sys.argv[1], "w") as f:
    json.dump(cases, f)
