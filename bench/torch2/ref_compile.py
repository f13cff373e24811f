#!/usr/bin/python3
"""tests/reference/kiln_ref.py with the model's forward under torch.compile (PyTorch 2).

Same arguments as kiln_ref.py (bench/train_vs_torch2.py runs `... ref_compile.py train ...` with the
interpreter of bench/.venv-torch2). Only the forward is compiled (the backward follows through
AOTAutograd); the loss, gradient norm, clipping and AdamW step stay eager, as in kiln_ref.py. The
first steps include the compilation: the benchmark reads the fastest step of steps 3.. only.
KILN_BENCH_SIMDLEN=256 makes Inductor generate AVX2-width code (train_vs_torch2.py --isa avx2).
"""
import os
import sys

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "tests", "reference"))
import kiln_ref  # noqa: E402

if os.environ.get("KILN_BENCH_SIMDLEN"):
    import torch._inductor.config

    torch._inductor.config.cpp.simdlen = int(os.environ["KILN_BENCH_SIMDLEN"])

_build = kiln_ref.build


def build(args, dtype):
    c, model = _build(args, dtype)
    model.forward = torch.compile(model.forward)  # the module keeps its parameters and their names
    return c, model


kiln_ref.build = build

if __name__ == "__main__":
    kiln_ref.main()
