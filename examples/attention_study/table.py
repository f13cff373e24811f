#!/usr/bin/env python3
"""Markdown tables from the attention study's results (summary.csv, curves.csv).  usage: table.py RESULTS_DIR"""
import csv
import sys
from collections import defaultdict

d = sys.argv[1]
summary = list(csv.DictReader(open(f"{d}/summary.csv")))
curves = defaultdict(dict)  # (task, variant, seed, metric) -> {step: value}
for r in csv.DictReader(open(f"{d}/curves.csv")):
    curves[(r["task"], r["variant"], int(r["seed"]), r["metric"])][int(r["step"])] = float(r["value"])
variants = list(dict.fromkeys(r["variant"] for r in summary))


def rows(task):
    return [r for r in summary if r["task"] == task]


lm = rows("lm")
if lm:
    seeds = sorted({int(r["seed"]) for r in lm})
    steps = sorted(curves[("lm", lm[0]["variant"], seeds[0], "val_loss")])
    show = sorted({steps[max(0, round(k * len(steps) / 4) - 1)] for k in range(1, 5)})
    print("char LM, held-out loss (nats/char)\n")
    print("| variant | params | " + " | ".join(f"step {s}" for s in show) + " | ms/step |")
    print("|---" * (len(show) + 3) + "|")
    for v in variants:
        rs = [r for r in lm if r["variant"] == v]
        if not rs:
            continue
        cells = []
        for s in show:
            vals = [curves[("lm", v, sd, "val_loss")][s] for sd in seeds]
            cells.append(" / ".join(f"{x:.4f}" for x in vals))
        ms = sum(float(r["ms_per_step"]) for r in rs) / len(rs)
        print(f"| {v} | {rs[0]['params']} | " + " | ".join(cells) + f" | {ms:.0f} |")
    print()

rc = rows("recall")
if rc:
    seeds = sorted({int(r["seed"]) for r in rc})
    steps = sorted(curves[("recall", rc[0]["variant"], seeds[0], "accuracy")])
    show = sorted({steps[max(0, round(k * len(steps) / 4) - 1)] for k in range(1, 5)})
    print("associative recall, held-out accuracy (per seed " + ", ".join(map(str, seeds)) + "; mean)\n")
    print("| variant | params | " + " | ".join(f"step {s}" for s in show) + " | final mean | ms/step |")
    print("|---" * (len(show) + 4) + "|")
    for v in variants:
        rs = [r for r in rc if r["variant"] == v]
        if not rs:
            continue
        cells = []
        for s in show:
            vals = [curves[("recall", v, sd, "accuracy")][s] for sd in seeds]
            cells.append(" / ".join(f"{x:.3f}" for x in vals))
        fin = [float(r["final"]) for r in rs]
        ms = sum(float(r["ms_per_step"]) for r in rs) / len(rs)
        print(f"| {v} | {rs[0]['params']} | " + " | ".join(cells) + f" | {sum(fin) / len(fin):.3f} | {ms:.0f} |")
