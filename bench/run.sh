#!/usr/bin/env bash
# Builds and runs the Cpu backend benchmarks with 2 threads (override with KILN_NUM_THREADS).
# Usage: bench/run.sh [extra google-benchmark flags, e.g. --benchmark_filter=matmul]
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
build="${KILN_BUILD_DIR:-$root/build}"
cmake -S "$root" -B "$build" -DKILN_BUILD_BENCH=ON >/dev/null
cmake --build "$build" -j2 --target bench_cpu
export KILN_NUM_THREADS="${KILN_NUM_THREADS:-2}"
export OMP_NUM_THREADS="$KILN_NUM_THREADS"
echo "# $(date -u +%Y-%m-%dT%H:%MZ) $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs), $(nproc) cores, KILN_NUM_THREADS=$KILN_NUM_THREADS"
"$build/bench/bench_cpu" --benchmark_counters_tabular=true "$@"
