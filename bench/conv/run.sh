#!/usr/bin/env bash
# Convolution benchmarks on this machine (figures: bench/RESULTS.md, "Convolution"):
#  1. Conv2d forward + backward through kiln's autograd against raw oneDNN calls on the same shapes
#     (bench_conv: plain nchw layouts, and oneDNN's blocked layouts with their reorders);
#  2. one training epoch of examples/fashion_mnist_cnn against the same network in PyTorch
#     (bench/conv/cnn_epoch_torch.py: same layers, optimiser, schedule, batch size, data and threads).
#   bench/conv/run.sh [build-dir] [steps]   (default build-bench-conv; steps > 0 times that many batches
#                                            instead of the whole epoch of 469)
set -euo pipefail
cd "$(dirname "$0")/../.."
dir=${1:-build-bench-conv}
steps=${2:-0}
bash scripts/setup.sh --python --data
cmake -S . -B "$dir" -DCMAKE_BUILD_TYPE=Release -DKILN_BUILD_BENCH=ON -DKILN_BUILD_TESTS=OFF -DKILN_BUILD_EXAMPLES=ON >/dev/null
cmake --build "$dir" -j"$(nproc)" --target bench_conv example_fashion_mnist_cnn
export KILN_NUM_THREADS=${KILN_NUM_THREADS:-2} OMP_WAIT_POLICY=passive
echo "## machine: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs), $(nproc) cores, CPU flags:" \
     "$(grep -o -w -E 'avx2|avx512f|avx512_bf16|amx_tile' /proc/cpuinfo | sort -u | xargs); threads $KILN_NUM_THREADS"
echo "## load average at start: $(cut -d' ' -f1-3 /proc/loadavg)"
"$dir/bench/bench_conv" --benchmark_counters_tabular=true
data=/usr/share/datasets/fashion-mnist
echo
echo "One epoch of the Fashion-MNIST CNN (batch 128), training time without evaluation:"
k=$("$dir/examples/example_fashion_mnist_cnn" "$data" 1 0 "$steps" | grep '"peer": "kiln"')
t=$(/usr/bin/python3 bench/conv/cnn_epoch_torch.py "$data" 1 "$steps" | grep '"peer"')
echo "$k"
echo "$t"
/usr/bin/python3 -c 'import json,sys; k=json.loads(sys.argv[1]); t=json.loads(sys.argv[2])
print("kiln %.1f s, PyTorch %.1f s: PyTorch time / kiln time = %.2f" % (k["seconds"], t["seconds"], t["seconds"]/k["seconds"]))' "$k" "$t"
