#!/usr/bin/env python3
"""Prefill and decode tokens/s of `kiln generate` against transformers (eager PyTorch) on the same
random Llama, same machine, same run; and kiln's peak RSS while loading.

    scripts/hf_venv.sh && .venv-hf/bin/python bench/hf/bench_generate.py [--kiln build/kiln] [--threads 2]

The model (random weights, nothing downloaded) is written to a temporary directory, stored in bf16;
both sides compute in f32, greedy, one sequence, batch 1, and must produce the same ids.
"""
import argparse
import os
import re
import subprocess
import tempfile
import time

import torch
import transformers.generation.utils as gu
from transformers import LlamaConfig, LlamaForCausalLM

gu.is_fsdp_managed_module = lambda m: False  # torch 1.13's FSDP module fails to import on Python 3.11


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
    prompt = torch.randint(0, cfg.vocab_size, (1, a.prompt), generator=torch.Generator().manual_seed(1))
    with tempfile.TemporaryDirectory() as d:
        model.to(torch.bfloat16).save_pretrained(d)
        model.float()
        with torch.no_grad():
            model(prompt[:, :8])  # warm-up
            t0 = time.perf_counter()
            out = model(prompt, use_cache=True)
            t_prefill = time.perf_counter() - t0
            past, ids = out.past_key_values, [int(out.logits[0, -1].argmax())]
            t0 = time.perf_counter()
            for _ in range(a.new - 1):
                out = model(torch.tensor([[ids[-1]]]), past_key_values=past, use_cache=True)
                past = out.past_key_values
                ids.append(int(out.logits[0, -1].argmax()))
            t_decode = time.perf_counter() - t0
        params = sum(p.numel() for p in model.parameters())
        print(f"model: Llama {params / 1e6:.1f}M parameters (bf16 on disk, f32 compute), prompt {a.prompt}, {a.new} new tokens, "
              f"{a.threads} threads")
        print(f"transformers {__import__('transformers').__version__} (torch {torch.__version__}, eager): "
              f"prefill {a.prompt / t_prefill:.0f} tokens/s, decode {(a.new - 1) / t_decode:.1f} tokens/s")
        env = dict(os.environ, KILN_NUM_THREADS=str(a.threads), OMP_NUM_THREADS=str(a.threads))
        r = subprocess.run(["/usr/bin/time", "-v", a.kiln, "generate", d, "--prompt-ids", ",".join(map(str, prompt[0].tolist())),
                            "--max-new-tokens", str(a.new), "--temperature", "0", "--print-ids"], capture_output=True, text=True, env=env)
        if r.returncode != 0:
            raise SystemExit(r.stderr)
        kiln_ids = [int(x) for x in r.stdout.strip().splitlines()[-1].split(",")]
        speed = re.search(r"prefill: .*", r.stderr).group(0)
        rss = int(re.search(r"Maximum resident set size \(kbytes\): (\d+)", r.stderr).group(1)) * 1024
        print(f"kiln: {speed}")
        base = subprocess.run(["/usr/bin/time", "-v", a.kiln, "--version"], capture_output=True, text=True, env=env).stderr
        base = int(re.search(r"Maximum resident set size \(kbytes\): (\d+)", base).group(1)) * 1024
        print(f"kiln peak RSS {rss / 2**20:.0f} MiB; `kiln --version` alone {base / 2**20:.0f} MiB; the difference "
              f"{(rss - base) / 2**20:.0f} MiB for {params * 4 / 2**20:.0f} MiB of f32 weights ({(rss - base) / (params * 4):.2f}x)")
        print("same greedy ids:", kiln_ids == ids, f"({sum(x == y for x, y in zip(kiln_ids, ids))}/{len(ids)})")


if __name__ == "__main__":
    main()
