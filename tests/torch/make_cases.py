#!/usr/bin/env python3
"""Writes PyTorch parity cases for kiln's core tensor ops as JSON.

    /usr/bin/python3 tests/torch/make_cases.py OUT.json

Each case: {"name", "op", "args", "inputs": [array...], "output": array, "rtol", "atol"} where an
array is {"shape", "dtype" (kiln name), "data" (row-major; "nan"/"inf"/"-inf" as strings)}.
Tolerances follow tests/common/kiln_test.hpp: kiln's Reference computes in float64 and rounds once,
PyTorch computes in the storage type (f32 Sleef kernels are within ~1-2 ulp), so elementwise f32
cases allow 8 ulp (~1e-6) relative; sums allow Higham's (n-1) u sum|x| absolute; matmul K u (|A||B|).
Fixed seed: the file is the same on every run.
"""
import json
import math
import sys

import numpy as np
import torch

torch.manual_seed(1234)
np.random.seed(1234)
torch.set_num_threads(1)

KILN = {torch.float32: "f32", torch.float64: "f64", torch.bfloat16: "bf16", torch.float16: "f16",
        torch.int32: "i32", torch.int64: "i64", torch.bool: "bool"}
U = {torch.float32: 2.0**-24, torch.float64: 2.0**-53, torch.bfloat16: 2.0**-9, torch.float16: 2.0**-11}
# elementwise: 8 ulp of f32 (Sleef vs correctly rounded), or 2 storage ulps for bf16/f16
EW = {torch.float32: (8 * 2.0**-23, 1e-6), torch.float64: (64 * 2.0**-52, 1e-14),
      torch.bfloat16: (2 * 2.0**-8 + 1e-6, 1e-6), torch.float16: (2 * 2.0**-11 + 1e-6, 1e-6)}
# results below the smallest normal (sigmoid(-100) in f32) have no relative precision
TINY = {torch.float32: 1.2e-38, torch.float64: 2.3e-308, torch.bfloat16: 1.2e-38, torch.float16: 6.2e-5}

cases = []


def enc(t):
    t = t.detach().contiguous()
    vals = t.double().flatten().tolist() if t.dtype != torch.bool else [1.0 if v else 0.0 for v in t.flatten().tolist()]
    data = []
    for v in vals:
        if math.isnan(v):
            data.append("nan")
        elif math.isinf(v):
            data.append("inf" if v > 0 else "-inf")
        else:
            data.append(v)
    return {"shape": list(t.shape), "dtype": KILN[t.dtype], "data": data}


def add(name, op, inputs, out, rtol, atol, **args):
    cases.append({"name": name, "op": op, "args": args, "inputs": [enc(x) for x in inputs], "output": enc(out),
                  "rtol": rtol, "atol": atol})


def rnd(*shape, dtype=torch.float32, lo=-3.0, hi=3.0):
    return (torch.rand(tuple(shape), dtype=torch.float64) * (hi - lo) + lo).to(dtype)


inf, nan = float("inf"), float("nan")
SPECIAL = [0.0, -0.0, 1e-30, -1e-30, 0.5, -0.5, 1.0, -1.0, 3.0, -3.0, 10.0, -10.0, 20.0, -20.0, 88.0, -88.0,
           89.0, -89.0, 100.0, -100.0, 1e4, -1e4, inf, -inf, nan]

# ------------------------------------------------------------------------------------------ unary
UNARY = {
    "neg": torch.neg, "abs": torch.abs, "square": torch.square, "sign": torch.sign, "exp": torch.exp,
    "log": torch.log, "log1p": torch.log1p, "expm1": torch.expm1, "sqrt": torch.sqrt, "rsqrt": torch.rsqrt,
    "reciprocal": torch.reciprocal, "sin": torch.sin, "cos": torch.cos, "tanh": torch.tanh,
    "sigmoid": torch.sigmoid, "relu": torch.relu, "silu": torch.nn.functional.silu,
    "gelu": lambda x: torch.nn.functional.gelu(x),
    "gelu_tanh": lambda x: torch.nn.functional.gelu(x, approximate="tanh"),
}
for name, f in UNARY.items():
    for dt in (torch.float32, torch.float64):
        x = rnd(3, 5, dtype=dt, lo=0.05 if name in ("log", "sqrt", "rsqrt") else -4.0, hi=4.0)
        rt, at = EW[dt]
        add(f"{name} random {KILN[dt]}", name, [x], f(x), rt, at)
        # extreme inputs: overflow, underflow, saturation, nan/inf propagation
        xs = torch.tensor(SPECIAL, dtype=dt)
        if name in ("sin", "cos"):
            xs = xs[xs.abs() <= 100]  # |x| = 1e4 and inf: argument reduction is libm territory
        want = f(xs)
        if dt == torch.float32:
            # PyTorch 2.11's f32 CPU gelu gives NaN at +inf (its f64 kernel and PyTorch 1.13 give +inf, the
            # limit): where the f32 result is NaN for a non-NaN input and the f64 one is not, want the f64 one
            w64 = f(xs.double()).float()
            want = torch.where(want.isnan() & ~xs.isnan() & ~w64.isnan(), w64, want)
        add(f"{name} specials {KILN[dt]}", name, [xs], want, rt, max(at, TINY[dt]))
    x = rnd(4, 4, dtype=torch.bfloat16, lo=0.1 if name in ("log", "sqrt", "rsqrt") else -4.0, hi=4.0)
    # kiln's contract for bf16/f16: compute in f32, round once. PyTorch 1.13's own bf16 CPU kernels
    # round intermediates (its bf16 gelu(-3.5) is -0, silu is an ulp off), so the expected value is
    # PyTorch's f32 result rounded once to bf16.
    add(f"{name} bf16", name, [x], f(x.float()).to(torch.bfloat16), *EW[torch.bfloat16])

# ------------------------------------------------------------------------------------------ binary
BINARY = {"add": torch.add, "sub": torch.sub, "mul": torch.mul, "div": torch.div, "maximum": torch.maximum,
          "minimum": torch.minimum, "pow": torch.pow, "eq": torch.eq, "ne": torch.ne, "lt": torch.lt,
          "le": torch.le, "gt": torch.gt, "ge": torch.ge, "logical_and": torch.logical_and,
          "logical_or": torch.logical_or}
SHAPES = [((2, 3, 4), (4,)), ((3, 1), (1, 5)), ((2, 1, 3), (4, 1)), ((5,), (2, 3, 5)), ((), (2, 2)), ((1, 3), ())]
for name, f in BINARY.items():
    compare = name in ("eq", "ne", "lt", "le", "gt", "ge", "logical_and", "logical_or")
    for i, (sa, sb) in enumerate(SHAPES):
        dt = torch.float32 if i % 2 == 0 else torch.float64
        a = rnd(*sa, dtype=dt, lo=0.1 if name == "pow" else -3.0)
        b = rnd(*sb, dtype=dt, lo=0.25 if name == "div" else -3.0)
        if compare:  # small integers: ties
            a, b = a.round(), b.round()
        rt, at = (0.0, 0.0) if compare else EW[dt]
        add(f"{name} {list(sa)} {list(sb)} {KILN[dt]}", name, [a, b], f(a, b), rt, at)
    # all pairs of specials: NaN propagation of maximum/minimum, comparisons with NaN, inf arithmetic
    sp = torch.tensor([0.0, -0.0, 1.0, -2.5, inf, -inf, nan], dtype=torch.float32)
    a, b = sp.reshape(-1, 1), sp.reshape(1, -1)
    rt, at = (0.0, 0.0) if compare else EW[torch.float32]
    add(f"{name} specials f32", name, [a, b], f(a, b), rt, at)
    if name in ("add", "sub", "mul", "maximum", "minimum", "eq", "lt", "ge"):
        ai, bi = torch.randint(-5, 6, (3, 4), dtype=torch.int64), torch.randint(-5, 6, (4,), dtype=torch.int64)
        add(f"{name} i64", name, [ai, bi], f(ai, bi), 0.0, 0.0)
    if name in ("add", "mul", "maximum", "div"):
        a16, b16 = rnd(4, 3, dtype=torch.bfloat16), rnd(3, dtype=torch.bfloat16, lo=0.25)
        add(f"{name} bf16", name, [a16, b16], f(a16.float(), b16.float()).to(torch.bfloat16), *EW[torch.bfloat16])
        a16, b16 = rnd(4, 3, dtype=torch.float16), rnd(3, dtype=torch.float16, lo=0.25)
        add(f"{name} f16", name, [a16, b16], f(a16.float(), b16.float()).to(torch.float16), *EW[torch.float16])

# ------------------------------------------------------------------------------------------ reductions
def red_tol(x, n, dt):
    # Higham: (n-1) u sum|x| absolute (torch sums in the storage type's accumulation, f32 for halves),
    # plus 2 storage ulps relative
    u = 2.0**-53 if dt == torch.float64 else 2.0**-24
    return 2 * U[dt], float(max(n - 1, 0) * u * x.double().abs().sum()) + 1e-300


for dt in (torch.float32, torch.float64):
    for shape, axes, keep in [((4, 5, 6), (1,), False), ((4, 5, 6), (0, 2), True), ((3, 7), (), False),
                              ((300,), (0,), False), ((2, 3, 4), (-1, 0), False), ((5, 1, 3), (1,), True)]:
        x = rnd(*shape, dtype=dt)
        dims = axes if axes else tuple(range(len(shape)))
        n = int(np.prod([shape[a] for a in dims]))
        rt, at = red_tol(x, n, dt)
        add(f"sum {list(shape)} {list(axes)} {keep} {KILN[dt]}", "sum", [x], x.sum(dim=dims, keepdim=keep), rt, at,
            axes=list(axes), keepdim=keep)
        add(f"mean {list(shape)} {list(axes)} {keep} {KILN[dt]}", "mean", [x], x.mean(dim=dims, keepdim=keep), 2 * rt,
            at / n, axes=list(axes), keepdim=keep)
        xp = rnd(*shape, dtype=dt, lo=0.5, hi=1.5)
        add(f"prod {list(shape)} {list(axes)} {KILN[dt]}", "prod", [xp],
            xp.prod(dim=dims[0], keepdim=True).prod(dim=dims[1], keepdim=True) if len(dims) == 2 else
            (xp.prod(dim=dims[0], keepdim=keep) if len(dims) == 1 else xp.prod()),
            (n + 2) * (2.0**-24 if dt == torch.float32 else 2.0**-53), 0.0,
            axes=list(axes), keepdim=keep if len(dims) < 2 else True)
        add(f"max {list(shape)} {list(axes)} {keep} {KILN[dt]}", "max", [x], torch.amax(x, dim=dims, keepdim=keep), 0.0,
            0.0, axes=list(axes), keepdim=keep)
        add(f"min {list(shape)} {list(axes)} {keep} {KILN[dt]}", "min", [x], torch.amin(x, dim=dims, keepdim=keep), 0.0,
            0.0, axes=list(axes), keepdim=keep)
# NaN and ties: max/min propagate NaN, argmax/argmin give the first NaN or the first extreme
xn = torch.tensor([[1.0, nan, 3.0, 3.0], [2.0, 2.0, -1.0, -1.0], [nan, 0.0, nan, 5.0], [-inf, inf, 0.0, inf]])
for axes, keep in [((0,), False), ((1,), True), ((), False)]:
    dims = axes if axes else (0, 1)
    add(f"max nan {list(axes)}", "max", [xn], torch.amax(xn, dim=dims, keepdim=keep), 0.0, 0.0, axes=list(axes), keepdim=keep)
    add(f"min nan {list(axes)}", "min", [xn], torch.amin(xn, dim=dims, keepdim=keep), 0.0, 0.0, axes=list(axes), keepdim=keep)
    add(f"sum nan/inf {list(axes)}", "sum", [xn], xn.sum(dim=dims, keepdim=keep), 0.0, 1e-6, axes=list(axes), keepdim=keep)
for axis in (0, 1, -1):
    for keep in (False, True):
        add(f"argmax nan axis {axis} {keep}", "argmax", [xn], torch.argmax(xn, dim=axis, keepdim=keep), 0.0, 0.0, axis=axis, keepdim=keep)
        add(f"argmin nan axis {axis} {keep}", "argmin", [xn], torch.argmin(xn, dim=axis, keepdim=keep), 0.0, 0.0, axis=axis, keepdim=keep)
xt = torch.tensor([[4.0, 1.0, 4.0, 1.0], [2.0, 2.0, 2.0, 2.0], [0.0, -3.0, 7.0, 7.0]])
for axis in (0, 1):
    add(f"argmax ties axis {axis}", "argmax", [xt], torch.argmax(xt, dim=axis), 0.0, 0.0, axis=axis, keepdim=False)
    add(f"argmin ties axis {axis}", "argmin", [xt], torch.argmin(xt, dim=axis), 0.0, 0.0, axis=axis, keepdim=False)
xi = torch.randint(-1000, 1000, (6, 7), dtype=torch.int32)
add("sum i32 -> i64", "sum", [xi], xi.sum(dim=1), 0.0, 0.0, axes=[1], keepdim=False)
add("max i32", "max", [xi], torch.amax(xi, dim=0), 0.0, 0.0, axes=[0], keepdim=False)

# ------------------------------------------------------------------------------------------ matmul
for dt in (torch.float32, torch.float64):
    for sa, sb in [((5,), (5,)), ((5,), (5, 3)), ((4, 5), (5,)), ((4, 5), (5, 3)), ((2, 4, 5), (5, 3)),
                   ((2, 1, 4, 6), (3, 6, 2)), ((7, 130), (130, 9)), ((3, 4, 5), (3, 5, 2))]:
        a, b = rnd(*sa, dtype=dt), rnd(*sb, dtype=dt)
        K = sa[-1]
        u = 2.0**-53 if dt == torch.float64 else 2.0**-24
        bound = float((a.double().abs() @ b.double().abs()).max()) * K * u
        add(f"matmul {list(sa)} @ {list(sb)} {KILN[dt]}", "matmul", [a, b], a @ b, 2 * U[dt], bound)
    # transposed operand: the JSON holds the transposed data, the test transposes it back as a view
    a, b = rnd(6, 4, dtype=dt), rnd(3, 6, dtype=dt)
    add(f"matmul transposed operands {KILN[dt]}", "matmul_tt", [a, b], a.t() @ b.t(), 2 * U[dt],
        float((a.t().double().abs() @ b.t().double().abs()).max()) * 6 * (2.0**-53 if dt == torch.float64 else 2.0**-24))

# ------------------------------------------------------------------------------------------ softmax
for dt in (torch.float32, torch.float64):
    for shape, axis, mag in [((4, 7), 1, 3.0), ((4, 7), 0, 3.0), ((3, 4, 5), -1, 1000.0), ((3, 4, 5), 1, 80.0),
                             ((2, 50), -1, 30.0), ((6,), 0, 1e4)]:
        x = rnd(*shape, dtype=dt, lo=-mag, hi=mag)
        n = shape[axis]
        u = 2.0**-53 if dt == torch.float64 else 2.0**-24
        c = (n + 8) * u
        add(f"softmax {list(shape)} axis {axis} mag {mag} {KILN[dt]}", "softmax", [x], torch.softmax(x, axis),
            c + 2 * U[dt], TINY[dt], axis=axis)
        add(f"log_softmax {list(shape)} axis {axis} mag {mag} {KILN[dt]}", "log_softmax", [x], torch.log_softmax(x, axis),
            4 * u + 2 * U[dt], c, axis=axis)
    xs = torch.tensor([[inf, 1.0, 0.0], [-inf, 1.0, 0.0], [-inf, -inf, -inf], [nan, 1.0, 2.0]], dtype=dt)
    add(f"softmax specials {KILN[dt]}", "softmax", [xs], torch.softmax(xs, 1), 1e-6, 1e-30, axis=1)
    add(f"log_softmax specials {KILN[dt]}", "log_softmax", [xs], torch.log_softmax(xs, 1), 1e-6, 1e-6, axis=1)

# ------------------------------------------------------------------------------------------ casts
vals = torch.tensor([1.0 + 2**-8, 1.0 + 3 * 2**-8, 1.0 + 2**-8 + 2**-20, 3.14159265, -65504.0, 65519.0, 65520.0,
                     2**-24, 2**-25, 3 * 2**-26, 1e-40, 0.1, -0.1, 1e30, -1e30, inf, -inf, nan], dtype=torch.float64)
for dt in (torch.bfloat16, torch.float16, torch.float32):
    add(f"cast f64 -> {KILN[dt]}", "cast", [vals], vals.to(dt), 0.0, 0.0, dtype=KILN[dt])
    add(f"cast f32 -> {KILN[dt]}", "cast", [vals.float()], vals.float().to(dt), 0.0, 0.0, dtype=KILN[dt])
fi = torch.tensor([-2.7, -1.5, -0.5, -0.0, 0.4, 0.5, 1.5, 2.5, 2.9999, -100.9, 1e9], dtype=torch.float32)
for dt in (torch.int32, torch.int64, torch.bool):
    add(f"cast f32 -> {KILN[dt]}", "cast", [fi], fi.to(dt), 0.0, 0.0, dtype=KILN[dt])
bi = torch.tensor([True, False, True])
for dt in (torch.float32, torch.bfloat16, torch.int64):
    add(f"cast bool -> {KILN[dt]}", "cast", [bi], bi.to(dt), 0.0, 0.0, dtype=KILN[dt])
ii = torch.tensor([0, 1, -1, 2**24 + 1, 300], dtype=torch.int64)
for dt in (torch.float32, torch.bfloat16, torch.float16, torch.bool, torch.int32):
    add(f"cast i64 -> {KILN[dt]}", "cast", [ii], ii.to(dt), 0.0, 0.0, dtype=KILN[dt])

with open(sys.argv[1], "w") as f:
    json.dump({"torch": torch.__version__, "cases": cases}, f)
print(f"make_cases.py: wrote {len(cases)} cases to {sys.argv[1]}")
