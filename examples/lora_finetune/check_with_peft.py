#!/usr/bin/env python3
"""The example's directories in the Python libraries: the held-out loss on the new corpus of
base_hf + adapter/ in PEFT (PeftModel.from_pretrained) and of merged_hf/ in transformers, with the
batches example_lora_finetune uses, against its results.json. Needs transformers and peft
(scripts/hf_venv.sh makes .venv-hf/ with the pinned versions):
    .venv-hf/bin/python examples/lora_finetune/check_with_peft.py out/lora_finetune
Exits 1 when a loss differs from kiln's by more than 1e-5 relative."""
import json
import sys

import torch
from peft import PeftModel
from transformers import AutoModelForCausalLM, AutoTokenizer

out = sys.argv[1] if len(sys.argv) > 1 else "out/lora_finetune"
results = {r["name"]: r for r in json.load(open(f"{out}/results.json"))["rows"]}
ids = AutoTokenizer.from_pretrained(f"{out}/base_hf")(open(f"{out}/new_eval.txt").read())["input_ids"]
N, T, B, batches = len(ids), 128, 16, 8  # run.sh's defaults (EVAL_BATCHES=8)


def held_out(model):
    total = 0.0
    with torch.no_grad():
        for i in range(batches):  # kiln's TokenData::batch(i): row r starts at ((i*B + r)*T) mod (N - T)
            starts = [((i * B + r) * T) % (N - T) for r in range(B)]
            x = torch.tensor([ids[s:s + T] for s in starts])
            y = torch.tensor([ids[s + 1:s + T + 1] for s in starts])
            total += torch.nn.functional.cross_entropy(model(x).logits.reshape(-1, model.config.vocab_size), y.reshape(-1)).item()
    return total / batches


def load(d):
    return AutoModelForCausalLM.from_pretrained(d, torch_dtype=torch.float32)


ok = True
for name, model, kiln_row in [("PEFT: base_hf + adapter", PeftModel.from_pretrained(load(f"{out}/base_hf"), f"{out}/adapter"), "base + LoRA adapter"),
                              ("transformers: merged_hf", load(f"{out}/merged_hf"), "merged, exported, reloaded")]:
    got, want = held_out(model.eval()), results[kiln_row]["new"]
    ok &= abs(got - want) <= 1e-5 * abs(want)
    print(f"{name}: {got:.8f}   kiln ({kiln_row}): {want:.8f}")
sys.exit(0 if ok else 1)
