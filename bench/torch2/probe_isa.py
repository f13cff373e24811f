"""Prints which kernels a PyTorch interpreter runs: ATen's CPU capability, its BLAS, and (PyTorch 2)
Inductor's vector ISA; then one f32 GEMM, so MKL_VERBOSE / OPENBLAS_VERBOSE name theirs.
bench/train_vs_torch2.py --isa avx2 runs it under its pins and checks what it prints."""
import os
import re

import torch

cfg = torch.__config__.show()
cap = re.search(r"CPU capability usage: (\w+)", cfg)
blas = re.search(r"BLAS_INFO=([^,\n]*)", cfg)
print("torch", torch.__version__, "cpu capability:", cap.group(1) if cap else "?", "blas:", blas.group(1) if blas else "?")
if int(torch.__version__.split(".")[0]) >= 2:
    from torch._inductor import config, cpu_vec_isa

    if os.environ.get("KILN_BENCH_SIMDLEN"):
        config.cpp.simdlen = int(os.environ["KILN_BENCH_SIMDLEN"])
    print("inductor vec isa:", type(cpu_vec_isa.pick_vec_isa()).__name__)
a = torch.randn(512, 512)
print("gemm checksum:", float((a @ a).sum()))
