#!/usr/bin/env python3
"""transformers' side of kiln's export (tests/hf/test_export.cpp): loads a directory written by
kiln::hf::save_pretrained with AutoModelForCausalLM.from_pretrained, in f32, and computes the logits
of a prompt.

    python tests/hf/check_export.py DIR --prompt 5,17,3 --compare kiln_logits.json [--rtol 1e-5]
        exit 0 when transformers' logits are within rtol (max |a - b| / max |b|) of kiln's (a JSON list,
        [len(prompt), vocab] row-major), 1 otherwise
    python tests/hf/check_export.py DIR --prompt 5,17,3 --write tests/hf/fixtures/export/expected.json
        writes the committed reference {prompt, logits, vocab, transformers, torch}

Loading must be exact: a weight transformers finds missing, unexpected or mis-shaped (which it would
otherwise initialise at random or drop with a warning) is a failure. The test runs this script when a
Python with transformers is found (KILN_HF_PYTHON, else .venv-hf/bin/python from scripts/hf_venv.sh);
regenerate the fixture with KILN_HF_REGENERATE=1 in the environment of that test case
(test_hf "export: a kiln-native*").
"""
import argparse
import json
import sys

import torch
import transformers
import transformers.generation.utils as gu
from transformers import AutoModelForCausalLM

gu.is_fsdp_managed_module = lambda m: False  # torch 1.13's FSDP module fails to import on Python 3.11


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("dir")
    ap.add_argument("--prompt", required=True, help="comma-separated token ids")
    ap.add_argument("--compare", help="kiln's logits, a JSON list [len(prompt) * vocab]")
    ap.add_argument("--rtol", type=float, default=1e-5)
    ap.add_argument("--write", help="write the reference fixture here")
    a = ap.parse_args()
    ids = [int(x) for x in a.prompt.split(",")]
    model, info = AutoModelForCausalLM.from_pretrained(a.dir, torch_dtype=torch.float32, output_loading_info=True)
    bad = {k: v for k, v in info.items() if v}
    if bad:
        print(f"check_export: transformers did not load {a.dir} exactly: {bad}")
        return 1
    model.eval()
    with torch.no_grad():
        logits = model(torch.tensor([ids])).logits[0].double().flatten()
    print(f"check_export: {a.dir}: {type(model).__name__}, {len(ids)} positions x {model.config.vocab_size} logits")
    status = 0
    if a.compare:
        with open(a.compare) as f:
            kiln = torch.tensor(json.load(f), dtype=torch.float64)
        if kiln.shape != logits.shape:
            print(f"check_export: kiln gave {kiln.numel()} logits, transformers {logits.numel()}")
            return 1
        rel = float((kiln - logits).abs().max() / logits.abs().max())
        print(f"check_export: max |kiln - transformers| / max |transformers| = {rel:.3g} (rtol {a.rtol})")
        status = 0 if rel <= a.rtol else 1
    if a.write:
        with open(a.write, "w") as f:
            json.dump({"prompt": ids, "logits": [float(x) for x in logits], "vocab": model.config.vocab_size,
                       "transformers": transformers.__version__, "torch": torch.__version__}, f)
        print(f"check_export: wrote {a.write}")
    return status


if __name__ == "__main__":
    sys.exit(main())
