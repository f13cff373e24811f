#!/usr/bin/env python3
"""The logits PEFT computes for a base model directory and an adapter directory (kiln's save_lora
output), for one row of token ids: what tests/lora checks kiln's own logits against.

    peft_logits.py BASE_DIR ADAPTER_DIR OUT.json 3,14,15,9
"""
import json
import sys

import torch
import transformers.generation.utils as gu
from peft import PeftModel
from transformers import AutoModelForCausalLM

gu.is_fsdp_managed_module = lambda m: False  # torch 1.13's FSDP module fails to import on Python 3.11

base, adapter, out, ids = sys.argv[1:5]
model = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(base), adapter).eval()
with torch.no_grad():
    logits = model(torch.tensor([[int(i) for i in ids.split(",")]])).logits[0]
with open(out, "w") as f:
    json.dump(logits.flatten().tolist(), f)
