#!/usr/bin/env python3
"""Markdown tables of the attention study (mean ± std over seeds, n) from its results folder
(aggregate.csv, advantage.csv).  usage: table.py RESULTS_DIR"""
import csv
import math
import sys

d = sys.argv[1]
agg, order = {}, []
for r in csv.DictReader(open(f"{d}/aggregate.csv")):
    agg[(r["task"], r["variant"], r["metric"])] = (int(r["n"]), float(r["mean"]), float(r["std"]))
    if r["task"] != "lm_advantage" and r["variant"] not in order:
        order.append(r["variant"])


def cell(task, v, metric, digits=4, scale=1.0):
    if (task, v, metric) not in agg:
        return "–"
    n, m, s = agg[(task, v, metric)]
    if math.isnan(m):
        return "–"
    return f"{m * scale:.{digits}f} ± {s * scale:.{digits}f}"


def n_of(task, v):
    return agg.get((task, v, "params"), (0,))[0]


def table(title, task, cols):
    vs = [v for v in order if (task, v, "params") in agg]
    if not vs:
        return
    print(f"{title}\n")
    print("| variant | n | params | steps | " + " | ".join(c[0] for c in cols) + " |")
    print("|---" * (len(cols) + 4) + "|")
    for v in vs:
        steps = agg[(task, v, "steps")][1]
        print(f"| {v} | {n_of(task, v)} | {agg[(task, v, 'params')][1]:.0f} | {steps:.0f} | "
              + " | ".join(cell(task, v, *c[1:]) for c in cols) + " |")
    print()


table("char LM (fortunes), at equal parameters and equal training FLOPs", "lm",
      [("train GFLOPs", "train_flops", 1, 1e-9), ("held-out loss (nats/char)", "val_loss", 4),
       ("ms/step (shared)", "ms_per_step", 0)])

adv = [r for r in csv.DictReader(open(f"{d}/advantage.csv"))] if agg else []
if adv:
    print("compute advantage: training FLOPs at which the base reaches the model's final held-out loss, "
          "over the model's FLOPs (> 1: the model saves compute)\n")
    print("| model vs base | per seed | mean ± std (n reached) |")
    print("|---|---|---|")
    pairs = list(dict.fromkeys((r["model"], r["base"]) for r in adv))
    for m, b in pairs:
        rs = [r for r in adv if r["model"] == m and r["base"] == b]
        per = ", ".join("not reached" if math.isnan(float(r["ratio"])) else f"{float(r['ratio']):.2f}" for r in rs)
        k = (("lm_advantage", f"{m} vs {b}", "compute_ratio"))
        n, mean, std = agg.get(k, (0, float("nan"), float("nan")))
        summary = f"{mean:.2f} ± {std:.2f} (n = {n} of {len(rs)})" if n else f"base never reached it (0 of {len(rs)})"
        print(f"| {m} vs {b} | {per} | {summary} |")
    print()

table("multi-query associative recall, held-out accuracy", "recall", [("accuracy", "accuracy", 3), ("ms/step (shared)", "ms_per_step", 0)])
lengths = sorted({int(m[5:]) for (t, _, m) in agg if t == "needle" and m.startswith("acc_L")})
table("needle in context, held-out accuracy by context length", "needle",
      [(f"L = {L}", f"acc_L{L}", 3) for L in lengths] + [("mean", "accuracy", 3)])

vs = [v for v in order if ("lm", v, "hidden_top1") in agg]
if vs:
    print("activation outliers of the trained LM models (held-out sequences)\n")
    print("| variant | n | hidden top-1 | hidden top-10 | hidden median | hidden kurtosis | logit top-1 | logit top-10 | "
          "logit median | logit kurtosis |")
    print("|---" * 10 + "|")
    for v in vs:
        print(f"| {v} | {n_of('lm', v)} | " + " | ".join(
            cell("lm", v, m, dg) for m, dg in [("hidden_top1", 2), ("hidden_top10", 2), ("hidden_median", 3), ("hidden_kurtosis", 1),
                                               ("logit_top1", 2), ("logit_top10", 2), ("logit_median", 3),
                                               ("logit_kurtosis", 2)]) + " |")
    print()
    print("generation with the KV cache (greedy, nn::generate), decode time per token, interleaved rounds\n")
    print("| variant | n | ms/token |")
    print("|---|---|---|")
    for v in vs:
        print(f"| {v} | {n_of('lm', v)} | {cell('lm', v, 'gen_ms_per_token', 3)} |")
    print()
