#!/usr/bin/env python3
"""Figures of the attention study from its results folder (curves.csv, aggregate.csv), mean ± std over seeds.
usage: plot.py RESULTS_DIR OUT_PREFIX   writes OUT_PREFIX_lm.png, OUT_PREFIX_retrieval.png, OUT_PREFIX_outliers.png,
and with the bpe and budgets tasks OUT_PREFIX_bpe.png and OUT_PREFIX_budgets.png (each only if its task ran)"""
import csv
import math
import sys
from collections import defaultdict

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

results, prefix = sys.argv[1], sys.argv[2]
curves = defaultdict(lambda: defaultdict(dict))  # (task, metric) -> variant -> seed -> {flops: value}
order = []
with open(f"{results}/curves.csv") as f:
    for r in csv.DictReader(f):
        curves[(r["task"], r["metric"])][r["variant"]].setdefault(int(r["seed"]), {})[float(r["flops"])] = float(r["value"])
        if r["variant"] not in order and r["task"] in ("lm", "bpe", "recall", "needle"):
            order.append(r["variant"])
agg = {}  # (task, variant, metric) -> (n, mean, std)
with open(f"{results}/aggregate.csv") as f:
    for r in csv.DictReader(f):
        agg[(r["task"], r["variant"], r["metric"])] = (int(r["n"]), float(r["mean"]), float(r["std"]))

color = {"mha": "tab:blue", "diff": "tab:red", "diff2": "tab:green"}
dash = {"standard": "-", "attnres_block": "--", "attnres_full": ":"}


def style(v):
    a, _, res = v.partition("+")
    return color.get(a, "black"), dash.get(res or "standard", "-")


def mean_std(xs):
    m = sum(xs) / len(xs)
    s = math.sqrt(sum((x - m) ** 2 for x in xs) / (len(xs) - 1)) if len(xs) > 1 else 0.0
    return m, s


def band(ax, key, v, label):
    seeds = curves[key][v]
    xs = sorted(set.intersection(*[set(s) for s in seeds.values()]))
    ms = [mean_std([seeds[s][x] for s in seeds]) for x in xs]
    c, ls = style(v)
    ax.plot(xs, [m for m, _ in ms], ls, color=c, label=label, marker="o", markersize=2)
    ax.fill_between(xs, [m - s for m, s in ms], [m + s for m, s in ms], color=c, alpha=0.15)


def bars(ax, task, metric, title, ylabel, log=False):
    vs = [v for v in order if (task, v, metric) in agg]
    ms = [agg[(task, v, metric)] for v in vs]
    cols = [style(v)[0] for v in vs]
    hatch = ["//" if "+" in v else "" for v in vs]
    b = ax.bar(range(len(vs)), [m for _, m, _ in ms], yerr=[s for _, _, s in ms], color=cols, alpha=0.7, capsize=3)
    for p, h in zip(b, hatch):
        p.set_hatch(h)
    ax.set_xticks(range(len(vs)))
    ax.set_xticklabels([v.replace("+attnres_block", "\n+AttnRes") for v in vs], fontsize=7)
    ax.set_title(title, fontsize=9)
    ax.set_ylabel(ylabel, fontsize=8)
    if log:
        ax.set_yscale("log")
    ax.grid(alpha=0.3, axis="y")


n_seeds = max((n for (t, _, m), (n, _, _) in agg.items() if m == "params"), default=0)


def curve_panel(ax, key, ylabel, title):
    """Held-out curves of every variant against training FLOPs, mean ± std over seeds."""
    for v in order:
        if v in curves[key]:
            band(ax, key, v, v)
    lo = min(min(s.values()) for v in curves[key].values() for s in v.values())
    ax.set_ylim(lo - 0.05, lo + 0.8)
    ax.set_xlabel("training FLOPs (nn::gpt_flops)")
    ax.set_ylabel(ylabel)
    ax.set_title(f"{title}, mean ± std of {n_seeds} seeds", fontsize=9)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)


written = []
if ("lm", "val_loss") in curves:
    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    curve_panel(axes[0], ("lm", "val_loss"), "held-out loss (nats/char)", "char LM: held-out loss vs compute")
    bars(axes[1], "lm", "val_loss", "final held-out loss (equal FLOPs)", "nats/char")
    vals = [agg[("lm", v, "val_loss")][1] for v in order if ("lm", v, "val_loss") in agg]
    axes[1].set_ylim(min(vals) - 0.1, max(vals) + 0.1)
    fig.tight_layout()
    fig.savefig(f"{prefix}_lm.png", dpi=80)
    written.append(f"{prefix}_lm.png")

if ("bpe", "val_loss_per_byte") in curves:
    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    curve_panel(axes[0], ("bpe", "val_loss_per_byte"), "held-out loss (nats/byte)", "BPE LM: held-out loss per byte vs compute")
    vs = [v for v in order if ("bpe", v, "val_loss_per_byte") in agg]
    x = range(len(vs))
    for off, (task, metric, label, hatch) in enumerate([("lm", "val_loss", "char LM", ""), ("bpe", "val_loss_per_byte", "BPE LM", "..")]):
        ms = [agg.get((task, v, metric), (0, float("nan"), 0)) for v in vs]
        axes[1].bar([i + 0.4 * off - 0.2 for i in x], [m for _, m, _ in ms], width=0.4, yerr=[sd for _, _, sd in ms],
                    color=[style(v)[0] for v in vs], alpha=0.7, capsize=3, hatch=hatch, label=label)
    axes[1].set_xticks(list(x))
    axes[1].set_xticklabels([v.replace("+attnres_block", "\n+AttnRes") for v in vs], fontsize=7)
    vals = [agg[(t, v, m)][1] for v in vs for t, m in (("lm", "val_loss"), ("bpe", "val_loss_per_byte")) if (t, v, m) in agg]
    axes[1].set_ylim(min(vals) - 0.1, max(vals) + 0.1)
    axes[1].set_ylabel("nats/byte", fontsize=8)
    axes[1].set_title("final held-out loss per byte: char (plain) vs BPE (dotted), each at its task's budget", fontsize=9)
    axes[1].legend(fontsize=7)
    axes[1].grid(alpha=0.3, axis="y")
    fig.tight_layout()
    fig.savefig(f"{prefix}_bpe.png", dpi=80)
    written.append(f"{prefix}_bpe.png")

budgets = [(v.split("@")[0], float(v.split("@")[1][:-1])) for (t, v, m) in agg if t == "lm_budgets" and m == "val_loss"]
if budgets:
    bases = list(dict.fromkeys(b for b, _ in budgets))
    fig, axes = plt.subplots(1, len(bases), figsize=(5.5 * len(bases), 4), squeeze=False)
    for ax, b in zip(axes[0], bases):
        ks = sorted(k for bb, k in budgets if bb == b)
        fl = [agg[("lm_budgets", f"{b}@{k:g}x", "train_flops")][1] for k in ks]
        ls = [agg[("lm_budgets", f"{b}@{k:g}x", "val_loss")] for k in ks]
        c, _ = style(b)
        ax.errorbar(fl, [m for _, m, _ in ls], yerr=[sd for _, _, sd in ls], fmt="-o", color=c, capsize=3, label=f"{b} at {ks} × budget")
        for v in order:  # the models this base is compared with: their final loss at 1× budget
            if v != b and (v.startswith(b + "+") or (b == "mha" and "+" not in v)) and ("lm", v, "val_loss") in agg:
                n, m, sd = agg[("lm", v, "val_loss")]
                cc, dd = style(v)
                ax.axhline(m, color=cc, ls=dd if dd != "-" else "-.", lw=1, label=f"{v} (1×): {m:.3f}")
        ax.set_xscale("log")
        ax.set_xlabel("training FLOPs (log)")
        ax.set_ylabel("final held-out loss (nats/char)")
        ax.set_title(f"{b} trained to several budgets, mean ± std of {n_seeds} seeds", fontsize=9)
        ax.grid(alpha=0.3, which="both")
        ax.legend(fontsize=6)
    fig.tight_layout()
    fig.savefig(f"{prefix}_budgets.png", dpi=80)
    written.append(f"{prefix}_budgets.png")

if any(t in ("recall", "needle") for (t, _, _) in agg):
    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    bars(axes[0], "recall", "accuracy", "multi-query associative recall: held-out accuracy", "accuracy")
    lengths = sorted({int(m[5:]) for (t, _, m) in agg if t == "needle" and m.startswith("acc_L")})
    for v in order:
        pts = [agg.get(("needle", v, f"acc_L{L}")) for L in lengths]
        if all(pts) and pts:
            c, ls = style(v)
            axes[1].errorbar(lengths, [p[1] for p in pts], yerr=[p[2] for p in pts], fmt=ls, color=c, label=v, marker="o",
                             markersize=3, capsize=3)
    axes[1].set_xlabel("context length")
    axes[1].set_ylabel("accuracy")
    axes[1].set_title("needle in context: accuracy by context length", fontsize=9)
    axes[1].set_xticks(lengths)
    axes[1].grid(alpha=0.3)
    axes[1].legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(f"{prefix}_retrieval.png", dpi=80)
    written.append(f"{prefix}_retrieval.png")

if order and ("lm", order[0], "hidden_top1") in agg:
    fig, axes = plt.subplots(1, 5, figsize=(18, 3.6))
    bars(axes[0], "lm", "hidden_top1", "hidden states: largest |x|", "|x|")
    bars(axes[1], "lm", "hidden_kurtosis", "hidden states: kurtosis", "kurtosis (Gaussian 3)", log=True)
    bars(axes[2], "lm", "logit_top1", "attention logits: largest |q·k/√d|", "|logit|")
    bars(axes[3], "lm", "logit_kurtosis", "attention logits: kurtosis", "kurtosis (Gaussian 3)")
    bars(axes[4], "lm", "gen_ms_per_token", "generation with KV cache", "ms per token")
    fig.tight_layout()
    fig.savefig(f"{prefix}_outliers.png", dpi=80)
    written.append(f"{prefix}_outliers.png")
print("wrote " + ", ".join(written))
