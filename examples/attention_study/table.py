#!/usr/bin/env python3
"""Markdown tables of the attention study (mean ± std over seeds, n) from its results folder
(aggregate.csv, advantage.csv, budget_advantage.csv).  usage: table.py RESULTS_DIR"""
import os
import csv
import math
import sys

d = sys.argv[1]
agg, order = {}, []
for r in csv.DictReader(open(f"{d}/aggregate.csv")):
    agg[(r["task"], r["variant"], r["metric"])] = (int(r["n"]), float(r["mean"]), float(r["std"]))
    if r["task"] not in ("lm_advantage", "lm_budgets", "lm_budget_advantage") and r["variant"] not in order:
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


def col(task, v, c):
    """One table cell: column c = (title, metric, digits, scale); metric "TASK/METRIC" reads another task's."""
    t, m = c[1].split("/") if "/" in c[1] else (task, c[1])
    return cell(t, v, m, *c[2:])


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
              + " | ".join(col(task, v, c) for c in cols) + " |")
    print()


table("char LM (fortunes), at equal parameters and equal training FLOPs", "lm",
      [("train GFLOPs", "train_flops", 1, 1e-9), ("held-out loss (nats/char)", "val_loss", 4),
       ("ms/step (shared)", "ms_per_step", 0)])

adv = [r for r in csv.DictReader(open(f"{d}/advantage.csv"))] if agg else []
if adv:
    print("compute advantage, single curve (the base's held-out curve under its own schedule): training FLOPs at which "
          "the base reaches the model's final held-out loss, over the model's FLOPs (> 1: the model saves compute)\n")
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

if any(t == "bpe" for (t, _, _) in agg):
    table("BPE LM (fortunes, byte-level BPE trained by kiln on the training split), at equal parameters and equal training FLOPs",
          "bpe", [("train GFLOPs", "train_flops", 1, 1e-9), ("held-out loss (nats/token)", "val_loss", 4),
                  ("held-out loss (nats/byte)", "val_loss_per_byte", 4), ("char LM (nats/char = nats/byte)", "lm/val_loss", 4),
                  ("bytes/token", "eval_bytes_per_token", 3), ("ms/step (shared)", "ms_per_step", 0)])

budget_rows = sorted({v for (t, v, m) in agg if t == "lm_budgets"}, key=lambda v: (v.split("@")[0], float(v.split("@")[1][:-1])))
if budget_rows:
    print("budgets: the base variants trained to several budgets (each its own full cosine schedule), final held-out loss\n")
    print("| base | × lm budget | steps | train GFLOPs | held-out loss (nats/char) |")
    print("|---|---|---|---|---|")
    for v in budget_rows:
        b, k = v.split("@")
        print(f"| {b} | {k[:-1]} | {agg[('lm_budgets', v, 'steps')][1]:.0f} | {agg[('lm_budgets', v, 'train_flops')][1] * 1e-9:.1f} | "
              f"{cell('lm_budgets', v, 'val_loss', 4)} |")
    print()
if os.path.exists(f"{d}/budget_advantage.csv"):
    badv = list(csv.DictReader(open(f"{d}/budget_advantage.csv")))
    print("compute advantage from several budgets: the FLOPs at which the base's final loss, interpolated linearly in "
          "log FLOPs between its budgets, reaches the model's final held-out loss, over the model's FLOPs. No extrapolation: "
          "≤ x: the base's smallest budget already beats the model (ratio at most x); ≥ x: not reached at the largest "
          "budget (at least x)\n")
    print("| model vs base | per seed | mean ± std (n interpolated) |")
    print("|---|---|---|")
    for m, b in dict.fromkeys((r["model"], r["base"]) for r in badv):
        rs = [r for r in badv if r["model"] == m and r["base"] == b]

        def one(r):
            if r["status"] == "interpolated":
                return f"{float(r['ratio']):.2f}"
            return ("≤ " if r["status"] == "below_smallest" else "≥ ") + f"{float(r['bound']):.2f}"
        n, mean, std = agg.get(("lm_budget_advantage", f"{m} vs {b}", "compute_ratio"), (0, float("nan"), float("nan")))
        summary = f"{mean:.2f} ± {std:.2f} (n = {n} of {len(rs)})" if n else f"none interpolated (0 of {len(rs)})"
        print(f"| {m} vs {b} | {', '.join(one(r) for r in rs)} | {summary} |")
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
