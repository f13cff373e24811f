#!/bin/bash
# The GPU benchmarks (needs a CUDA device; on the lent machine: bash bench/cuda/run.sh > bench/cuda/run.jsonl).
set -euo pipefail
cd "$(dirname "$0")/../.."
cmake -S . -B build -DKILN_WITH_CUDA=ON -DKILN_BUILD_TESTS=OFF -DKILN_BUILD_EXAMPLES=OFF > /dev/null
cmake --build build -j"$(nproc)" --target bench_cuda kiln_cli
build/bench/bench_cuda
"${KILN_PYTHON:-python3}" bench/cuda/gpu_vs_torch.py --kiln build/kiln
