#!/usr/bin/env python3
"""Peak RSS of fine-tuning one random Llama-shaped model (made here, ~125M parameters, f32) with LoRA
(q_proj, v_proj, r 8, alpha 16) and with every parameter, AdamW, in kiln and in PEFT/PyTorch, each run
in a fresh process, one after the other.

    scripts/hf_venv.sh && .venv-hf/bin/python bench/lora/memory.py build/bench/bench_lora_memory [--steps 3 --batch 4 --seq 128]

Prints one JSON line per run and a markdown table (bench/RESULTS.md, docs/lora.md).
"""
import argparse
import json
import os
import resource
import shutil
import subprocess
import sys
import tempfile

CHILD = r"""
import json, resource, sys, torch
import transformers.generation.utils as gu
gu.is_fsdp_managed_module = lambda m: False
from transformers import LlamaForCausalLM
from peft import LoraConfig, get_peft_model
d, mode, steps, B, T = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5])
torch.set_num_threads(int(sys.argv[6]))
model = LlamaForCausalLM.from_pretrained(d, torch_dtype=torch.float32)
loaded = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
if mode == "lora":
    model = get_peft_model(model, LoraConfig(r=8, lora_alpha=16, lora_dropout=0.0, target_modules=["q_proj", "v_proj"],
                                             task_type="CAUSAL_LM"))
model.train()
params = [p for p in model.parameters() if p.requires_grad]
opt = torch.optim.AdamW(params, lr=1e-4, weight_decay=0.01)
g = torch.Generator().manual_seed(0)
ids = torch.randint(0, model.config.vocab_size, (B, T), generator=g)
for _ in range(steps):
    opt.zero_grad()
    loss = model(ids, labels=ids).loss
    loss.backward()
    opt.step()
print(json.dumps({"framework": "peft" if mode == "lora" else "torch", "mode": mode,
                  "params": sum(p.numel() for p in model.parameters()), "trainable": sum(p.numel() for p in params),
                  "rss_loaded_mb": round(loaded), "rss_peak_mb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024),
                  "loss": round(loss.item(), 4)}))
"""


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("kiln_bench")
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--seq", type=int, default=128)
    ap.add_argument("--threads", type=int, default=int(os.environ.get("KILN_NUM_THREADS", "2")))
    a = ap.parse_args()
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM
    d = tempfile.mkdtemp(prefix="kiln-lora-mem-")
    try:
        torch.manual_seed(0)
        config = LlamaConfig(vocab_size=32000, hidden_size=768, intermediate_size=2048, num_hidden_layers=12, num_attention_heads=12,
                             num_key_value_heads=4, max_position_embeddings=512, tie_word_embeddings=False)
        LlamaForCausalLM(config).save_pretrained(d, safe_serialization=True)
        os.remove(os.path.join(d, "generation_config.json"))
        env = dict(os.environ, KILN_NUM_THREADS=str(a.threads), OMP_NUM_THREADS=str(a.threads))
        rows = []
        for mode in ("lora", "full"):
            for cmd in ([a.kiln_bench, d, mode], [sys.executable, "-c", CHILD, d, mode]):
                args = cmd + [str(a.steps), str(a.batch), str(a.seq)] + ([str(a.threads)] if cmd[0] == sys.executable else [])
                out = subprocess.run(args, check=True, capture_output=True, text=True, env=env).stdout.strip().splitlines()[-1]
                print(out, flush=True)
                rows.append(json.loads(out))
        print(f"\n{rows[0]['params'] / 1e6:.0f}M parameters (f32), {a.steps} AdamW steps, batch {a.batch} x {a.seq} tokens\n")
        print("| run | trainable | peak RSS after load (MB) | peak RSS (MB) |")
        print("|---|---|---|---|")
        for r in rows:
            print(f"| {r['framework']} {r['mode']} | {r['trainable'] / 1e6:.2f}M | {r['rss_loaded_mb']} | {r['rss_peak_mb']} |")
    finally:
        shutil.rmtree(d, ignore_errors=True)


if __name__ == "__main__":
    main()
