#!/usr/bin/env python3
"""Prefill and decode tokens/s of `kiln generate` against transformers (eager PyTorch) on the same
random Llama, same machine, same run, interleaved; kiln's batched decode (one batch of prompts of
different lengths) against the same prompts one after the other; and kiln's peak RSS while loading.

    bench/hf/setup.sh && bench/.venv-torch2/bin/python bench/hf/bench_generate.py [--kiln build/kiln] [--threads 2]

(bench/hf/setup.sh: transformers 5 on PyTorch 2 in bench/.venv-torch2, the peer the issue names. The
script also runs under .venv-hf, transformers 4.46.3 on Debian's torch 1.13: scripts/hf_venv.sh.)

The model (random weights, nothing downloaded) is written to a temporary directory, stored in bf16;
both sides compute in f32, greedy. Order: transformers, kiln, kiln, transformers (each side's best of
its two runs is reported), then kiln's batch runs as sequential, batch, batch, sequential, and a
single prompt. The ids must agree: kiln's batch-1 ids with transformers', the batch's with the
sequential run's.
"""
import argparse
import os
import re
import subprocess
import tempfile
import time

import torch
import transformers
from transformers import LlamaConfig, LlamaForCausalLM

if torch.__version__.startswith("1."):
    import transformers.generation.utils as gu
    gu.is_fsdp_managed_module = lambda m: False  # torch 1.13's FSDP module fails to import on Python 3.11

SPEED = re.compile(r"prefill: (\d+) tokens, ([\d.]+) tokens/s; decode: (\d+) tokens, ([\d.]+) tokens/s")


def hf_run(model, prompt, new):
    """transformers: one prefill pass with the KV cache, then new-1 decode passes (greedy)."""
    with torch.no_grad():
        t0 = time.perf_counter()
        out = model(prompt, use_cache=True)
        t_prefill = time.perf_counter() - t0
        past, ids = out.past_key_values, [int(out.logits[0, -1].argmax())]
        t0 = time.perf_counter()
        for _ in range(new - 1):
            out = model(torch.tensor([[ids[-1]]]), past_key_values=past, use_cache=True)
            past = out.past_key_values
            ids.append(int(out.logits[0, -1].argmax()))
        t_decode = time.perf_counter() - t0
    return ids, prompt.shape[1] / t_prefill, (new - 1) / t_decode


def kiln_run(a, d, prompts, new, extra=(), rss=False):
    env = dict(os.environ, KILN_NUM_THREADS=str(a.threads), OMP_NUM_THREADS=str(a.threads))
    cmd = [a.kiln, "generate", d, "--max-new-tokens", str(new), "--temperature", "0", "--print-ids", *extra]
    for p in prompts:
        cmd += ["--prompt-ids", ",".join(map(str, p))]
    r = subprocess.run((["/usr/bin/time", "-v"] if rss else []) + cmd, capture_output=True, text=True, env=env)
    if r.returncode != 0:
        raise SystemExit(r.stderr)
    ids = [[int(x) for x in line.split(",")] for line in r.stdout.strip().splitlines()[-len(prompts):]]
    m = SPEED.search(r.stderr)
    out = {"ids": ids, "prefill": float(m.group(2)), "decode": float(m.group(4)), "decode_tokens": int(m.group(3))}
    if rss:
        out["rss"] = int(re.search(r"Maximum resident set size \(kbytes\): (\d+)", r.stderr).group(1)) * 1024
    return out


def runs(ks, prefill=False):
    return ", ".join((f"{k['prefill']:.0f}/" if prefill else "") + f"{k['decode']:.1f}" for k in ks)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--kiln", default="build/kiln")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--prompt", type=int, default=128)
    ap.add_argument("--new", type=int, default=64)
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    cfg = LlamaConfig(vocab_size=32000, hidden_size=512, intermediate_size=1408, num_hidden_layers=8, num_attention_heads=8,
                      num_key_value_heads=2, max_position_embeddings=1024, tie_word_embeddings=False)
    torch.manual_seed(0)
    model = LlamaForCausalLM(cfg).eval()
    with torch.no_grad():
        for p in model.parameters():
            p.normal_(0, 0.05)
            p.copy_(p.to(torch.bfloat16).float())
    model.generation_config.eos_token_id = None
    gen = torch.Generator().manual_seed(1)
    prompt = torch.randint(0, cfg.vocab_size, (1, a.prompt), generator=gen)
    # The batch: four prompts of different lengths (the first is the batch-1 prompt).
    batch = [prompt[0].tolist()] + [torch.randint(0, cfg.vocab_size, (n,), generator=gen).tolist()
                                    for n in (a.prompt * 3 // 4, a.prompt // 2, a.prompt // 4)]
    params = sum(p.numel() for p in model.parameters())
    peer = f"transformers {transformers.__version__} (torch {torch.__version__}, eager)"
    print(f"model: Llama {params / 1e6:.1f}M parameters (bf16 on disk, f32 compute), prompt {a.prompt}, {a.new} new tokens, "
          f"{a.threads} threads")
    with tempfile.TemporaryDirectory() as d:
        model.to(torch.bfloat16).save_pretrained(d)
        model.float()
        with torch.no_grad():
            model(prompt[:, :8])  # warm-up
        hf, kl = [], []
        hf.append(hf_run(model, prompt, a.new))
        kl.append(kiln_run(a, d, [prompt[0].tolist()], a.new, rss=True))
        kl.append(kiln_run(a, d, [prompt[0].tolist()], a.new))
        hf.append(hf_run(model, prompt, a.new))
        print("batch 1, best of 2 (order: transformers, kiln, kiln, transformers):")
        print(f"  {peer}: prefill {max(h[1] for h in hf):.0f} tokens/s, decode {max(h[2] for h in hf):.1f} tokens/s "
              f"(runs: {', '.join(f'{h[1]:.0f}/{h[2]:.1f}' for h in hf)})")
        print(f"  kiln: prefill {max(k['prefill'] for k in kl):.0f} tokens/s, decode {max(k['decode'] for k in kl):.1f} tokens/s "
              f"(runs: {runs(kl, True)})")
        print(f"  decode: kiln / transformers = {max(k['decode'] for k in kl) / max(h[2] for h in hf):.2f}x; "
              f"prefill: {max(k['prefill'] for k in kl) / max(h[1] for h in hf):.2f}x")
        ids = hf[0][0]
        print("  same greedy ids:", kl[0]["ids"][0] == ids, f"({sum(x == y for x, y in zip(kl[0]['ids'][0], ids))}/{len(ids)})")
        rss = kl[0]["rss"]
        base = subprocess.run(["/usr/bin/time", "-v", a.kiln, "--version"], capture_output=True, text=True).stderr
        base = int(re.search(r"Maximum resident set size \(kbytes\): (\d+)", base).group(1)) * 1024
        print(f"  kiln peak RSS {rss / 2**20:.0f} MiB; `kiln --version` alone {base / 2**20:.0f} MiB; the difference "
              f"{(rss - base) / 2**20:.0f} MiB for {params * 4 / 2**20:.0f} MiB of f32 weights ({(rss - base) / (params * 4):.2f}x)")
        # kiln's batched decode: 4 prompts (lengths 128, 96, 64, 32) as one batch vs one after the other.
        seq, bat = [], []
        seq.append(kiln_run(a, d, batch, a.new, ["--batch-size", "1"]))
        bat.append(kiln_run(a, d, batch, a.new))
        bat.append(kiln_run(a, d, batch, a.new))
        seq.append(kiln_run(a, d, batch, a.new, ["--batch-size", "1"]))
        lens = ", ".join(str(len(p)) for p in batch)
        print(f"kiln, 4 prompts ({lens} tokens), {a.new} new tokens each; decode tokens/s over all rows, best of 2 "
              f"(order: sequential, batch, batch, sequential):")
        print(f"  batch 1 (the first prompt alone): decode {max(k['decode'] for k in kl):.1f} tokens/s")
        print(f"  sequential (--batch-size 1): decode {max(k['decode'] for k in seq):.1f} tokens/s "
              f"(runs: {runs(seq)})")
        print(f"  one batch of 4: decode {max(k['decode'] for k in bat):.1f} tokens/s "
              f"(runs: {runs(bat)})")
        print(f"  batch of 4 / sequential = {max(k['decode'] for k in bat) / max(k['decode'] for k in seq):.2f}x")
        print("  same greedy ids, batch vs sequential:", bat[0]["ids"] == seq[0]["ids"], "; batch row 0 vs batch 1:",
              bat[0]["ids"][0] == kl[0]["ids"][0])


if __name__ == "__main__":
    main()
