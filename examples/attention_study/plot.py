#!/usr/bin/env python3
"""Plots the attention study's curves: held-out loss (lm) and retrieval accuracy (recall, mean over seeds
with the min..max band).  usage: plot.py RESULTS_DIR OUT.png"""
import csv
import sys
from collections import defaultdict

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

results, out = sys.argv[1], sys.argv[2]
curves = defaultdict(lambda: defaultdict(dict))  # (task, metric) -> variant -> seed -> {step: value}
order = []
with open(f"{results}/curves.csv") as f:
    for r in csv.DictReader(f):
        key = (r["task"], r["metric"])
        curves[key][r["variant"]].setdefault(int(r["seed"]), {})[int(r["step"])] = float(r["value"])
        if r["variant"] not in order:
            order.append(r["variant"])

style = {"mha": ("tab:blue", "-"), "diff": ("tab:red", "-"),
         "mha+attnres_block": ("tab:blue", "--"), "diff+attnres_block": ("tab:red", "--"),
         "mha+attnres_full": ("tab:blue", ":"), "diff+attnres_full": ("tab:red", ":")}

panels = [(k, t) for k, t in [(("lm", "val_loss"), "(a) char LM (fortunes): held-out loss, nats/char"),
                              (("recall", "accuracy"), "(b) associative recall: held-out accuracy")] if k in curves]
fig, axes = plt.subplots(1, len(panels), figsize=(6.5 * len(panels), 4.5), squeeze=False)
for ax, (key, title) in zip(axes[0], panels):
    for v in order:
        if v not in curves[key]:
            continue
        seeds = curves[key][v]
        steps = sorted(set.intersection(*[set(s) for s in seeds.values()]))
        vals = [[seeds[s][st] for s in seeds] for st in steps]
        mean = [sum(x) / len(x) for x in vals]
        color, ls = style.get(v, (None, "-"))
        label = v + (f" (mean of {len(seeds)} seeds)" if len(seeds) > 1 else "")
        ax.plot(steps, mean, ls, color=color, label=label, marker="o", markersize=3)
        if len(seeds) > 1:
            ax.fill_between(steps, [min(x) for x in vals], [max(x) for x in vals], color=color, alpha=0.12)
    ax.set_title(title, fontsize=10)
    ax.set_xlabel("step")
    ax.set_ylabel("loss (nats/char)" if key[1] == "val_loss" else "accuracy")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    if key[1] == "val_loss":
        lo = min(min(s.values()) for v in curves[key].values() for s in v.values())
        ax.set_ylim(lo - 0.05, lo + 1.0)
fig.tight_layout()
fig.savefig(out, dpi=110)
print(f"wrote {out}")
