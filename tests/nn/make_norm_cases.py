#!/usr/bin/env python3
"""Writes PyTorch parity cases for kiln's batch and group normalisation as JSON (float64).

    /usr/bin/python3 tests/nn/make_norm_cases.py OUT.json

Each case: {"name", "kind", "args", "tensors": {name: array}} where an array is {"shape", "data"}
(row-major float64). Kinds:
  batch_norm  F.batch_norm(x, running_mean, running_var, weight, bias, training, momentum, eps) with the
              upstream gradient g: y, dx, dweight, dbias, and the running stats after the call
  bn_module   nn.BatchNorm{1,2}d(C, momentum, affine, track_running_stats) stepped on x0, x1, ... in
              train mode (each with upstream gradient g_i), then eval on x_eval: every step's y and
              dx, the parameter gradients accumulated over the steps, the final buffers
  group_norm  F.group_norm(x, num_groups, weight, bias, eps) with g: y, dx, dweight, dbias
Fixed seed: the file is the same on every run.
"""
import json
import sys

import torch
import torch.nn.functional as F

torch.manual_seed(4321)
torch.set_num_threads(1)
D = torch.float64
cases = []


def enc(t):
    t = t.detach().contiguous().to(D)
    return {"shape": list(t.shape), "data": t.flatten().tolist()}


def rnd(*shape, lo=-2.0, hi=2.0):
    return torch.rand(shape, dtype=D) * (hi - lo) + lo


def leaf(t):
    return t.clone().requires_grad_(True)


# ------------------------------------------------------------------------------------ F.batch_norm
BN_SHAPES = [(4, 3), (5, 2, 7), (3, 4, 5, 6), (2, 3, 1, 1), (7, 1, 3), (2, 5, 3, 4, 2)]
for shape in BN_SHAPES:
    C = shape[1]
    for training in (True, False):
        for affine in (True, False):
            for momentum in (0.1, 0.3, 1.0):
                if not training and momentum != 0.1:
                    continue
                eps = 1e-5 if momentum != 0.3 else 1e-3
                x = leaf(rnd(*shape) * 1.5 + 0.3)
                w = leaf(rnd(C, lo=0.5, hi=1.5)) if affine else None
                b = leaf(rnd(C)) if affine else None
                rm, rv = rnd(C, lo=-0.5, hi=0.5), rnd(C, lo=0.5, hi=2.0)
                t = {"x": x, "running_mean": rm.clone(), "running_var": rv.clone()}
                if affine:
                    t["weight"], t["bias"] = w, b
                y = F.batch_norm(x, rm, rv, w, b, training, momentum, eps)
                g = rnd(*shape)
                (y * g).sum().backward()
                t.update({"g": g, "y": y, "dx": x.grad, "running_mean_after": rm, "running_var_after": rv})
                if affine:
                    t.update({"dweight": w.grad, "dbias": b.grad})
                cases.append({"name": f"batch_norm {list(shape)} training={training} affine={affine} momentum={momentum}",
                              "kind": "batch_norm", "args": {"training": training, "momentum": momentum, "eps": eps},
                              "tensors": {k: enc(v) for k, v in t.items()}})

# ------------------------------------------------------------------------------------ BatchNorm modules
MODULES = [((6, 3), 0.1, True, True), ((4, 3, 5), None, True, True), ((3, 2, 4, 5), 0.1, True, True),
           ((3, 2, 4, 5), None, False, True), ((5, 4, 3), 0.25, True, False), ((2, 3, 3, 2), None, True, True)]
for shape, momentum, affine, track in MODULES:
    C = shape[1]
    m = (torch.nn.BatchNorm2d if len(shape) == 4 else torch.nn.BatchNorm1d)(
        C, momentum=momentum, affine=affine, track_running_stats=track).double()
    t = {}
    if affine:
        with torch.no_grad():
            m.weight.copy_(rnd(C, lo=0.5, hi=1.5))
            m.bias.copy_(rnd(C))
        t["weight"], t["bias"] = m.weight.clone(), m.bias.clone()
    m.train()
    steps = 3
    for i in range(steps):
        x = leaf(rnd(*shape) * (1 + i) + 0.5 * i)
        y = m(x)
        g = rnd(*shape)
        (y * g).sum().backward()
        t.update({f"x{i}": x, f"g{i}": g, f"y{i}": y, f"dx{i}": x.grad})
    if affine:
        t["dweight"], t["dbias"] = m.weight.grad, m.bias.grad
    m.eval()
    xe = rnd(*shape)
    t["x_eval"], t["y_eval"] = xe, m(xe)
    if track:
        t["running_mean"], t["running_var"] = m.running_mean, m.running_var
        t["num_batches_tracked"] = m.num_batches_tracked.to(D)
    cases.append({"name": f"BatchNorm{len(shape) - 2 if len(shape) == 4 else 1}d {list(shape)} momentum={momentum} "
                          f"affine={affine} track_running_stats={track}",
                  "kind": "bn_module",
                  "args": {"momentum": momentum, "affine": affine, "track_running_stats": track, "steps": steps},
                  "tensors": {k: enc(v) for k, v in t.items()}})

# ------------------------------------------------------------------------------------ F.group_norm
GN = [((2, 6, 5), 3), ((3, 4), 2), ((2, 6, 3, 4), 2), ((1, 8, 2, 3), 8), ((2, 5, 7), 1), ((3, 4, 2, 3, 2), 4)]
for shape, groups in GN:
    C = shape[1]
    for affine in (True, False):
        eps = 1e-5 if affine else 1e-3
        x = leaf(rnd(*shape) * 2 - 0.4)
        w = leaf(rnd(C, lo=0.5, hi=1.5)) if affine else None
        b = leaf(rnd(C)) if affine else None
        y = F.group_norm(x, groups, w, b, eps)
        g = rnd(*shape)
        (y * g).sum().backward()
        t = {"x": x, "g": g, "y": y, "dx": x.grad}
        if affine:
            t.update({"weight": w, "bias": b, "dweight": w.grad, "dbias": b.grad})
        cases.append({"name": f"group_norm {list(shape)} groups={groups} affine={affine}", "kind": "group_norm",
                      "args": {"num_groups": groups, "eps": eps}, "tensors": {k: enc(v) for k, v in t.items()}})

with open(sys.argv[1], "w") as f:
    json.dump({"torch": torch.__version__, "cases": cases}, f)
