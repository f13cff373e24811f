#!/usr/bin/env python3
"""Writes tests/train/fixtures/eval_hf.json: what `kiln eval` must print for a Hugging Face model
directory, alone and with a PEFT LoRA adapter (--adapter), computed by transformers and peft.

    scripts/hf_venv.sh && .venv-hf/bin/python tests/train/make_eval_fixture.py

The models and adapters are tests/lora/fixtures' (tiny random ones made there, nothing downloaded):
llama with llama_qv/adapter_init, gpt2 with gpt2_c_attn/adapter_init (lora_B != 0, so the adapter
changes the loss). The tokens are random ids below the vocabulary (64), fixed seed. The batches are
kiln eval's (train/data.hpp, docs/specs.md §4): batch i, row r starts at ((i·B + r)·T) mod (N − T);
the loss is the mean over the batches of each batch's mean cross-entropy.
"""
import json
import os

import torch
import transformers.generation.utils as gu
from peft import PeftModel
from transformers import AutoModelForCausalLM

gu.is_fsdp_managed_module = lambda m: False  # torch 1.13's FSDP module fails to import on Python 3.11

HERE = os.path.dirname(os.path.abspath(__file__))
LORA = os.path.join(HERE, "..", "lora", "fixtures")
N, BATCHES, B, T = 300, 3, 2, 10
CASES = {"llama": "llama_qv", "gpt2": "gpt2_c_attn"}


def mean_loss(model, tokens):
    total = 0.0
    for i in range(BATCHES):
        starts = [((i * B + r) * T) % (N - T) for r in range(B)]
        x = torch.stack([tokens[s:s + T] for s in starts])
        y = torch.stack([tokens[s + 1:s + T + 1] for s in starts])
        with torch.no_grad():
            logits = model(input_ids=x).logits.float()
        total += torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), y.reshape(-1)).item()
    return total / BATCHES


def main():
    g = torch.Generator().manual_seed(7)
    tokens = torch.randint(0, 64, (N,), generator=g)
    out = {"batches": BATCHES, "batch_size": B, "seq_len": T, "tokens": tokens.tolist(), "cases": {}}
    for base, case in CASES.items():
        model = AutoModelForCausalLM.from_pretrained(os.path.join(LORA, base), torch_dtype=torch.float32).eval()
        plain = mean_loss(model, tokens)
        peft = PeftModel.from_pretrained(model, os.path.join(LORA, case, "adapter_init")).eval()
        adapted = mean_loss(peft, tokens)
        out["cases"][base] = {"adapter": f"{case}/adapter_init", "loss": plain, "loss_adapter": adapted}
    with open(os.path.join(HERE, "fixtures", "eval_hf.json"), "w") as f:
        json.dump(out, f)
        f.write("\n")


if __name__ == "__main__":
    main()
