#!/usr/bin/env python3
"""Writes PyTorch parity cases for kiln's convolution and pooling ops as JSON (float64).

    /usr/bin/python3 tests/conv/make_cases.py OUT.json

Each case: {"name", "op", "args", "inputs": {name: array}, "outputs": {name: array}} where an array is
{"shape", "data" (row-major float64; indices as exact integers)}. Inputs: x, w, b (when used), and g,
the upstream gradient of the output; outputs: y, the gradients gx, gw, gb of sum(y * g), and the
indices of max_pool2d. Ops: F.conv1d, F.conv2d, F.conv_transpose2d, F.max_pool2d, F.avg_pool2d,
F.adaptive_avg_pool2d. Fixed seed: the file is the same on every run.
"""
import json
import sys

import torch
import torch.nn.functional as F

torch.manual_seed(1313)
torch.set_num_threads(1)
cases = []


def enc(t):
    t = t.detach().contiguous()
    return {"shape": list(t.shape), "data": t.double().flatten().tolist()}


def rnd(*shape):
    return torch.randn(shape, dtype=torch.float64)


def distinct(*shape):
    """Distinct values (no ties for max pooling): a random permutation of a spaced grid."""
    n = 1
    for s in shape:
        n *= s
    return (torch.randperm(n).double() * 0.1 - 0.05 * n).reshape(shape)


def add(name, op, fn, inputs, **args):
    leaves = {k: v.clone().requires_grad_(True) for k, v in inputs.items()}
    out = fn(**leaves)
    indices = None
    if isinstance(out, tuple):
        out, indices = out
    g = rnd(*out.shape)
    (out * g).sum().backward()
    outputs = {"y": enc(out)}
    for k, v in leaves.items():
        outputs["g" + k] = enc(v.grad)
    if indices is not None:
        outputs["indices"] = enc(indices)
    ins = {k: enc(v) for k, v in inputs.items()}
    ins["g"] = enc(g)
    cases.append({"name": name, "op": op, "args": args, "inputs": ins, "outputs": outputs})


def conv2d(name, xs, ws, bias, stride=1, padding=0, dilation=1, groups=1):
    inputs = {"x": rnd(*xs), "w": rnd(*ws)}
    if bias:
        inputs["b"] = rnd(ws[0])
    add(name, "conv2d", lambda x, w, b=None: F.conv2d(x, w, b, stride, padding, dilation, groups), inputs,
        stride=pair(stride), padding=pair(padding), dilation=pair(dilation), groups=groups)


def conv1d(name, xs, ws, bias, stride=1, padding=0, dilation=1, groups=1):
    inputs = {"x": rnd(*xs), "w": rnd(*ws)}
    if bias:
        inputs["b"] = rnd(ws[0])
    add(name, "conv1d", lambda x, w, b=None: F.conv1d(x, w, b, stride, padding, dilation, groups), inputs,
        stride=stride, padding=padding, dilation=dilation, groups=groups)


def conv_transpose2d(name, xs, ws, bias, stride=1, padding=0, output_padding=0, groups=1, dilation=1):
    inputs = {"x": rnd(*xs), "w": rnd(*ws)}
    if bias:
        inputs["b"] = rnd(ws[1] * groups)
    add(name, "conv_transpose2d",
        lambda x, w, b=None: F.conv_transpose2d(x, w, b, stride, padding, output_padding, groups, dilation), inputs,
        stride=pair(stride), padding=pair(padding), output_padding=pair(output_padding), dilation=pair(dilation),
        groups=groups)


def pair(v):
    return list(v) if isinstance(v, tuple) else [v, v]


def max_pool2d(name, xs, kernel, stride=None, padding=0, dilation=1, ceil_mode=False):
    add(name, "max_pool2d",
        lambda x: F.max_pool2d(x, kernel, stride, padding, dilation, ceil_mode, return_indices=True),
        {"x": distinct(*xs)}, kernel=pair(kernel), stride=pair(stride if stride is not None else kernel),
        padding=pair(padding), dilation=pair(dilation), ceil_mode=ceil_mode)


def avg_pool2d(name, xs, kernel, stride=None, padding=0, ceil_mode=False, count_include_pad=True):
    add(name, "avg_pool2d", lambda x: F.avg_pool2d(x, kernel, stride, padding, ceil_mode, count_include_pad),
        {"x": rnd(*xs)}, kernel=pair(kernel), stride=pair(stride if stride is not None else kernel),
        padding=pair(padding), ceil_mode=ceil_mode, count_include_pad=count_include_pad)


def adaptive(name, xs, out):
    add(name, "adaptive_avg_pool2d", lambda x: F.adaptive_avg_pool2d(x, out), {"x": rnd(*xs)}, output_size=pair(out))


conv2d("conv2d 3x3 pad 1 bias", (2, 3, 7, 6), (4, 3, 3, 3), True, 1, 1)
conv2d("conv2d groups 2 stride (2,1) pad (1,0) dil (1,2)", (2, 4, 9, 8), (6, 2, 3, 2), True, (2, 1), (1, 0), (1, 2), 2)
conv2d("conv2d depthwise stride 2 pad 1", (1, 4, 6, 6), (8, 1, 3, 3), True, 2, 1, 1, 4)
conv2d("conv2d 1x1 stride 2 no bias", (3, 2, 5, 5), (3, 2, 1, 1), False, 2)
conv2d("conv2d unbatched", (3, 6, 5), (2, 3, 2, 2), True, 1, (0, 1))
conv2d("conv2d 5x5 stride 3 dil 2 pad 2", (2, 2, 13, 11), (3, 2, 5, 5), True, 3, 2, 2)
conv1d("conv1d stride 2 pad 1 dil 2 groups 2", (2, 4, 11), (6, 2, 3), True, 2, 1, 2, 2)
conv1d("conv1d unbatched", (3, 8), (2, 3, 4), False)
conv_transpose2d("conv_transpose2d stride 2 pad 1 out_pad 1 groups 2", (2, 4, 3, 4), (4, 3, 3, 2), True, 2, 1, 1, 2)
conv_transpose2d("conv_transpose2d dil 2 out_pad 1 (< dilation)", (1, 2, 4, 3), (2, 3, 2, 3), False, 1, 0, 1, 1, 2)
conv_transpose2d("conv_transpose2d stride (2,3) pad (1,2) out_pad (0,1)", (2, 3, 5, 5), (3, 2, 4, 4), True, (2, 3), (1, 2),
                 (0, 1))
conv_transpose2d("conv_transpose2d unbatched", (2, 3, 4), (2, 2, 3, 3), True, 2)
max_pool2d("max_pool2d 3 stride 2 pad 1", (2, 3, 7, 6), 3, 2, 1)
max_pool2d("max_pool2d (2,3) stride (2,1) pad (1,0) dil 2 ceil", (2, 2, 9, 8), (2, 3), (2, 1), (1, 0), 2, True)
max_pool2d("max_pool2d 2 default stride ceil", (1, 3, 7, 7), 2, None, 0, 1, True)
max_pool2d("max_pool2d 3 stride 1 dil (1,2) pad 1", (2, 2, 6, 7), 3, 1, 1, (1, 2))
max_pool2d("max_pool2d unbatched", (3, 5, 6), 2)
avg_pool2d("avg_pool2d 3 stride 2 pad 1 include", (2, 3, 7, 6), 3, 2, 1)
avg_pool2d("avg_pool2d 3 stride 2 pad 1 exclude", (2, 3, 7, 6), 3, 2, 1, False, False)
avg_pool2d("avg_pool2d 2 stride 2 pad 1 ceil include (overhang)", (1, 2, 6, 5), 2, 2, 1, True, True)
avg_pool2d("avg_pool2d (3,2) stride 2 pad 1 ceil exclude", (2, 2, 7, 6), (3, 2), 2, 1, True, False)
avg_pool2d("avg_pool2d 2 default stride", (2, 3, 8, 6), 2)
adaptive("adaptive_avg_pool2d (3,4) of 7x6", (2, 3, 7, 6), (3, 4))
adaptive("adaptive_avg_pool2d (5,8) of 3x6", (1, 2, 3, 6), (5, 8))
adaptive("adaptive_avg_pool2d 1 of 5x7", (2, 4, 5, 7), 1)
adaptive("adaptive_avg_pool2d (2,3) of 6x6", (1, 2, 6, 6), (2, 3))
adaptive("adaptive_avg_pool2d unbatched (2,2) of 5x5", (3, 5, 5), 2)

with open(sys.argv[1], "w") as f:
    json.dump(cases, f)
