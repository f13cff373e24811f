#!/usr/bin/env bash
# Trains the Fashion-MNIST MLP example (examples/fashion_mnist_mlp): installs the dataset package
# (dataset-fashion-mnist, ~30 MB) and the build dependencies if missing, builds, runs 5 epochs.
#   scripts/fashion_mnist.sh              5 epochs on /usr/share/datasets/fashion-mnist
#   scripts/fashion_mnist.sh DIR EPOCHS   another copy of the IDX files, another epoch count
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh --data
cmake -S . -B build -DCMAKE_BUILD_TYPE=Release -DKILN_BUILD_BENCH=OFF >/dev/null
cmake --build build -j"$(nproc)" --target example_fashion_mnist_mlp
export KILN_NUM_THREADS="${KILN_NUM_THREADS:-$(nproc)}"
build/examples/example_fashion_mnist_mlp "${1:-/usr/share/datasets/fashion-mnist}" "${2:-5}"
